"""The squeeze of Qi et al., "Pipeline Parallelism with Controllable Memory" (2024): a building block
repeated at fixed unit slots leaves idle slots in its warm-up and cool-down; the squeeze moves those
ops earlier, as far as their dependencies and the block's own memory peak allow, then runs every op
as soon as it can (unit costs). This is the order V-Half and V-Min run in the paper and its code.

    V-Half, p = 2, m = 3, device 0 (K c.i: kind K of chunk c, microbatch i), the block in its slots:
        F0.0 . . . F1.0 . F0.1 . I1.0 W1.0 F1.1 . F0.2 I0.0 I1.1 W1.1 F1.2 W0.0 ...
    -> squeezed:  F0.0 F0.1 F0.2 F1.0 I1.0 W1.0 F1.1 I0.0 I1.1 W1.1 F1.2 I1.2 ...

Input: each device's ops in its program's order with their unit slots (`F[0] at t`; an op without
`at` takes the slot after the previous op's). Rules, each pass over all devices' ops in slot order:

1. the weight gradients are set aside (their own slots are not read); a free slot runs the oldest
   pending one (here they are counted, not named: the n-th W waits for the n-th input gradient);
2. warm-up and cool-down ops move: an op before stage 0's first backward, or after the first last
   forward of chunk 0 (of any device) met after it, takes the earliest free slot after its
   dependencies (the ops module's rule) and after the previous op of its kind and chunk where the
   device's peak memory stays within the highest peak of any device before the pass (a forward
   holds one unit until its W frees it); the steady state between them stays;
3. every op starts as soon as its dependencies and its device's previous op allow (unit costs).

The pass runs twice: with the weight gradients in their slots, then without them (a free slot after
an input gradient frees one unit) moving only the cool-down. At the end a free slot runs the oldest
pending weight gradient of the highest chunk (chunk 1's before chunk 0's, as the paper's V does).
"""
from __future__ import annotations

from collections import deque
from itertools import chain, compress, groupby, repeat
from operator import add, attrgetter, contains, mul, sub

from ..ir import OP_KEY, Op, consume
from ..ops import BUILTIN, GRADIENT, OpKind
from ..walk import Slots, slots_of, unit_change

_F, _I, _W = OpKind.F.value, OpKind.I.value, OpKind.W.value
_AT = attrgetter("stage", "mb", "pipe")
_KIND, _DEVICE = attrgetter("kind"), attrgetter("device")


class _Ops:
    """The ops being squeezed, weight gradients aside, by index: device, lane (kind, pipe, chunk),
    dependencies and the lane's previous op."""

    def __init__(self, orders: tuple[tuple[Op, ...], ...], deps, chunk: dict[tuple[int, int], int]):
        self.ops = [op for order in orders for op in order if op.kind != _W]
        weights = [op for order in orders for op in order if op.kind == _W]
        self.weights = dict(zip(map(_AT, weights), weights))  # (stage, mb, pipe) -> W
        self.devices = len(orders)
        self.device = list(map(_DEVICE, self.ops))
        kinds, stages, pipes = (list(map(attrgetter(name), self.ops)) for name in ("kind", "stage", "pipe"))
        self.deps = dependency_lists(self.ops, deps)
        self.chunk = list(map(chunk.__getitem__, zip(pipes, stages)))
        self.change = list(map(unit_change, kinds))  # memory (walk's rule); W's come counted
        self.backward = list(map(_I.__eq__, kinds))  # an input gradient (its W comes counted)
        lanes: dict[tuple, int] = {}
        self.previous = []
        for n, lane in enumerate(zip(self.device, kinds, pipes, self.chunk)):
            self.previous.append(lanes.get(lane))
            lanes[lane] = n
        # where the steady state begins (stage 0's first backward) and the last forward of chunk 0
        # of each device, the first of which met after it ends the steady state (`lanes` holds each
        # lane's last op)
        self.first_backward = next((n for n, op in enumerate(self.ops)
                                    if op.stage == 0 and op.pipe == 0 and op.kind in GRADIENT), None)
        self.last_forwards = {n for (_, kind, _, c), n in lanes.items() if kind == _F and c == 0}
        self.by_device: list[list[int]] = [[] for _ in orders]
        for d, mine in groupby(sorted(range(len(self.ops)), key=self.device.__getitem__), self.device.__getitem__):
            self.by_device[d] = list(mine)

    def on(self, device: int) -> list[int]:
        return self.by_device[device]


