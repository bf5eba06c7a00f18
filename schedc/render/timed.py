"""The simulated ops laid end to end in time: a schedule's one step, or a filled plan's K-step cycle
(each step after the previous one, its ops from `schedule.cycle[k]` timed by `timing.steps[k]`).

    1F1B:       device 0: F(0,0)@0 F(0,1)@1 B(0,0)@4 ...                        (step 0 only)
    PipeFisher: device 0: F(0,0)@0 ... curvature_A(0,0)@7 ... | step 1: F(0,0)@33 ...

Memory over time (the timeline's strips and the HTML report's chart both draw memory_over_time) counts
activation units alive on a device, from the simulated times: F allocates its stage's units at its
start, B (W when backward is split) frees them at its end; frees at an instant come before
allocations, as on a device that runs one op at a time. A schedule with tasks or other `memory`
declarations draws schedc/passes/memory.py's model over the whole cycle instead: activations and gradients
that tasks keep, and tasks' persistent state (held from time 0).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..passes.compiled import Compiled
from ..ir import Op
from ..passes.memory import holdings, host_holdings, levels, levels_of, memory_deltas, timed_model
from ..text import GIB


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


def memory_over_time(compiled: Compiled, deltas: dict[str, tuple[float, ...]] | None = None
                     ) -> list[list[tuple[float, float]]]:
    """Per device, the (time, activation units alive from then on) steps, starting at (0, 0). deltas:
    what each kind allocates (+) or frees (-) per stage in place of the schedule's units (bytes under
    --cluster); a schedule the timed memory model draws keeps its units."""
    schedule, timing = compiled.schedule, compiled.timing
    if timing.complete and timed_model(schedule):
        return [levels(held) for held in holdings(schedule, list(timing.steps) or [timing])]
    deltas = memory_deltas(schedule) if deltas is None else deltas
    series = []
    for row in timed_ops(compiled):
        events = []
        for t in row:
            delta = deltas.get(t.op.kind)
            amount = delta[t.op.stage] if delta is not None else 0.0
            if amount:
                events.append((t.start, 1, amount) if amount > 0 else (t.end, 0, amount))
        events.sort(key=lambda e: (e[0], e[1]))
        series.append(levels_of(events))
    return series


def host_over_time(compiled: Compiled) -> tuple[list[tuple[float, float]], ...]:
    """Per device, the (time, activation units on the host) steps of an `offload F` schedule (from each
    O's start until its L's end: memory.host_holdings); () without offload or a complete timing."""
    schedule, timing = compiled.schedule, compiled.timing
    if not schedule.offload or not timing.complete:
        return ()
    return tuple(levels(held) for held in host_holdings(schedule, list(timing.steps) or [timing]))


@dataclass(frozen=True, slots=True)
class MemoryView:
    """Memory over time as drawn: the series per device in `unit`, the limit per device (if declared)."""

    series: list[list[tuple[float, float]]]
    unit: str                       # "units" (activation units) or "GiB"
    limits: tuple[float, ...]
    host: tuple[list[tuple[float, float]], ...] = ()  # with `offload F`: per device, its activations on the host


def memory_view(compiled: Compiled, byte_deltas: dict[str, tuple[float, ...]] | None = None) -> MemoryView:
    """memory_over_time in activation units with `limit memory` (and the host's with `offload F`), or,
    given each kind's bytes per stage (--cluster), in GiB (the limit, declared in units, is then not drawn)."""
    if byte_deltas is None or timed_model(compiled.schedule):
        return MemoryView(memory_over_time(compiled), "units", tuple(compiled.schedule.memory_limit or ()),
                          host_over_time(compiled))
    series = memory_over_time(compiled, byte_deltas)
    return MemoryView([[(t, level / GIB) for t, level in steps] for steps in series], "GiB", ())


def stuck_ops(compiled: Compiled) -> dict[tuple[int, int], str]:
    """The ops the checks name as stuck or awaited (a deadlock): (device, position in its order) ->
    role, as the diagnostics carry them."""
    return {(d, n): role for diagnostic in compiled.diagnostics for d, n, role in diagnostic.ops}
