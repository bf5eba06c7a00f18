"""Simulation: event-driven timing of a schedule under its cost model.

Each device runs its order one op at a time; an op starts when its device is free and its
dependencies have ended (plus `latency` when a dependency ran on another device).

    1F1B, p=2, m=2, F=1, B=2:  device 0: F0 F1 . . B0 . B1     makespan 9, bubble 3/6 per device

The times come from one pass over the ops in dependency order (any order gives the same times); the
order in which the events happen, `sequence`, is then a sort by start time.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from heapq import heappop, heappush
from itertools import chain, repeat
from math import inf
from operator import attrgetter, gt

from ..ir import OP_KEY, Dependencies, Op, Schedule
from .memory import holdings, host_peaks, peak_memory, peaks, timed_model
from ..ops import BUILTIN, COPY, OVERLAP, OpKind, builtin_deps, fed_by
from .timing import OpTimes, StartOrder, Timing  # noqa: F401 - Timing is simulate's result


def predecessors(schedule: Schedule) -> tuple[list[Op], list[tuple[int, ...]], list[int]]:
    """predecessors_of, kept for the last schedule asked: `simulate --cluster` times one schedule twice
    (with its messages, then without for the breakdown's bubble). The lists are the caller's to change
    (fuse_pairs does): each call gets its own copies."""
    if _LAST and _LAST[0] is schedule:
        _, ops, preds, firsts = _LAST
    else:
        ops, preds, firsts = predecessors_of(schedule)
        _LAST[:] = [schedule, ops, preds, firsts]
    return list(ops), list(preds), list(firsts)


_LAST: list = []  # [schedule, ops, preds, firsts] of the last schedule indexed (held: `is` stays meaningful)


def forget_index() -> None:
    """Let go of the index `predecessors` keeps: lowering does, as the passes after it time nothing (at
    10^6 ops the ops' predecessor tuples and their indices hold 0.14 GiB)."""
    _LAST.clear()


def predecessors_of(schedule: Schedule) -> tuple[list[Op], list[tuple[int, ...]], list[int]]:
    """Index the placed ops (device by device, each in program order) and give each op's predecessors by
    index: the op before it on its device (none for a device's first op), then its data dependencies in
    Dependencies.keys_of order. A dependency that is not placed reads as len(ops), a sentinel that
    times counts as ended before time 0. Also the index of every device's first op. With `offload F`
    a device's copy engine is a lane of its own (see _copy_lanes)."""
    lanes, issued = _copy_lanes(schedule.orders) if schedule.offload else (schedule.orders, {})
    ops = list(chain.from_iterable(lanes))
    keys = list(map(OP_KEY, ops))
    # key -> index; a key not placed gets the sentinel (and is stored: the dict is thrown away after)
    index = defaultdict(repeat(len(ops)).__next__, zip(keys, range(len(ops))))
    preds = _predecessors(ops, keys, index, schedule.deps)
    firsts, n = [], 0
    for order in lanes:
        if order:
            firsts.append(n)
            preds[n] = preds[n][1:]  # n - 1 is another device's (or lane's) op
            n += len(order)
    if issued:  # a copy starts no earlier than the compute op before it in the program: after its inputs
        where = {id(op): n for n, op in enumerate(ops)}
        for copy, compute in issued.items():
            n = where[copy]
            preds[n] = preds[n] + preds[where[compute]]
    return ops, preds, firsts


def _copy_lanes(orders) -> tuple[list[tuple[Op, ...]], dict[int, int]]:
    """With `offload F`, each device's program as two lanes: its compute ops, then (when it has any) the
    O and L its copy engine runs, each lane in program order. A copy is issued when the program reaches
    it, alongside the compute op before it: it waits for that op's predecessors as well as for its own
    (its lane's previous copy, its data). Returns the lanes and, by id, the compute op before each copy.

        device 0: F(0,0) O(0,0) F(0,1) L(0,0) B(0,0)  ->  F(0,0) F(0,1) B(0,0) | O(0,0) L(0,0); L issued with F(0,1)
    """
    lanes, issued = [], {}
    for order in orders:
        compute, copies, last = [], [], None
        for op in order:
            if op.kind in COPY:
                copies.append(op)
                if last is not None:
                    issued[id(op)] = id(last)
            else:
                compute.append(op)
                last = op
        lanes += [tuple(compute), tuple(copies)] if copies else [tuple(compute)]
    return lanes, issued


def _predecessors(ops: list[Op], keys: list[tuple], index: dict[tuple, int],
                  deps: Dependencies) -> list[tuple[int, ...]]:
    """(n - 1, *indices of op n's dependencies) for every op n. A built-in op's dependencies come from
    ops.builtin_deps, asked once per kind, pipeline and stage and kept flat (_builtin_table): a keys_of
    call per op, two Python calls and a tuple of tuples, would cost as much as all of times. With a
    mixed backward the table holds both answers, the neighbour's backward whole and split, and the op
    reads the one the schedule chose for (pipeline, neighbour's stage, microbatch), as keys_of does."""
    if deps.per_microbatch:  # dependencies vary with the microbatch otherwise: no per-stage template
        return [(p, *[index[key] for key in deps.keys_of(op)]) for p, op in enumerate(ops, -1)]
    mixed = deps.mixed
    table = (_mixed_table(deps) if mixed else _builtin_table(deps, deps.split, deps.recompute)).get
    chosen = deps.split if mixed else frozenset()
    preds = []
    append = preds.append
    for p, (kind, s, mb, k, _) in enumerate(keys, -1):
        per_pipe = table(kind)
        found = None if per_pipe is None else per_pipe[k].get(s) if mixed else per_pipe[k][s]
        if found is None:  # a task: its declared dependencies (or a stage outside a mixed pipeline)
            append((p, *[index[key] for key in deps.keys_of(ops[p + 1])]))
            continue
        if mixed:
            neighbour, whole, split = found
            found = split if neighbour is not None and (k, neighbour, mb) in chosen else whole
        if len(found) == 2:
            a, x = found
            append((p, index[a, x, mb, k, 0]))
        elif found:
            a, x, b, y = found
            append((p, index[a, x, mb, k, 0], index[b, y, mb, k, 0]))
        else:
            append((p,))
    return preds


def _builtin_table(deps: Dependencies, split: bool, recompute: bool) -> dict[str, list[_Flat]]:
    """kind -> pipeline -> stage -> ops.builtin_deps of that op, flattened (see _Flat)."""
    return {kind: [_Flat(kind, stages, split, recompute) for stages in deps.stages] for kind in BUILTIN}


def _mixed_table(deps: Dependencies) -> dict[str, list[dict[int, tuple]]]:
    """With a mixed backward: kind -> pipeline -> stage -> (the stage of the neighbour the op reads
    (ops.fed_by), or None; its dependencies when that neighbour's backward runs whole; when split), as
    ir.builtin_dep_keys reads them. Stages outside the pipeline are not in it."""
    whole, split = _builtin_table(deps, False, deps.recompute), _builtin_table(deps, True, deps.recompute)
    out = {}
    for kind in BUILTIN:
        out[kind] = [{s: ((fed_by(kind, s) or (None, None))[1], flat[s], halves[s]) for s in range(stages)}
                     for stages, flat, halves in zip(deps.stages, whole[kind], split[kind])]
    return out


class _Flat(dict):
    """stage -> ops.builtin_deps(kind, stage, stages, split) as one flat tuple: (), (kind, stage) or
    (kind, stage, kind, stage) (the rule gives at most two). A stage outside the pipeline (in a broken
    schedule that check_structure reports) is asked on first use."""

    def __init__(self, kind: str, stages: int, split: bool, recompute: bool = False):
        super().__init__()
        self.kind, self.stages, self.split, self.recompute = kind, stages, split, recompute
        for s in range(stages):
            self[s]

    def __missing__(self, s: int) -> tuple:
        found = tuple(part for dep in builtin_deps(self.kind, s, self.stages, self.split, self.recompute) for part in dep)
        if len(found) > 4:
            raise ValueError(f"{self.kind}({s}) has more than two built-in dependencies")
        self[s] = found
        return found


def simulate(schedule: Schedule, latency: float = 0.0, links: Links | None = None,
             collectives: Collectives | None = None) -> Timing:
    """Time every op (linear in ops + edges, then a sort of nearly sorted runs). Guarantees: every op
    that can run has its start (when its device is free and its dependencies have ended, plus the time
    of the message when one ran on another device) and end; `complete` is False when the orders
    deadlock; peaks by the memory model. A dependency that is not placed (check_structure reports it) is
    ignored here, so a broken schedule still gets times. `links[a][b]`, when given, is the time of a
    message from device a to device b (the link the two sit on, schedc/costmodel/) and replaces the
    one `latency` of every message. `collectives`, when given, times each op's sharded-data-parallel
    collectives on its device's communication lane (Lane): the step ends when the last lane is done."""
    ops, preds, firsts, cost, device, lane, start, end = _timed(schedule, latency, links, collectives)
    complete = None not in end
    ran = range(len(ops)) if complete else [n for n, e in enumerate(end) if e is not None]
    timed_ops, starts, ends = (ops, start, end) if complete else (
        [ops[n] for n in ran], [start[n] for n in ran], [end[n] for n in ran])
    if latency >= 0 and (links is None or min(map(min, links), default=0.0) >= 0) \
            and all(map(gt, ends, starts)):  # see _event_order
        sequence = StartOrder(starts, ends, timed_ops)  # sorted when read (lowering): stable, ties in index order
        _RAN[:] = [schedule, start] if complete else []  # the Timing holds `start` too: no memory kept
    else:
        sequence = tuple((start[n], end[n], ops[n]) for n in _event_order(start, preds, firsts))
    busy = busy_times([0.0 if op.kind in COPY else c for op, c in zip(ops, cost)] if schedule.offload else cost,
                      device, schedule.devices)  # a copy engine's work is not the device's compute
    timing = Timing(OpTimes(timed_ops, starts), OpTimes(timed_ops, ends), _makespan(ends, lane),
                    busy, peak_memory(schedule), latency, complete, sequence=sequence)
    if complete and timed_model(schedule):  # kept outputs, saved gradients, task state, host memory
        held = holdings(schedule, [timing])
        timing = replace(timing, peak_memory=peaks(held), peak_host=host_peaks(schedule, [timing]))
    return timing


def makespan(schedule: Schedule, latency: float = 0.0, links: Links | None = None,
             collectives: Collectives | None = None) -> float:
    """simulate(...).makespan alone, without the sequence, busy times and peaks (the message-free
    makespan of a prediction's breakdown). Without messages or lanes, once simulate has timed the
    schedule (_RAN): one pass over the ops in that timing's start order, each op after its
    predecessors, the times as `times` gives them."""
    if _RAN and _RAN[0] is schedule and not latency and links is None and collectives is None:
        ops, preds, _ = predecessors(schedule)
        cost = list(map(COST, ops))
        _fuse(schedule, ops, preds, cost)
        started = _RAN[1]
        return max(_ends_in(sorted(range(len(started)), key=started.__getitem__), cost, preds), default=0.0)
    *_, lane, _, end = _timed(schedule, latency, links, collectives)
    return _makespan(end if None not in end else [e for e in end if e is not None], lane)


_RAN: list = []  # [schedule, its ops' starts] of the last simulate that ran every op and sorted by start


def _ends_in(order: list[int], cost: list[float], preds: list[tuple[int, ...]]) -> list[float]:
    """Each op's end without messages, the ops taken in a topological order (a timing's start order
    when every op takes time: an op starts after its predecessors end, so after they start)."""
    end = [0.0] * (len(cost) + 1)  # + the sentinel, ended at 0 (an op starts at 0.0 at the earliest)
    for c in order:
        t = 0.0
        for m in preds[c]:
            if end[m] > t:
                t = end[m]
        end[c] = t + cost[c]
    end.pop()
    return end


def _timed(schedule: Schedule, latency: float, links: Links | None, collectives: Collectives | None) -> tuple:
    """The ops indexed and timed: (ops, preds, firsts, cost, device, lane, start, end), end None for an
    op that never ran; an overlapped pair's halves start together."""
    ops, preds, firsts = predecessors(schedule)
    cost, device = list(map(COST, ops)), list(map(DEVICE, ops))
    pairs = _fuse(schedule, ops, preds, cost)
    lane = None if collectives is None else Lane(*collectives.per_op(schedule, ops), schedule.devices)
    start, end = times(cost, device, preds, firsts, latency, links, lane)
    for n in pairs:  # the backward half of an overlapped op runs with its forward half
        start[n + 1] = start[n]
    return ops, preds, firsts, cost, device, lane, start, end


def _makespan(ends: list[float], lane: Lane | None) -> float:
    """The last end of an op that ran, or of a collective on a lane."""
    return max(ends, default=0.0) if lane is None else max(max(ends, default=0.0), *lane.free)


COST, DEVICE = attrgetter("cost"), attrgetter("device")
Links = Sequence[Sequence[float]]  # device x device -> message time


class Collectives:  # the protocol simulate reads (schedc.costmodel.sharding.Sharded)
    def per_op(self, schedule: Schedule, ops: list[Op]) -> tuple[list[float], list[float]]:
        """Per op (in `ops`' order), the seconds of its gather ahead and its reduce-scatter behind."""
        raise NotImplementedError


def _fuse(schedule: Schedule, ops: list[Op], preds: list[tuple[int, ...]], cost: list[float]) -> list[int]:
    """Make each overlapped pair (its first half at n, the other at n + 1) one op: the first half waits
    for the second's dependencies too and carries the pair's cost (fuse_costs), the second follows at
    no cost. Returns the indices n."""
    pairs = fuse_pairs(schedule, ops, preds)
    fuse_costs(pairs, cost, schedule.costs)
    return [n for n, _ in pairs]


def fuse_pairs(schedule: Schedule, ops: list[Op], preds: list[tuple[int, ...]]) -> list[tuple[int, int]]:
    """The dependency half of _fuse: each overlapped pair's first half (at n) also waits for the second
    half's predecessors, the second (at n + 1) waits for the first alone. Returns (n, the stage of the
    pair's forward) per pair, for fuse_costs."""
    if not schedule.fused:
        return []
    where = {id(op): n for n, op in enumerate(ops)}
    pairs = []
    for f, b in schedule.fused:
        n = where[id(f)]
        if where.get(id(b)) != n + 1:
            raise ValueError(f"overlapped {f} and {b} are not placed side by side")
        preds[n] = preds[n] + tuple(m for m in preds[n + 1] if m != n)
        preds[n + 1] = (n,)
        pairs.append((n, (f if f.kind == OpKind.F else b).stage))
    return pairs


def fuse_costs(pairs: list[tuple[int, int]], cost: list[float], table) -> None:
    """The cost half of _fuse: a pair costs its halves' own costs (each at its own stage) less what
    overlapping saves, F + B - FB at the forward's stage (`cost FB`; nothing saved without one). Both
    halves on one stage: FB exactly. On two stages (DualPipe's chunks, a cost model's end stages with
    their embedding and logits) each half keeps its own stage's cost, rather than the forward stage's
    F + B standing for both. The second half then costs nothing."""
    for n, stage in pairs:
        cost[n], cost[n + 1] = pair_cost(table, cost[n] + cost[n + 1], stage), 0.0


def pair_cost(table, halves: float, stage: int) -> float:
    """The time of an overlapped pair whose halves cost `halves` on their own, its forward at `stage`:
    halves - (F + B - FB) there; FB itself when the table has no F or B; halves without an FB. The one
    rule of an overlap's saving (fuse_costs, the prediction's breakdown)."""
    overlap = table.get(OVERLAP)
    forward, backward = table.get(OpKind.F.value), table.get(OpKind.B.value)
    if overlap and forward and backward:
        return halves - (forward[stage] + backward[stage] - overlap[stage])
    return overlap[stage] if overlap else halves  # no B to measure the saving against: FB as declared


def busy_times(cost: list[float], device: list[int], devices: int) -> tuple[float, ...]:
    """Per device, the sum of its ops' costs (Timing.busy; the bubble's denominator)."""
    busy = [0.0] * devices
    for d, c in zip(device, cost):
        busy[d] += c
    return tuple(busy)


def order_makespan(cost: list[float], device: list[int], preds: list[tuple[int, ...]], firsts: list[int],
                   links: Links | None = None, lane: Lane | None = None) -> float | None:
    """simulate's timing of an order already indexed (predecessors(), fuse_pairs()) under one cost
    vector, for a caller that times one order under many (tune): its makespan, None when it deadlocks.
    lane: a fresh Lane of the order's collectives, as simulate makes it (the step ends with the last)."""
    _, end = times(cost, device, preds, firsts, 0.0, links, lane)
    return None if None in end else _makespan(end, lane)


class Lane:
    """Each device's communication lane for ZeRO's collectives, in the order they are issued: an op's
    `ahead` (the all-gather of its stage's parameters) is issued when the device's previous op starts
    (FSDP's prefetch; at 0 for its first op) and the op starts no earlier than it ends; its `behind`
    (the reduce-scatter of the gradients it made) is issued when it ends and delays only the lane.
    `free`: per device, when its lane is done (filled in by times).

        F0 = 1 s with a 3 s gather ahead, alone on its device: the gather 0..3, F0 3..4
        F0 F1, 1 s each, gathers of 0.5 s ahead of both: F0 0.5..1.5, F1's gather 0.5..1.0 (under F0), F1 1.5..2.5
    """

    def __init__(self, ahead: list[float], behind: list[float], devices: int):
        self.ahead, self.behind, self.free = ahead, behind, [0.0] * devices

    def gather(self, c: int, d: int, previous: int | None, start: list[float], end: list[float]) -> float:
        """When op c (on device d, after op `previous` of the device) may start, as far as its gather
        says: the previous op's reduce-scatter goes on the lane after this gather, issued later."""
        issued = start[previous] if previous is not None else 0.0
        ready = max(issued, self.free[d]) + self.ahead[c] if self.ahead[c] else 0.0
        if ready:
            self.free[d] = ready
        if previous is not None and self.behind[previous]:
            self.free[d] = max(self.free[d], end[previous]) + self.behind[previous]
        return ready

    def last(self, c: int, d: int, end: list[float]) -> None:
        """The device's last op ended: its reduce-scatter is the last thing on the lane."""
        if self.behind[c]:
            self.free[d] = max(self.free[d], end[c]) + self.behind[c]


def times(cost: list[float], device: list[int], preds: list[tuple[int, ...]], firsts: list[int],
          latency: float, links: Links | None = None, lane: Lane | None = None) -> tuple[list[float], list[float | None]]:
    """Start and end of every op that runs (end None for the others: the orders deadlock). An op is tried
    when its device reaches it and again when the predecessor it waited for ends; once all have ended,
    it starts at the latest arrival (0.0 at the earliest), and no earlier than its gather on the `lane`
    (Lane) when one is given. The order of the tries does not change the times, so it is a stack's, and
    each op's predecessors are read, never its successors written."""
    count = len(cost)
    start, end, device = [0.0] * count, [None] * count + [-inf], device + [-1]  # + the sentinel
    # into[b][a]: message time from device a to device b, 0 on one device (the sentinel reads the last)
    into = None if links is None else [[0.0 if a == b else links[a][b] for a in range(len(links))]
                                       for b in range(len(links))]
    last, waiting = _last_of_device(count, firsts), {}  # waiting: op -> ops whose try stopped at it
    first = set(firsts) if lane is not None else ()
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
            if lane is not None:
                t = max(t, lane.gather(c, device[c], None if c in first else c - 1, start, end))
            start[c], end[c] = t, t + cost[c]
            if c in waiting:
                tried += waiting.pop(c)
            if not last[c]:
                push(c + 1)  # tried first: a device runs on until it waits, which saves tries
            elif lane is not None:
                lane.last(c, device[c], end)
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


def step_sequences(schedule: Schedule, timing: Timing) -> tuple[tuple[tuple[float, float, Op], ...], ...]:
    """For every step program (schedule.steps), its ops as (start, end, op) in start order: the order
    lowering writes them in. The unfilled orders keep `timing`'s; each step of a filled cycle is timed
    again on its own, with only the built-in dependencies: a task placed in a later step reads inputs
    saved in an earlier one, and tasks send nothing."""
    return tuple(timing.sequence if timing.sequence and step is schedule.orders else _step_sequence(schedule, step)
                 for step in schedule.steps)


def _step_sequence(schedule: Schedule, step: tuple[tuple[Op, ...], ...]) -> tuple[tuple[float, float, Op], ...]:
    builtin = Dependencies(schedule.pipelines, schedule.costs, schedule.deps.split, {}, (), schedule.recompute)
    return simulate(replace(schedule, orders=step, cycle=(), deps=builtin)).sequence