def dependency_lists(ops: list[Op], deps) -> list[list[int]]:
    """Each op's dependencies among `ops`, as indices in keys_of's order: `[index[k] for k in
    deps.keys_of(op) if k in index]`, asked once per class of ops instead of once per op. Without
    sequence chunks or offloaded forwards a built-in op's keys are those of its kind, stage and pipe
    with its own microbatch put in (ir.builtin_dep_keys), save that with a mixed backward the kind
    read of a neighbour depends on whether the neighbour's (pipe, stage, mb) runs split: a class is
    (kind, stage, pipe, part, whether the stages below and above run split for the op's microbatch).
    Ops and keys are numbered by one integer each (_Numbering), so that an op's j-th key is its own
    number plus its class's offset, the same for every op of the class (the microbatch cancels). Asked
    per op where a class's keys leave the numbering or name another microbatch than its op's
    (tests/test_squeeze.py holds this to keys_of)."""
    numbering = _Numbering(ops) if not deps.per_microbatch else None
    if numbering is None or not numbering.ok:
        return _asked_per_op(ops, deps)
    codes, mbs = numbering.codes, numbering.mbs
    split = deps.split if deps.mixed else frozenset()
    below = map(split.__contains__, zip(numbering.pipes, map(sub, numbering.stages, repeat(1)), mbs))
    above = map(split.__contains__, zip(numbering.pipes, map(add, numbering.stages, repeat(1)), mbs))
    classes = list(map(add, map(mul, map(sub, codes, map(mul, mbs, repeat(numbering.mb_step))), repeat(4)),
                       map(add, map(mul, below, repeat(2)), above)))
    first = dict(zip(reversed(classes), range(len(ops) - 1, -1, -1)))  # each class's first op
    keys = [deps.keys_of(ops[n]) for n in first.values()]
    offsets = [[None if key[2] != mbs[n] or (number := numbering.number(key)) is None else number - codes[n]
                for key in found] for n, found in zip(first.values(), keys)]
    if any(None in row for row in offsets):
        return _asked_per_op(ops, deps)
    ids = list(map(dict(zip(first, range(len(first)))).__getitem__, classes))
    index = dict(zip(codes, range(len(ops))))
    columns = []
    for j in range(max(map(len, keys), default=0)):
        offset = [row[j] if j < len(row) else -numbering.size for row in offsets]  # none: below 0
        columns.append(list(map(index.get, map(add, codes, map(offset.__getitem__, ids)))))
    out = list(map(list, zip(*columns))) if columns else [[] for _ in ops]
    for n in compress(range(len(ops)), map(contains, zip(*columns), repeat(None))):
        out[n] = [k for k in out[n] if k is not None]
    return out


def _asked_per_op(ops: list[Op], deps) -> list[list[int]]:
    index = dict(zip(map(OP_KEY, ops), range(len(ops))))
    return [[index[k] for k in deps.keys_of(op) if k in index] for op in ops]


class _Numbering:
    """Built-in ops' keys (kind, stage, mb, pipe, part) numbered in a mixed radix: kind, pipe, stage
    (from one below the lowest to one above the highest), mb, part; `ok` where every op fits (built-in,
    microbatch and part natural numbers), `codes` the ops' numbers. number(key) is None off the grid."""

    def __init__(self, ops: list[Op]):
        self.stages, self.mbs, self.pipes, parts = (list(map(attrgetter(name), ops))
                                                    for name in ("stage", "mb", "pipe", "part"))
        kinds = list(map(_KIND, ops))
        self.kinds = {kind: n for n, kind in enumerate(sorted(BUILTIN))}
        self.ok = bool(ops) and None not in self.mbs and set(kinds) <= self.kinds.keys() and \
            min(self.mbs) >= 0 and min(parts) >= 0 and min(self.pipes) >= 0
        if not self.ok:
            return
        self.low = min(self.stages) - 1
        self.radix = (len(self.kinds), max(self.pipes) + 1, max(self.stages) + 2 - self.low, max(self.mbs) + 1,
                      max(parts) + 1)
        self.mb_step = self.radix[4]
        self.size = self.radix[0] * self.radix[1] * self.radix[2] * self.radix[3] * self.radix[4]
        codes = map(self.kinds.__getitem__, kinds)
        for column, radix in zip((self.pipes, map(sub, self.stages, repeat(self.low)), self.mbs, parts),
                                 self.radix[1:]):
            codes = map(add, map(mul, codes, repeat(radix)), column)
        self.codes = list(codes)

    def number(self, key: tuple) -> int | None:
        kind, stage, mb, pipe, part = key
        digits = (self.kinds.get(kind), pipe, stage - self.low, mb, part)
        if any(d is None or not 0 <= d < r for d, r in zip(digits, self.radix)):
            return None
        code = 0
        for d, r in zip(digits, self.radix):
            code = code * r + d
        return code


