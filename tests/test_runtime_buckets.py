# Tests of --overlap-grad-reduce (runtime/execution/buckets.py): where in a rank's step program each
# stage's buckets are issued (after the last instruction changing its gradients, before STEP), the
# order of the calls a step makes (recorded on CPU with a stand-in reduction), and, across two
# data-parallel ranks, gradients and losses bit for bit those of the step-end all-reduce.
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from schedc.plan import Instr, Opcode, load_plan
from schedc.runtime.execution.buckets import GradBuckets, issue_points
from schedc.runtime.execution.executor import attach_flat_grads
from schedc.runtime.model.gpt import Stage
from schedc.runtime.process.options import OptionError, parse_options
from test_runtime import _dump, launch_plans, plans  # noqa: F401 (fixtures)

FOUR = ["--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]


def _last(program, stage: int, ops) -> int:
    """The index of the program's last instruction running one of `ops` on `stage` (by a plain scan)."""
    return max(i for i, instr in enumerate(program) for u in instr.units() if u.stage == stage and u.op in ops)


def test_interleaved_stages_are_issued_as_their_last_backward_ends(plans):  # noqa: F811
    """Interleaved 1F1B, rank 0 holds stages 0 and 2: stage 2's last backward comes first, so its
    buckets go out while stage 0 still has backwards to run; both before STEP."""
    (program,) = load_plan(plans("interleaved_1f1b", p=2, v=2, m=4)).ranks[0]
    points = issue_points(program, [0, 2])
    step = [i.op for i in program].index(Opcode.STEP)
    assert points == {_last(program, 2, (Opcode.B,)): [2], _last(program, 0, (Opcode.B,)): [0]}
    assert max(points) < step and min(points) < _last(program, 0, (Opcode.B,))


def test_split_backwards_are_issued_after_their_last_w(plans):  # noqa: F811
    for rank, program in enumerate(load_plan(plans("zb_h1", p=2, m=4)).ranks):
        (program,) = program
        assert issue_points(program, [rank]) == {_last(program, rank, (Opcode.W,)): [rank]}


def test_a_shared_stage_waits_for_its_sync_grad_and_every_stage_for_tasks(plans):  # noqa: F811
    """Chimera's replicated stages are summed by SYNC_GRAD first; a user task may rewrite any
    gradient, so nothing is issued before the last one; a program without STEP issues nothing."""
    (program,) = load_plan(plans("chimera", p=2, m=4)).ranks[0]
    syncs = {i.stage: k for k, i in enumerate(program) if i.op == Opcode.SYNC_GRAD}
    assert syncs and all(s in issue_points(program, [s])[k] for s, k in syncs.items())
    program = [Instr(Opcode.B, 0, 0), Instr("curvature", 0, 0), Instr(Opcode.B, 1, 0), Instr(Opcode.STEP)]
    assert issue_points(program, [0, 1]) == {1: [0], 2: [1]}  # stage 0 final at B0.0, issued after the task
    program = [Instr(Opcode.B, 1, 0), Instr("curvature", 0, 0), Instr(Opcode.B, 0, 0), Instr(Opcode.STEP)]
    assert issue_points(program, [0, 1]) == {1: [1], 2: [0]}
    assert issue_points(program[:-1], [0, 1]) == {}


class Work:
    def __init__(self, calls: list, name: str):
        self.calls, self.name = calls, name

    def wait(self):
        self.calls.append(("wait", self.name))


def test_a_step_issues_its_buckets_before_step_and_waits_for_them_there(plans):  # noqa: F811
    """The calls of one step, in order: stage 2's buckets (last layers first) right after its last B,
    stage 0's after its own, a stage no backward touched at STEP; every wait after the last issue."""
    (program,) = load_plan(plans("interleaved_1f1b", p=2, v=2, m=4)).ranks[0]
    stages = {}
    for s, width in ((0, 5), (2, 3), (4, 2)):
        stages[s] = Stage([("lin", nn.Linear(width, 1, bias=False))])
        attach_flat_grads(stages[s])
    calls = []

    def reduce(tensor):
        name = next(f"{s}:{b}" for s, stage in stages.items() for b, t in enumerate(stage.flat_grad.split(2))
                    if t.data_ptr() == tensor.data_ptr() and t.numel() == tensor.numel())
        calls.append(("reduce", name))
        return Work(calls, name)

    buckets = GradBuckets(stages, [program], 2, reduce)
    step = [i.op for i in program].index(Opcode.STEP)
    for index in range(len(program)):
        if index == step:
            calls.append(("STEP", None))
            buckets.wait()
        buckets.after(0, index)
        if index == _last(program, 2, (Opcode.B,)):
            calls.append(("last B of 2", None))
    assert buckets.issued == [(_last(program, 2, (Opcode.B,)), 2), (_last(program, 0, (Opcode.B,)), 0), (None, 4)]
    first = calls.index(("last B of 2", None))
    assert calls[first - 2:first] == [("reduce", "2:1"), ("reduce", "2:0")]
    issued = [name for kind, name in calls if kind == "reduce"]
    assert issued == ["2:1", "2:0", "0:2", "0:1", "0:0", "4:0"]
    assert calls.index(("reduce", "0:0")) < calls.index(("STEP", None)) < calls.index(("reduce", "4:0"))
    assert [name for kind, name in calls if kind == "wait"] == issued and calls[-1][0] == "wait"


@pytest.mark.parametrize("options,message", [
    (["--bucket-size", "10"], "--bucket-size sizes --overlap-grad-reduce's buckets"),
    (["--overlap-grad-reduce", "--bucket-size", "0"], "1 or more"),
    (["--overlap-grad-reduce", "--zero", "2", "--dp", "2"], "--zero 2 reduce-scatters them"),
])
def test_bucket_options_that_cannot_work_are_refused(options, message):
    with pytest.raises(OptionError, match=message):
        parse_options(["plan.json", *options])


@pytest.mark.slow
def test_overlapped_buckets_give_the_step_end_reduction_bit_for_bit(plans, tmp_path):  # noqa: F811
    """One 4-rank launch: interleaved 1F1B (two stages per rank) and ZB-H1 over two data-parallel
    replicas, fp32 and bf16-main, buckets of 1000 elements (several per stage) against the one
    all-reduce per stage at the end: first-step gradients and every step's loss equal."""
    cases = {"interleaved": plans("interleaved_1f1b", p=2, v=2, m=4), "zb_h1": plans("zb_h1", p=2, m=4)}
    jobs = []
    for name, plan in cases.items():
        for dtype in ("fp32", "bf16-main"):
            for mode, extra in (("end", []), ("buckets", ["--overlap-grad-reduce", "--bucket-size", "1000"])):
                out = tmp_path / f"{name}_{dtype}_{mode}"
                jobs.append((plan, [*FOUR, "--dp", "2", "--dtype", dtype, "--steps", "2", "--quiet", *extra,
                                    "--save-grads", str(out), "--metrics-out", str(out / "metrics.jsonl")]))
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr
    for name in cases:
        for dtype in ("fp32", "bf16-main"):
            (loss, grads), (want_loss, want) = (_dump(tmp_path / f"{name}_{dtype}_{m}") for m in ("buckets", "end"))
            assert loss == want_loss and sorted(grads) == sorted(want), (name, dtype)
            assert all(torch.equal(grads[n], want[n]) for n in want), (name, dtype)
            losses = [(tmp_path / f"{name}_{dtype}_{m}" / "metrics.jsonl").read_text().splitlines() for m in ("buckets", "end")]
            assert [json.loads(line)["loss"] for line in losses[0]] == [json.loads(line)["loss"] for line in losses[1]]
