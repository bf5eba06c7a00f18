"""Simulation: event-driven timing of a schedule under its cost model.

Each device runs its order one op at a time; an op starts when its device is free and its
dependencies have ended (plus `latency` when a dependency ran on another device).

    1F1B, p=2, m=2, F=1, B=2:  device 0: F0 F1 . . B0 . B1     makespan 9, bubble 3/6 per device
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from operator import attrgetter
from typing import Any, Iterator

from .ir import OP_KEY, Op, Schedule


@dataclass(frozen=True, slots=True)
class Timing:
    """Start and end of every placed op, and the derived statistics."""

    start: Mapping[Op, float]
    end: Mapping[Op, float]
    makespan: float
    busy: tuple[float, ...]
    peak_memory: tuple[float, ...]
    latency: float
    complete: bool  # False when the orders deadlock: ops that never ran have no times
    steps: tuple[Timing, ...] = ()  # a filled plan's K step programs, each timed from its own start
    extra: dict[str, Any] = field(default_factory=dict)  # stats a later pass adds (fill_bubbles)
    sequence: tuple[tuple[float, float, Op], ...] = ()  # (start, end, op) in start order: a topological order

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.makespan - b for b in self.busy)

    def stats(self) -> dict[str, Any]:
        devices = len(self.busy)
        busy = sum(self.busy)
        span = self.makespan * devices
        return {
            "makespan": _round(self.makespan),
            "utilization": _round(busy / span) if span else 0.0,
            "bubble_fraction": _round((span - busy) / busy) if busy else 0.0,
            "busy": [_round(b) for b in self.busy],
            "idle": [_round(i) for i in self.idle],
            "peak_memory": [_round(m) for m in self.peak_memory],
            "latency": self.latency,
        }


def _round(x: float) -> float:
    return round(x, 9)


class OpTimes(Mapping):
    """Op -> time, from parallel lists. The dict is built on the first lookup: a compile that finds
    nothing wrong looks no op up, and hashing 10^5 ops (a Python-level __hash__) is most of the cost."""

    __slots__ = ("_ops", "_times", "_table")

    def __init__(self, ops: list[Op], times: list[float]):
        self._ops, self._times, self._table = ops, times, None

    def table(self) -> dict[Op, float]:
        if self._table is None:
            self._table = dict(zip(self._ops, self._times))
        return self._table

    def __getitem__(self, op: Op) -> float:
        return self.table()[op]

    def get(self, op: Op, default: Any = None) -> Any:
        return self.table().get(op, default)

    def __contains__(self, op: object) -> bool:
        return op in self.table()

    def __iter__(self) -> Iterator[Op]:
        return iter(self.table())

    def __len__(self) -> int:
        return len(self.table())


def program_edges(schedule: Schedule) -> tuple[list[Op], dict[tuple, int], list[list[int]], list[int]]:
    """Index the placed ops and build successor lists: program order plus data dependencies."""
    ops = [op for order in schedule.orders for op in order]
    index = {key: n for n, key in enumerate(map(OP_KEY, ops))}
    succ: list[list[int]] = [[n + 1] for n in range(len(ops))]  # the next op of the same device...
    indegree = [1] * len(ops)
    n = 0
    for order in schedule.orders:
        if order:
            indegree[n] = 0                                         # ...but for each device's first
            n += len(order)
            succ[n - 1].pop()                                       # and last op
    get = index.get
    for n, keys in enumerate(map(schedule.deps.keys_of, ops)):
        for dep in keys:
            m = get(dep)
            if m is not None:
                succ[m].append(n)
                indegree[n] += 1
    return ops, index, succ, indegree


def simulate(schedule: Schedule, latency: float = 0.0) -> Timing:
    """Time every op (linear in ops + edges). A dependency that is not placed (check_structure reports it)
    is ignored here, so a broken schedule still gets times."""
    ops, index, succ, indegree = program_edges(schedule)
    cost, device = list(map(COST, ops)), list(map(DEVICE, ops))
    start, end, sequence = _run(ops, cost, device, succ, indegree, latency)
    complete = len(sequence) == len(ops)
    if complete:
        timed_ops, starts, ends = ops, start, end
    else:
        timed = [n for n in range(len(ops)) if indegree[n] == 0]
        timed_ops, starts, ends = [ops[n] for n in timed], [start[n] for n in timed], [end[n] for n in timed]
    busy = [0.0] * schedule.devices
    for d, c in zip(device, cost):
        busy[d] += c
    timing = Timing(OpTimes(timed_ops, starts), OpTimes(timed_ops, ends), max(ends, default=0.0),
                    tuple(busy), peak_memory(schedule), latency, complete, sequence=tuple(sequence))
    if complete and timed_model(schedule):  # kept outputs, saved gradients, task state
        from .memory import holdings, peaks
        timing = replace(timing, peak_memory=peaks(holdings(schedule, [timing])))
    return timing


COST, DEVICE = attrgetter("cost"), attrgetter("device")


def _run(ops: list[Op], cost: list[float], device: list[int], succ: list[list[int]], indegree: list[int],
         latency: float) -> tuple[list[float], list[float], list[tuple[float, float, Op]]]:
    """The event loop: start and end of every op that runs, and (start, end, op) in start order. Leaves
    indegree[n] == 0 exactly for the ops that ran."""
    start, end, ready = [0.0] * len(ops), [0.0] * len(ops), [0.0] * len(ops)
    heap = [(0.0, n) for n in range(len(ops)) if indegree[n] == 0]  # (start time, op): time order
    sequence = []
    while heap:
        time, n = heappop(heap)
        start[n] = time
        end[n] = finish = time + cost[n]
        sequence.append((time, finish, ops[n]))
        d = device[n]
        for m in succ[n]:
            arrive = finish + latency if latency and device[m] != d else finish
            if arrive > ready[m]:
                ready[m] = arrive
            indegree[m] -= 1
            if indegree[m] == 0:
                heappush(heap, (ready[m], m))
    return start, end, sequence


def timed_model(schedule: Schedule) -> bool:
    """Whether peaks need the timed model (schedc/memory.py): tasks (they keep outputs, hold state) or
    memory of kinds other than F. Otherwise the order walk of peak_memory is exact and cheaper."""
    return bool(schedule.tasks or schedule.memory)


def memory_deltas(schedule: Schedule) -> dict[str, tuple[float, ...]]:
    """What each kind allocates (+) or frees (-) per stage, in activation units: F holds until B (or W)."""
    act = schedule.activation
    return {"F": act, schedule.release: tuple(-a for a in act)}


def peak_memory(schedule: Schedule) -> tuple[float, ...]:
    """Peak activation units alive per device, over its program order (a device runs one op at a time).
    Exact for F and its release; schedules with tasks or other `memory` declarations are timed by
    schedc/memory.py instead."""
    deltas = memory_deltas(schedule)
    peaks = []
    for order in schedule.orders:
        alive = peak = 0.0
        for op in order:
            delta = deltas.get(op.kind)
            if delta is not None:
                alive += delta[op.stage]
                if alive > peak:
                    peak = alive
        peaks.append(peak)
    return tuple(peaks)
