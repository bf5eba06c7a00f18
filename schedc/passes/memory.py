"""The memory model over simulated time: what every op holds on its device, from when until when, in
activation units (`memory K(s) = e`, docs/language.md):

- F(s,i) holds its activation (default 1) from its start until its B (W with `backward split`) ends, or
  until the last task that `keeps F(s, i)` ends, whichever is later; with `recompute F` only while it
  runs, and its R holds it again from R's start until that backward ends; with `offload F` and an O
  placed for it until the O ends, and its L from L's start until that backward ends (the host holds
  it from O's start until L's end: host_holdings);
- B(s,i) (I with `backward split`; also W) saves its output gradient: it holds e from its end until the
  last task that `keeps B(s, i)` ends, and nothing when no task keeps it;
- a task holds e as persistent state of its stage (K-FAC's factors and their inverses): on every device
  that runs the task for that stage, once per pipeline, all the time.

Over a filled cycle of K steps the built-in ops run in every step; a task of the cycle keeps step 0's
outputs (PipeFisher saves them across steps), an `at end` task or one in the programs its own step's.

    1F1B p=2 m=1 (F=1, B=2), memory B(s) = 0.5, memory g(s) = 2, task g(s, i) = 1 after B(s, i)
    keeps B(s, i), fill bubbles with g: a cycle of 2 steps of 6; g(1,0) fits at 4, g(0,0) at 1 of step 1
    device 1: g's state 2, F(1,0) over [1, 4), B(1,0)'s gradient 0.5 over [4, 5)             -> peak 3
    device 0: g's state 2, F(0,0) over [0, 6), B(0,0)'s gradient 0.5 over [6, 8) (g(0,0) in
              step 1 keeps step 0's), step 1's F(0,0) over [6, 12)                            -> peak 3.5

Schedules without tasks or `memory` declarations for kinds other than F take the order walk of
simulate.peak_memory instead (the same peaks, without times).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import walk
from .grid import label
from ..ir import Op, Schedule
from ..ops import BUILTIN, OpKind
from .timing import Timing

PERSISTENT = math.inf


@dataclass(frozen=True, slots=True)
class Held:
    """Memory one op holds on its device: `units` over [start, end) in absolute cycle time."""

    op: Op
    step: int
    start: float
    end: float                # PERSISTENT for a task's state
    units: float
    keeper: Op | None = None  # the task that keeps it past its own release, if one does

    def describe(self, schedule: Schedule) -> str:
        """`F(1,0)`, `F(1,0) kept by curvature_A(1,0)`, `gradient of B(1,0) kept by curvature_B(1,0)`,
        `state of curvature_A(1) (0.5)`."""
        if self.end == PERSISTENT:
            return f"state of {label(schedule, Op(self.op.kind, self.op.stage, None, self.op.pipe))} ({self.units:g})"
        what = label(schedule, self.op) if self.op.kind in _HOLDERS else f"gradient of {label(schedule, self.op)}"
        step = f" of step {self.step}" if len(schedule.steps) > 1 else ""
        return what + step + (f" kept by {label(schedule, self.keeper)}" if self.keeper is not None else "")


def holdings(schedule: Schedule, steps: Sequence[Timing]) -> list[list[Held]]:
    """Per device, everything held over the cycle whose step timings are `steps` (one for an unfilled
    schedule), in step and program order; persistent state first."""
    out: list[list[Held]] = [[] for _ in range(schedule.devices)]
    for held in _state(schedule):
        out[held.op.device].append(held)
    kept = _kept_until(schedule, steps)
    offset = 0.0
    for k, timing in enumerate(steps):
        for order in schedule.orders:  # the built-in ops run in every step of the cycle
            for op in order:
                if op.kind not in BUILTIN or op not in timing.start:
                    continue
                if op.kind in _HOLDERS:  # R, L: what `recompute F` dropped or `offload F` moved, back
                    units = schedule.activation[op.stage]
                    start = offset + timing.start[op]
                    end = offset + _device_end(schedule, timing, op)
                else:
                    units = schedule.memory[op.kind][op.stage] if op.kind in schedule.memory else 0.0
                    start = end = offset + timing.end[op]
                keeper = None
                until, by = kept.get((k, op), (0.0, None))
                if until > end:
                    end, keeper = until, by
                if units and end > start:
                    out[op.device].append(Held(op, k, start, end, units, keeper))
        offset += timing.makespan
    return out


_HOLDERS = frozenset({OpKind.F.value, OpKind.R.value, OpKind.L.value})  # what holds an activation on the device


def _device_end(schedule: Schedule, timing: Timing, op: Op) -> float:
    """Until when op (F, R or L) holds its activation on the device: a recomputed F while it runs, an
    offloaded F until its O has copied it out; else until the backward frees it."""
    if op.kind == OpKind.F and schedule.recompute:
        return timing.end[op]
    if op.kind == OpKind.F and (op.pipe, op.stage, op.mb) in schedule.deps.offloaded:
        return timing.end.get(Op(OpKind.O.value, op.stage, op.mb, op.pipe), timing.makespan)
    return timing.end.get(Op(schedule.release_of(op), op.stage, op.mb, op.pipe), timing.makespan)


def host_holdings(schedule: Schedule, steps: Sequence[Timing]) -> list[list[Held]]:
    """Per device, what its offloaded activations hold in host memory: from each O's start until its
    L's end (a step's own; nothing crosses steps)."""
    out: list[list[Held]] = [[] for _ in range(schedule.devices)]
    offset = 0.0
    for k, timing in enumerate(steps):
        for order in schedule.orders:
            for op in order:
                reload = Op(OpKind.L.value, op.stage, op.mb, op.pipe)
                if op.kind == OpKind.O and op in timing.start and reload in timing.end:
                    out[op.device].append(Held(op, k, offset + timing.start[op], offset + timing.end[reload],
                                               schedule.activation[op.stage]))
        offset += timing.makespan
    return out


def host_peaks(schedule: Schedule, steps: Sequence[Timing]) -> tuple[float, ...]:
    """Per device, the peak of host memory its offloaded activations take; () without `offload F`."""
    return peaks(host_holdings(schedule, steps)) if schedule.offload else ()


def _state(schedule: Schedule) -> list[Held]:
    """Persistent state: once per task kind, stage and pipeline that has a task op and declared memory."""
    seen: dict[tuple, Held] = {}
    tasks = [op for order in schedule.orders for op in order if op.is_task] + list(schedule.unplaced)
    for op in tasks:
        units = schedule.memory.get(op.kind, ())
        key = (op.kind, op.stage, op.pipe)
        if op.stage < len(units) and units[op.stage] and key not in seen:
            seen[key] = Held(op, 0, 0.0, PERSISTENT, units[op.stage])
    return list(seen.values())


def _kept_until(schedule: Schedule, steps: Sequence[Timing]) -> dict[tuple[int, Op], tuple[float, Op]]:
    """(step, kept op) -> (absolute time until which a task keeps that step's output, the task). A task
    of the cycle (placed once per cycle) keeps step 0's outputs; an `at end` or programmed task its own."""
    at_end = {spec.name for spec in schedule.tasks if spec.at_end}
    cycle_tasks = {op for op in schedule.unplaced if op.kind not in at_end}
    out: dict[tuple[int, Op], tuple[float, Op]] = {}
    offset = 0.0
    for k, timing in enumerate(steps):
        for task, kept in schedule.keeps.items():
            end = timing.end.get(task)
            if end is None:
                continue
            owner = 0 if task in cycle_tasks else k
            for op in kept:
                if offset + end > out.get((owner, op), (0.0, None))[0]:
                    out[(owner, op)] = (offset + end, task)
        offset += timing.makespan
    return out


def _events(held: list[Held], weight: Callable[[Held], float] | None = None) -> list[tuple[float, int, float, int]]:
    """(time, 0 for a release / 1 for an allocation, amount, index into held) in time order, releases
    first at equal times (a device runs one op at a time: what ends frees before the next op starts)."""
    events = []
    for n, h in enumerate(held):
        amount = weight(h) if weight else h.units
        events.append((h.start, 1, amount, n))
        if h.end != PERSISTENT:
            events.append((h.end, 0, -amount, n))
    events.sort(key=lambda e: (e[0], e[1]))
    return events


def peaks(per_device: list[list[Held]], weight: Callable[[Held], float] | None = None) -> tuple[float, ...]:
    """The peak of what is held at once, per device."""
    return tuple(walk.peak(_amounts(_events(held, weight)), 0.0) for held in per_device)


def _amounts(events: list[tuple]) -> list[float]:
    return [event[2] for event in events]


def levels(held: list[Held]) -> list[tuple[float, float]]:
    """(time, units held from then on) steps of one device, starting at (0, 0): the memory chart."""
    return levels_of(_events(held))


def levels_of(events: list[tuple]) -> list[tuple[float, float]]:
    """The steps of `levels` from events (time, order at equal times, amount, ...) already in time order."""
    steps = [(0.0, 0.0)]
    for (time, *_), alive in zip(events, walk.levels(_amounts(events), 0.0)):
        if steps[-1][0] == time:
            steps[-1] = (time, alive)
        else:
            steps.append((time, alive))
    return steps


def peak_of(held: list[Held], weight: Callable[[Held], float] | None = None) -> tuple[float, Held | None, int]:
    """One device's peak, what was allocated to reach it, and how many holdings are alive then."""
    events = _events(held, weight)
    amounts = _amounts(events)
    peak, at = walk.first_peak(amounts)
    if at is None:
        return 0.0, None, 0
    return peak, held[events[at][3]], sum(1 if a > 0 else -1 for a in amounts[:at + 1])


def first_over(held: list[Held], limit: float, tolerance: float = 1e-9,
               weight: Callable[[Held], float] | None = None) -> tuple[Held, list[Held], float] | None:
    """The first allocation after which more than `limit` is held: (it, everything held then, the total)."""
    events = _events(held, weight)
    for at, total in enumerate(walk.levels(_amounts(events), 0.0)):
        if events[at][2] > 0 and total > limit + tolerance:
            alive: dict[int, Held] = {}
            for _, _, amount, n in events[:at + 1]:
                if amount > 0:
                    alive[n] = held[n]
                else:
                    alive.pop(n, None)
            return held[events[at][3]], list(alive.values()), total
    return None


# Without tasks or other `memory` declarations: the order walk ----------------------------------------

def timed_model(schedule: Schedule) -> bool:
    """Whether peaks need the timed model (schedc/passes/memory.py): tasks (they keep outputs, hold state) or
    memory of kinds other than F. Otherwise the order walk of peak_memory is exact and cheaper."""
    return bool(schedule.tasks or schedule.memory or schedule.recompute or schedule.offload)


def memory_deltas(schedule: Schedule) -> dict[str, tuple[float, ...]]:
    """What each kind allocates (+) or frees (-) per stage, in activation units: F holds until B (or W)."""
    act = schedule.activation
    return {OpKind.F.value: act, **{kind: tuple(-a for a in act) for kind in schedule.releases}}


def peak_memory(schedule: Schedule) -> tuple[float, ...]:
    """Peak activation units alive per device, over its program order (a device runs one op at a time).
    Exact for F and its release; schedules with tasks or other `memory` declarations are timed by
    schedc/passes/memory.py instead."""
    deltas = memory_deltas(schedule)
    return tuple(walk.peak_along(order, deltas, 0.0) for order in schedule.orders)
