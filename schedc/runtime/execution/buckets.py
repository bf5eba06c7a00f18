# --overlap-grad-reduce: the data-parallel gradient reduction in buckets, each issued asynchronously as
# soon as its stage's gradients are final in the step, and waited for at the step's end (Megatron-LM's
# --overlap-grad-reduce with its --ddp-bucket-size). A stage's gradients are final after the last
# instruction of the step program that changes them: its last B or W (an OVERLAP_F_B's backward half
# too), its SYNC_GRAD where pipelines share the stage, and any user task (a task may rewrite any
# gradient: K-FAC preconditions them). The sums are the step-end all-reduce's, element by element:
# a bucket is a slice of the stage's flat gradient, reduced over the same ranks.
#
#     rank program:  F0.0 F0.1 B0.0 F2.0 B2.0 B2.1 | B0.1 | STEP
#                                          ^ stage 2's buckets issued   ^ stage 0's    ^ both waited
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from schedc.plan import Instr, Opcode

from .lifetimes import BUILTIN

GRADIENTS = (Opcode.B, Opcode.W)


def default_bucket_size(dp: int) -> int:
    """Megatron-LM's bucket size in elements: max(40,000,000, 1,000,000 x data-parallel size).

    >>> default_bucket_size(8), default_bucket_size(64)
    (40000000, 64000000)
    """
    return max(40_000_000, 1_000_000 * dp)


def issue_points(program: list[Instr] | tuple[Instr, ...], held: list[int]) -> dict[int, list[int]]:
    """Instruction index -> the held stages whose gradients are final after it (in stage order). A
    stage no instruction before STEP touches is left out (GradBuckets.wait issues it at STEP), and a
    program without STEP issues nothing early (its gradients may grow in the next program).

    >>> p = [Instr(Opcode.B, 0, 0), Instr(Opcode.B, 1, 0), Instr(Opcode.B, 0, 1), Instr(Opcode.STEP)]
    >>> issue_points(p, [0, 1, 2])
    {1: [1], 2: [0]}
    """
    ops = [instr.op for instr in program]
    if Opcode.STEP not in ops:
        return {}
    end = ops.index(Opcode.STEP)
    last: dict[int, int] = {}
    tasks = -1
    for index, instr in enumerate(program[:end]):
        if instr.op not in BUILTIN:
            tasks = index
        if instr.op == Opcode.SYNC_GRAD:
            last[instr.stage] = index
        for unit in instr.units():
            if unit.op in GRADIENTS:
                last[unit.stage] = index
    points: dict[int, list[int]] = {}
    for stage in held:
        if stage in last:
            points.setdefault(max(last[stage], tasks), []).append(stage)
    return dict(sorted(points.items()))


class GradBuckets:
    """One rank's buckets: each held stage's flat gradient cut into slices of `size` elements, all-reduced
    over the data-parallel group (`reduce(tensor) -> work`, dist.all_reduce's async form) after the
    instruction issue_points names; `wait` at the step's end."""

    def __init__(self, stages: dict, programs: list, size: int, reduce: Callable[[torch.Tensor], Any]):
        self.stages, self.reduce = stages, reduce
        self.points = [issue_points(program, sorted(stages)) for program in programs]
        self.buckets = {s: list(stage.flat_grad.split(size)) for s, stage in stages.items()}
        self.works: list[Any] = []
        self.done: set[int] = set()  # the stages issued this step
        self.issued: list[tuple[int, int]] = []  # the last step's (instruction index, stage), in issue order

    def after(self, program: int, index: int) -> None:
        """After instruction `index` of step program `program`: issue the buckets it completes."""
        for s in self.points[program].get(index, ()):
            self._issue(index, s)

    def _issue(self, index: int | None, stage: int) -> None:
        if stage not in self.done:
            if not self.done:  # the step's first
                self.issued = []
            self.done.add(stage)
            self.issued.append((index, stage))
            self.works += [self.reduce(bucket) for bucket in reversed(self.buckets[stage])]  # last layers first

    def wait(self) -> None:
        """At the step's end (STEP, recorded as index None): the stages not yet issued, then every
        reduction through."""
        for s in sorted(self.stages):
            self._issue(None, s)
        works, self.works, self.done = self.works, [], set()
        for work in works:
            work.wait()


def of_run(plan, opts, world, stages: dict) -> GradBuckets | None:
    """--overlap-grad-reduce with --dp: this rank's buckets over its data-parallel group, else None."""
    if not opts.overlap_grad_reduce or world.dp_group is None:
        return None
    size = opts.bucket_size or default_bucket_size(world.dp)
    reduce = lambda tensor: dist.all_reduce(tensor, group=world.dp_group, async_op=True)  # noqa: E731
    return GradBuckets(stages, list(plan.ranks[world.plan_rank]), size, reduce)