def squeeze_orders(orders: tuple[tuple[Op, ...], ...], slots: list[list[int]], deps,
                   chunk: dict[tuple[int, int], int]) -> tuple[tuple[Op, ...], ...]:
    """The orders squeezed (module docstring); `slots[d]` holds the slot of each op of `orders[d]`."""
    table = _Ops(orders, deps, chunk)
    times = [t for order, ts in zip(orders, slots) for op, t in zip(order, ts) if op.kind != _W]
    times = _pass(table, times, with_weights=True)
    times = _pass(table, times, with_weights=False)
    return _final_orders(table, times)


def _pass(table: _Ops, times: list[int], with_weights: bool) -> list[int]:
    """Rules 1 to 3 once; returns each op's new slot."""
    times = list(times)
    weights = [_weight_slots(table, times, d) for d in range(table.devices)] if with_weights else []
    curves = [_curve(table, times, d, weights[d] if with_weights else None) for d in range(table.devices)]
    bound = max(curve.peak for curve in curves)
    events, owners, ranks = _events(table, times, weights)
    taken: list[set[int]] = [set() for _ in range(table.devices)]
    steady, cool = _phases(table, events)
    warm_up = events[:steady] if with_weights else []  # it moves only with the weight gradients counted
    kept = events[len(warm_up):cool + 1]  # rule 2 keeps the steady state (the second time the warm-up too)
    slots = times + list(chain.from_iterable(weights))  # each event's slot
    _move(table, times, weights, warm_up, (owners, ranks, taken, curves, bound))
    consume(map(set.add, map(taken.__getitem__, map(owners.__getitem__, kept)), map(slots.__getitem__, kept)))
    _move(table, times, weights, events[cool + 1:], (owners, ranks, taken, curves, bound))
    if not with_weights:  # rule 1 again, for the moved ops
        weights = [_weight_slots(table, times, d) for d in range(table.devices)]
    return _eager(table, times, weights)


def _move(table: _Ops, times: list[int], weights: list[list[int]], events: list[int], state) -> None:
    """Rule 2 for each of the events, in turn; `state`: the pass's (owners, ranks, taken, curves, bound)."""
    owners, ranks, taken, curves, bound = state
    for e in events:
        d, k = owners[e], ranks[e]
        if e < len(table.ops):
            taken[d].add(_place_op(table, times, k, times[k], taken[d], curves[d], bound))
        else:
            taken[d].add(_place_weight(weights[d], k, weights[d][k], taken[d], curves[d], bound))


def _events(table: _Ops, times: list[int], weights: list[list[int]]):
    """The ops (0 .. len(ops) - 1) and after them each device's weight gradients, in the order of the
    pass: by slot, device, ops before weight gradients, then index: the order of the plain tuples (t,
    device, is_weight, n), sorted by one integer key per event, (t * devices + device) * 2 + is_weight,
    the ties left in index order by the stable sort. (events, each event's device, each event's index:
    the op's, or the weight gradient's among its device's)."""
    devices, owners, ranks = table.devices, list(table.device), list(range(len(times)))
    keys = list(map(add, map(mul, times, repeat(2 * devices)), map(mul, owners, repeat(2))))
    for d, own in enumerate(weights):
        keys += map(add, map(mul, own, repeat(2 * devices)), repeat(2 * d + 1))
        owners += repeat(d, len(own))
        ranks += range(len(own))
    return sorted(range(len(keys)), key=keys.__getitem__), owners, ranks


def _phases(table: _Ops, events: list[int]) -> tuple[int, int]:
    """Where rule 2's steady state begins and ends in the events: at stage 0's first backward, through
    the first last forward of chunk 0 met after it (inclusive; len(events) where none)."""
    ops, last = len(table.ops), len(events)
    start = events.index(table.first_backward) if table.first_backward is not None else last
    end = next((at for at in range(start, last) if events[at] < ops and events[at] in table.last_forwards), last)
    return start, end


def _place_op(table, times, n, t, taken, curve, bound) -> int:
    """Rule 2 for an op: after its dependencies and its lane's previous op."""
    before = [times[k] for k in table.deps[n]]
    if table.previous[n] is not None:
        before.append(times[table.previous[n]])
    backward = table.backward[n]
    slot = curve.earliest(max(before, default=-1) + 1, t, table.change[n], backward, taken, bound)
    if slot != t:
        curve.move(slot, t, table.change[n], backward)
        times[n] = slot
    return slot


