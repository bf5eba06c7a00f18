"""Simulation: event-driven timing of a schedule under its cost model.

Each device runs its order one op at a time; an op starts when its device is free and its
dependencies have ended (plus `latency` when a dependency ran on another device).

    1F1B, p=2, m=2, F=1, B=2:  device 0: F0 F1 . . B0 . B1     makespan 9, bubble 3/6 per device

The times come from one pass over the ops in dependency order (any order gives the same times); the
order in which the events happen, `sequence`, is then a sort by start time.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from itertools import chain, repeat
from math import inf
from operator import attrgetter, gt, itemgetter
from typing import Any, Iterator

from .ir import BUILTIN, OP_KEY, Dependencies, Op, Schedule


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


def predecessors(schedule: Schedule) -> tuple[list[Op], list[tuple[int, ...]], list[int]]:
    """Index the placed ops (device by device, each in program order) and give each op's predecessors by
    index: the op before it on its device (none for a device's first op), then its data dependencies in
    Dependencies.keys_of order. A dependency that is not placed reads as len(ops), a sentinel that
    _times counts as ended before time 0. Also the index of every device's first op."""
    ops = list(chain.from_iterable(schedule.orders))
    keys = list(map(OP_KEY, ops))
    # key -> index; a key not placed gets the sentinel (and is stored: the dict is thrown away after)
    index = defaultdict(repeat(len(ops)).__next__, zip(keys, range(len(ops))))
    preds = _predecessors(ops, keys, index, schedule.deps)
    firsts, n = [], 0
    for order in schedule.orders:
        if order:
            firsts.append(n)
            preds[n] = preds[n][1:]  # n - 1 is another device's op
            n += len(order)
    return ops, preds, firsts


def _predecessors(ops: list[Op], keys: list[tuple], index: dict[tuple, int],
                  deps: Dependencies) -> list[tuple[int, ...]]:
    """(n - 1, *indices of op n's dependencies) for every op n. Built-in ops follow ir.builtin_dep_keys
    inlined (tests/test_simulate.py holds the two together): a keys_of call per op, two Python calls and
    a tuple of tuples, would cost as much as all of _times."""
    grad, stages = "I" if deps.split else "B", deps.stages
    preds = []
    append = preds.append
    for p, (kind, s, mb, k, _) in enumerate(keys, -1):
        if kind == "F":
            append((p, index["F", s - 1, mb, k, 0]) if s > 0 else (p,))
        elif kind == "W":
            append((p, index["I", s, mb, k, 0]))
        elif kind in BUILTIN:
            append((p, index["F", s, mb, k, 0], index[grad, s + 1, mb, k, 0]) if s + 1 < stages[k]
                   else (p, index["F", s, mb, k, 0]))
        else:
            append((p, *[index[key] for key in deps.keys_of(ops[p + 1])]))
    return preds


def simulate(schedule: Schedule, latency: float = 0.0, links: Links | None = None) -> Timing:
    """Time every op (linear in ops + edges, then a sort of nearly sorted runs). A dependency that is not
    placed (check_structure reports it) is ignored here, so a broken schedule still gets times.
    `links[a][b]`, when given, is the time of a message from device a to device b (the link the two sit
    on, schedc/costmodel.py) and replaces the one `latency` of every message."""
    ops, preds, firsts = predecessors(schedule)
    cost, device = list(map(COST, ops)), list(map(DEVICE, ops))
    start, end = _times(cost, device, preds, firsts, latency, links)
    complete = None not in end
    ran = range(len(ops)) if complete else [n for n, e in enumerate(end) if e is not None]
    timed_ops, starts, ends = (ops, start, end) if complete else (
        [ops[n] for n in ran], [start[n] for n in ran], [end[n] for n in ran])
    if latency >= 0 and (links is None or min(map(min, links), default=0.0) >= 0) \
            and all(map(gt, ends, starts)):  # see _event_order
        sequence = sorted(zip(starts, ends, timed_ops), key=START)  # stable: ties keep index order
    else:
        sequence = [(start[n], end[n], ops[n]) for n in _event_order(start, preds, firsts)]
    busy = [0.0] * schedule.devices
    for d, c in zip(device, cost):
        busy[d] += c
    timing = Timing(OpTimes(timed_ops, starts), OpTimes(timed_ops, ends), max(ends, default=0.0),
                    tuple(busy), peak_memory(schedule), latency, complete, sequence=tuple(sequence))
    if complete and timed_model(schedule):  # kept outputs, saved gradients, task state
        from .memory import holdings, peaks
        timing = replace(timing, peak_memory=peaks(holdings(schedule, [timing])))
    return timing


COST, DEVICE, START = attrgetter("cost"), attrgetter("device"), itemgetter(0)
Links = Sequence[Sequence[float]]  # device x device -> message time


def _times(cost: list[float], device: list[int], preds: list[tuple[int, ...]], firsts: list[int],
           latency: float, links: Links | None = None) -> tuple[list[float], list[float | None]]:
    """Start and end of every op that runs (end None for the others: the orders deadlock). An op is tried
    when its device reaches it and again when the predecessor it waited for ends; once all have ended,
    it starts at the latest arrival (0.0 at the earliest). The order of the tries does not change the
    times, so it is a stack's, and each op's predecessors are read, never its successors written."""
    count = len(cost)
    start, end, device = [0.0] * count, [None] * count + [-inf], device + [-1]  # + the sentinel
    # into[b][a]: message time from device a to device b, 0 on one device (the sentinel reads the last)
    into = None if links is None else [[0.0 if a == b else links[a][b] for a in range(len(links))]
                                       for b in range(len(links))]
    last, waiting = _last_of_device(count, firsts), {}  # waiting: op -> ops whose try stopped at it
    tried = firsts[::-1]
    pop, push = tried.pop, tried.append
    while tried:
        c = pop()
        t = 0.0
        came = into[device[c]] if into is not None else None
        for m in preds[c]:
            arrive = end[m]
            if arrive is None:
                waiting.setdefault(m, []).append(c)
                break
            if came is not None:
                arrive += came[device[m]]
            elif latency and device[m] != device[c]:
                arrive += latency
            if arrive > t:
                t = arrive
        else:
            start[c], end[c] = t, t + cost[c]
            if c in waiting:
                tried += waiting.pop(c)
            if not last[c]:
                push(c + 1)  # tried first: a device runs on until it waits, which saves tries
    end.pop()
    return start, end


def _last_of_device(count: int, firsts: list[int]) -> list[bool]:
    """For every op, whether it is the last of its device's order (no next op to try when it ends)."""
    last = [False] * count
    for n in firsts[1:]:
        last[n - 1] = True
    if count:
        last[-1] = True
    return last


def _event_order(start: list[float], preds: list[tuple[int, ...]], firsts: list[int]) -> list[int]:
    """The ops that run, in the order an event loop starts them: always the ready op that starts first,
    the lower index on a tie; an op is ready once its predecessors have ended. simulate sorts by (start,
    index) instead when every op starts strictly later than its predecessors do (each op takes time and
    latency is not negative): an op can then only wait for ops that start earlier, and the orders agree."""
    done, last, waiting = [False] * len(start) + [True], _last_of_device(len(start), firsts), {}
    ready, order, tried = [], [], firsts
    while True:
        for c in tried:
            m = next((m for m in preds[c] if not done[m]), None)
            if m is None:
                heappush(ready, (start[c], c))
            else:
                waiting.setdefault(m, []).append(c)
        if not ready:
            return order
        n = heappop(ready)[1]
        done[n] = True
        order.append(n)
        tried = waiting.pop(n, [])
        if not last[n]:
            tried.append(n + 1)


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
