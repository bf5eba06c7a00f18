"""Simulation: event-driven timing of a schedule under its cost model.

Each device runs its order one op at a time; an op starts when its device is free and its
dependencies have ended (plus `latency` when a dependency ran on another device).

    1F1B, p=2, m=2, F=1, B=2:  device 0: F0 F1 . . B0 . B1     makespan 9, bubble 3/6 per device

The times come from one pass over the ops in dependency order (any order gives the same times); the
order in which the events happen, `sequence`, is then a sort by start time.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from heapq import heappop, heappush
from itertools import chain, repeat
from math import inf
from operator import attrgetter, gt, itemgetter

from .ir import OP_KEY, Dependencies, Op, Schedule
from .memory import holdings, peak_memory, peaks, timed_model
from .ops import BUILTIN, builtin_deps
from .timing import OpTimes, Timing  # noqa: F401 - Timing is simulate's result


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
    """(n - 1, *indices of op n's dependencies) for every op n. A built-in op's dependencies come from
    ops.builtin_deps, asked once per (kind, stage, pipeline) (_BuiltinDeps); a keys_of call per op, two
    Python calls and a tuple of tuples, would cost as much as all of _times."""
    templates = _BuiltinDeps(deps)
    preds = []
    append = preds.append
    for p, (kind, s, mb, k, _) in enumerate(keys, -1):
        found = templates[kind, s, k]
        if found is None:  # a task: its declared dependencies
            append((p, *[index[key] for key in deps.keys_of(ops[p + 1])]))
        elif len(found) == 1:
            ((a, x),) = found
            append((p, index[a, x, mb, k, 0]))
        elif len(found) == 2:
            (a, x), (b, y) = found
            append((p, index[a, x, mb, k, 0], index[b, y, mb, k, 0]))
        else:
            append((p, *[index[a, x, mb, k, 0] for a, x in found]))
    return preds


class _BuiltinDeps(dict):
    """(kind, stage, pipeline) -> ops.builtin_deps of that op, or None for a task; filled on first use."""

    def __init__(self, deps: Dependencies):
        super().__init__()
        self.stages, self.split = deps.stages, deps.split

    def __missing__(self, key: tuple) -> tuple | None:
        kind, s, k = key
        found = self[key] = builtin_deps(kind, s, self.stages[k], self.split) if kind in BUILTIN else None
        return found


def simulate(schedule: Schedule, latency: float = 0.0) -> Timing:
    """Time every op (linear in ops + edges, then a sort of nearly sorted runs). A dependency that is not
    placed (check_structure reports it) is ignored here, so a broken schedule still gets times."""
    ops, preds, firsts = predecessors(schedule)
    cost, device = list(map(COST, ops)), list(map(DEVICE, ops))
    start, end = _times(cost, device, preds, firsts, latency)
    complete = None not in end
    ran = range(len(ops)) if complete else [n for n, e in enumerate(end) if e is not None]
    timed_ops, starts, ends = (ops, start, end) if complete else (
        [ops[n] for n in ran], [start[n] for n in ran], [end[n] for n in ran])
    if latency >= 0 and all(map(gt, ends, starts)):  # see _event_order
        sequence = sorted(zip(starts, ends, timed_ops), key=START)  # stable: ties keep index order
    else:
        sequence = [(start[n], end[n], ops[n]) for n in _event_order(start, preds, firsts)]
    busy = [0.0] * schedule.devices
    for d, c in zip(device, cost):
        busy[d] += c
    timing = Timing(OpTimes(timed_ops, starts), OpTimes(timed_ops, ends), max(ends, default=0.0),
                    tuple(busy), peak_memory(schedule), latency, complete, sequence=tuple(sequence))
    if complete and timed_model(schedule):  # kept outputs, saved gradients, task state
        timing = replace(timing, peak_memory=peaks(holdings(schedule, [timing])))
    return timing


COST, DEVICE, START = attrgetter("cost"), attrgetter("device"), itemgetter(0)


def _times(cost: list[float], device: list[int], preds: list[tuple[int, ...]], firsts: list[int],
           latency: float) -> tuple[list[float], list[float | None]]:
    """Start and end of every op that runs (end None for the others: the orders deadlock). An op is tried
    when its device reaches it and again when the predecessor it waited for ends; once all have ended,
    it starts at the latest arrival (0.0 at the earliest). The order of the tries does not change the
    times, so it is a stack's, and each op's predecessors are read, never its successors written."""
    count = len(cost)
    start, end, device = [0.0] * count, [None] * count + [-inf], device + [-1]  # + the sentinel
    last, waiting = _last_of_device(count, firsts), {}  # waiting: op -> ops whose try stopped at it
    tried = firsts[::-1]
    pop, push = tried.pop, tried.append
    while tried:
        c = pop()
        t = 0.0
        for m in preds[c]:
            arrive = end[m]
            if arrive is None:
                waiting.setdefault(m, []).append(c)
                break
            if latency and device[m] != device[c]:
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