def _place_weight(own, k, t, taken, curve, bound) -> int:
    """Rule 2 for the k-th weight gradient of device d (its slots `own`): after the device's k-th input
    gradient and its weight gradient k-1."""
    first = max(curve.backwards[k], own[k - 1] if k else -1) + 1
    slot = curve.earliest(first, t, -1, False, taken, bound)
    if slot != t:
        curve.move(slot, t, -1, False)
        own[k] = slot
    return slot


def _weight_slots(table: _Ops, times: list[int], d: int) -> list[int]:
    """Rule 1: the slots of device d's weight gradients, counted, in the free slots (slots are never
    negative: order.py refuses one)."""
    mine = table.on(d)
    at = dict(zip(map(times.__getitem__, mine), map(table.backward.__getitem__, mine)))
    row: list[bool | None] = [None] * (max(at, default=-1) + 1)  # per slot: an input gradient? None: free
    consume(map(row.__setitem__, at, at.values()))
    slots, pending = [], 0
    for t, backward in enumerate(row):
        if backward is not None:
            pending += backward
        elif pending:
            slots.append(t)
            pending -= 1
    return slots + list(range(len(row), len(row) + pending))


# Rule 2's memory check. Moving one op at a time, the squeeze asks of every free slot before the op's
# own whether its device's peak stays within the bound with the op there; each device's memory over its
# slots is kept as a walk.Slots and a move changes it where it reaches, not recomputed.
# Two facts make that exact. Every slot holds at most one op or weight gradient: a program's slots
# increase (order.py refuses one not after the previous op's), the counted weight gradients take free
# slots, rule 3 gives a device's ops distinct slots, and a move goes to a free slot (one not taken by
# an op met earlier in the pass; the ops met later sit after the moving op's own slot). And every
# device's peak is within the bound when a pass starts (the bound is the highest) and after every move
# (one is made only where it fits), so a move fits where the levels it changes stay within the bound.

def _curve(table: _Ops, times: list[int], d: int, weights: list[int] | None) -> Slots:
    """Device d's memory over its slots: with `weights` (the first pass) the weight gradients counted in
    their slots, each freeing one unit; without (the second), a free slot after an input gradient frees
    one (a deferred release)."""
    mine = table.on(d)
    slots = list(map(times.__getitem__, mine))
    placed = zip(slots, map(table.change.__getitem__, mine), map(table.backward.__getitem__, mine))
    if weights is None:
        return slots_of(placed, max(slots, default=-1) + 1, deferred=True)
    freed = zip(weights, repeat(-1), repeat(False))
    return slots_of(chain(placed, freed), max(slots + weights, default=-1) + 1, deferred=False)


def _eager(table: _Ops, times: list[int], weights: list[list[int]]) -> list[int]:
    """Rule 3: each op as early as its dependencies and its device's previous op allow, in slot order
    (the weight gradients, counted, only wait for the device)."""
    events, owners, _ = _events(table, times, weights)
    free = [0] * table.devices
    start = list(times)
    deps, ops = table.deps, len(table.ops)
    for e in events:
        d = owners[e]
        begin = free[d]
        if e < ops:
            for k in deps[e]:
                if start[k] >= begin:
                    begin = start[k] + 1
            start[e] = begin
        free[d] = begin + 1
    return start


def _final_orders(table: _Ops, times: list[int]) -> tuple[tuple[Op, ...], ...]:
    """Each device's ops in slot order, a free slot running the oldest pending weight gradient of the
    highest chunk (the rest after the last slot, highest chunk first)."""
    orders = []
    ops, backward, chunk = table.ops, table.backward, table.chunk
    weight_of = {n: table.weights[_AT(ops[n])] for n in compress(range(len(ops)), backward)}  # an I's W
    for d in range(table.devices):
        mine = table.on(d)
        at = dict(sorted(zip(map(times.__getitem__, mine), mine)))  # slot -> op, ascending
        pending: list[deque[Op]] = [deque() for _ in range(max(map(chunk.__getitem__, mine), default=-1) + 1)]
        order, waiting, free = [], 0, 0  # waiting: the pending weight gradients, all chunks; free: the
        for t, n in at.items():          # first slot not yet looked at
            if waiting and t > free:  # the free slots before t
                for _ in range(t - free if t - free < waiting else waiting):
                    order.append(next(ws for ws in reversed(pending) if ws).popleft())
                    waiting -= 1
            order.append(ops[n])
            if backward[n]:
                pending[chunk[n]].append(weight_of[n])
                waiting += 1
            free = t + 1
        for ws in reversed(pending):
            order += ws
        orders.append(tuple(order))
    return tuple(orders)
