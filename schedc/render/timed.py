"""The simulated ops laid end to end in time: a schedule's one step, or a filled plan's K-step cycle
(each step after the previous one, its ops from `schedule.cycle[k]` timed by `timing.steps[k]`).

    1F1B:       device 0: F(0,0)@0 F(0,1)@1 B(0,0)@4 ...                        (step 0 only)
    PipeFisher: device 0: F(0,0)@0 ... curvature_A(0,0)@7 ... | step 1: F(0,0)@33 ...
"""
from __future__ import annotations

from dataclasses import dataclass

from ..compiled import Compiled
from ..ir import Op


@dataclass(frozen=True, slots=True)
class TimedOp:
    op: Op
    start: float
    end: float
    step: int


def in_seconds(compiled: Compiled) -> bool:
    """Whether the costs are seconds (--cluster: a model on a cluster, whose prediction the stats
    carry, or a plan compiled so, which says so) rather than cost units (forwards, or the milliseconds
    of a measured profile)."""
    cluster = compiled.plan.meta.get("cluster") if compiled.plan is not None else None
    return "iteration_s" in compiled.stats or (isinstance(cluster, dict) and cluster.get("unit") == "s")


def timed_ops(compiled: Compiled) -> list[list[TimedOp]]:
    """Per device, its ops in program order (step by step) with absolute start and end; ops that were
    never timed (a deadlocked schedule) are left out."""
    schedule, timing = compiled.schedule, compiled.timing
    steps = tuple(zip(schedule.cycle, timing.steps)) if schedule.cycle and timing.steps else (
        (schedule.orders, timing),)
    rows: list[list[TimedOp]] = [[] for _ in range(schedule.devices)]
    offset = 0.0
    for k, (program, step_timing) in enumerate(steps):
        start, end = step_timing.start, step_timing.end
        for d, order in enumerate(program):
            rows[d].extend(TimedOp(op, offset + start[op], offset + end[op], k) for op in order if op in start)
        offset += step_timing.makespan
    return rows


def step_starts(compiled: Compiled) -> list[float]:
    """Where each step of the cycle begins (after the first): [] for an unfilled schedule."""
    starts, offset = [], 0.0
    for step_timing in compiled.timing.steps[:-1] if compiled.schedule.cycle else ():
        offset += step_timing.makespan
        starts.append(offset)
    return starts
