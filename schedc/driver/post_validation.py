"""Steps that overlap: the optimizer's post-validation (--post-validation; Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", section 4). Without the all-reduce before the optimizer step, a device starts its next
step as soon as its own ops of this one are done, so the warm-up of step k + 1 fills the drain of step
k. The steady step is what a second step adds to the first's makespan.

    repeat_steps(1f1b (p=2 m=2), 2)
    -> device 0: F0 F1 B0 B1 | F2 F3 B2 B3 (step 1's microbatches offset by m), no synchronization between
"""
from __future__ import annotations

from dataclasses import replace

from ..diagnostics import usage
from ..ir import Dependencies, Op, Schedule


def overlap_problem(schedule: Schedule) -> str | None:
    """Why a schedule's steps cannot be repeated back to back here, or None: repeat_steps takes the
    built-in ops of plain orders (no tasks, no filled cycle, no sequence chunks, no mixed backward, no
    placed recomputation or offload)."""
    reasons = [(schedule.tasks or schedule.unplaced, "tasks"), (schedule.cycle, "a filled cycle"),
               (schedule.chunks > 1, "sequence chunks"), (schedule.split_of is not None, "a mixed backward"),
               (schedule.recompute or schedule.offload, "placed recomputation or offload")]
    found = [words for present, words in reasons if present]
    return f"its schedule has {found[0]}" if found else None


def repeat_steps(schedule: Schedule, steps: int = 2) -> Schedule:
    """The schedule run `steps` times back to back on each device, in each device's own program order
    and with no synchronization between steps: step k's microbatch i is microbatch i + k·M (M the
    schedule's microbatches over all its pipelines), its dependencies those of any op."""
    problem = overlap_problem(schedule)
    if problem:
        raise usage(f"--post-validation repeats a step's orders: {problem}")
    count = max((op.mb for op in schedule.ops() if op.mb is not None), default=-1) + 1

    made: dict[tuple[int, int], Op] = {}  # one op per (op, step): the fused pairs name the orders' own ops

    def shifted(op: Op, k: int) -> Op:
        if op.mb is None or k == 0:
            return op
        return made.setdefault((id(op), k), replace(op, mb=op.mb + k * count))

    orders = tuple(tuple(shifted(op, k) for k in range(steps) for op in order) for order in schedule.orders)
    pipelines = tuple(replace(p, microbatches=tuple(mb + k * count for k in range(steps) for mb in p.microbatches))
                      for p in schedule.pipelines)
    fused = tuple((shifted(f, k), shifted(b, k)) for k in range(steps) for f, b in schedule.fused)
    deps = schedule.deps
    deps = Dependencies(pipelines, deps.costs, deps.split, {}, tuple(op for order in orders for op in order))
    return replace(schedule, orders=orders, pipelines=pipelines, fused=fused, deps=deps)


def steady(one: float, two: float) -> float:
    """What a second step adds to the makespan of one: the steady step's makespan.

    >>> steady(10.0, 16.5)
    6.5
    """
    return two - one


__all__ = ["overlap_problem", "repeat_steps", "steady"]
