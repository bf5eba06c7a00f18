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

from itertools import accumulate, repeat

from ..ir import Op, consume
from ..ops import GRADIENT, OpKind

_F, _B, _I, _W = OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value


class _Ops:
    """The ops being squeezed, weight gradients aside, by index: device, lane (kind, pipe, chunk),
    dependencies and the lane's previous op."""

    def __init__(self, orders: tuple[tuple[Op, ...], ...], deps, chunk: dict[tuple[int, int], int]):
        self.ops = [op for order in orders for op in order if op.kind != _W]
        self.weights = {(op.stage, op.mb, op.pipe): op for order in orders for op in order if op.kind == _W}
        self.devices = len(orders)
        index = {op.key: n for n, op in enumerate(self.ops)}
        self.deps = [[index[k] for k in deps.keys_of(op) if k in index] for op in self.ops]
        self.chunk = [chunk[(op.pipe, op.stage)] for op in self.ops]
        self.change = [(op.kind == _F) - (op.kind == _B) for op in self.ops]  # memory; W's come counted
        lanes: dict[tuple, int] = {}
        self.previous = []
        for n, op in enumerate(self.ops):
            lane = (op.device, op.kind, op.pipe, self.chunk[n])
            self.previous.append(lanes.get(lane))
            lanes[lane] = n
        # where the steady state begins (stage 0's first backward) and the last forward of chunk 0
        # of each device, the first of which met after it ends the steady state (`lanes` holds each
        # lane's last op)
        first_stage = [n for n, op in enumerate(self.ops) if op.stage == 0 and op.pipe == 0]
        self.first_backward = next((n for n in first_stage if self.ops[n].kind in GRADIENT), None)
        self.last_forwards = {n for (_, kind, _, c), n in lanes.items() if kind == _F and c == 0}
        self.by_device: list[list[int]] = [[] for _ in orders]
        for n, op in enumerate(self.ops):
            self.by_device[op.device].append(n)

    def on(self, device: int) -> list[int]:
        return self.by_device[device]


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
    weights = [_weight_slots(table, times, d) for d in range(table.devices)]
    bound = max(_peak(table, times, d, weights[d] if with_weights else None) for d in range(table.devices))
    events = [(times[n], table.ops[n].device, 0, n) for n in range(len(table.ops))]
    if with_weights:
        events += [(t, d, 1, k) for d in range(table.devices) for k, t in enumerate(weights[d])]
    taken: list[set[int]] = [set() for _ in range(table.devices)]
    phase = 0  # 0: warm-up, 1: steady state, 2: cool-down
    for t, d, is_weight, n in sorted(events):
        if not is_weight and n == table.first_backward and phase == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_weights):
            phase += not is_weight and n in table.last_forwards and phase == 1
            taken[d].add(t)
            continue
        place = _place_weight if is_weight else _place_op
        taken[d].add(place(table, times, weights, d, n, t, taken[d], bound, with_weights))
    if not with_weights:  # rule 1 again, for the moved ops
        weights = [_weight_slots(table, times, d) for d in range(table.devices)]
    return _eager(table, times, weights)


def _place_op(table, times, weights, d, n, t, taken, bound, with_weights) -> int:
    """Rule 2 for an op: after its dependencies and its lane's previous op."""
    before = [times[k] for k in table.deps[n]]
    if table.previous[n] is not None:
        before.append(times[table.previous[n]])
    counted = weights[d] if with_weights else None

    def put(slot: int) -> None:
        times[n] = slot
    return _earliest(max(before, default=-1) + 1, t, taken, put, lambda: _peak(table, times, d, counted) <= bound)


def _place_weight(table, times, weights, d, k, t, taken, bound, with_weights) -> int:
    """Rule 2 for the k-th weight gradient of device d: after the device's k-th input gradient and
    its weight gradient k-1."""
    backwards = sorted(times[n] for n in table.on(d) if table.ops[n].kind == _I)
    own = weights[d]

    def put(slot: int) -> None:
        own[k] = slot
    first = max(backwards[k], own[k - 1] if k else -1) + 1
    return _earliest(first, t, taken, put, lambda: _peak(table, times, d, own) <= bound)


def _earliest(first: int, t: int, taken: set[int], put, fits) -> int:
    """The earliest free slot from `first` on, before `t`, where the op `put` there `fits` the
    memory bound; else `t` (the op stays)."""
    for slot in range(first, t):
        if slot not in taken:
            put(slot)
            if fits():
                return slot
    put(t)
    return t


def _weight_slots(table: _Ops, times: list[int], d: int) -> list[int]:
    """Rule 1: the slots of device d's weight gradients, counted, in the free slots."""
    at = {times[n]: table.ops[n].kind for n in table.on(d)}
    slots, pending = [], 0
    last = max(at, default=-1)
    for t in range(last + 1):
        if t in at:
            pending += at[t] == _I
        elif pending:
            slots.append(t)
            pending -= 1
    return slots + list(range(last + 1, last + 1 + pending))


def _peak(table: _Ops, times: list[int], d: int, weights: list[int] | None) -> int:
    """Device d's peak memory in units over its slots: a forward holds one until its W (counted in
    `weights`, or without them the first free slot after its input gradient) or its B frees it."""
    mine = table.on(d)
    slots = [times[n] for n in mine]
    size = max(slots + (weights or []), default=-1) + 1
    change = [0] * size  # the level's change in each slot, None where no op runs
    if weights is not None:
        consume(map(change.__setitem__, slots, [table.change[n] for n in mine]))
        consume(map(change.__setitem__, weights, repeat(-1)))
        return max(0, max(accumulate(change), default=0))
    change = [None] * size
    consume(map(change.__setitem__, slots, [table.change[n] for n in mine]))
    backward = {times[n] for n in mine if table.ops[n].kind == _I}
    level = peak = pending = 0
    for t, step in enumerate(change):
        if step is None:
            if pending:
                level, pending = level - 1, pending - 1
        else:
            level += step
            pending += t in backward
            peak = max(peak, level)
    return peak


def _eager(table: _Ops, times: list[int], weights: list[list[int]]) -> list[int]:
    """Rule 3: each op as early as its dependencies and its device's previous op allow, in slot order
    (the weight gradients, counted, only wait for the device)."""
    events = [(times[n], table.ops[n].device, 0, n) for n in range(len(table.ops))]
    events += [(t, d, 1, k) for d in range(table.devices) for k, t in enumerate(weights[d])]
    free = [0] * table.devices
    start = list(times)
    for _, d, is_weight, n in sorted(events):
        begin = free[d] if is_weight else max([free[d]] + [start[k] + 1 for k in table.deps[n]])
        if not is_weight:
            start[n] = begin
        free[d] = begin + 1
    return start


def _final_orders(table: _Ops, times: list[int]) -> tuple[tuple[Op, ...], ...]:
    """Each device's ops in slot order, a free slot running the oldest pending weight gradient of the
    highest chunk (the rest after the last slot, highest chunk first)."""
    orders = []
    for d in range(table.devices):
        mine = sorted((times[n], n) for n in table.on(d))
        at = dict(mine)
        pending: dict[int, list[Op]] = {}
        order = []
        for t in range(max(at, default=-1) + 1):
            n = at.get(t)
            if n is not None:
                op = table.ops[n]
                order.append(op)
                if op.kind == _I:
                    pending.setdefault(table.chunk[n], []).append(table.weights[(op.stage, op.mb, op.pipe)])
            elif any(pending.values()):
                order.append(pending[max(c for c, ws in pending.items() if ws)].pop(0))
        for c in sorted(pending, reverse=True):
            order += pending[c]
        orders.append(tuple(order))
    return tuple(orders)
