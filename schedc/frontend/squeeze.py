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

from bisect import insort
from collections import deque
from itertools import accumulate, repeat
from operator import attrgetter

from ..ir import OP_KEY, Op, consume
from ..ops import GRADIENT, OpKind

_F, _B, _I, _W = OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value
_AT = attrgetter("stage", "mb", "pipe")


class _Ops:
    """The ops being squeezed, weight gradients aside, by index: device, lane (kind, pipe, chunk),
    dependencies and the lane's previous op."""

    def __init__(self, orders: tuple[tuple[Op, ...], ...], deps, chunk: dict[tuple[int, int], int]):
        self.ops = [op for order in orders for op in order if op.kind != _W]
        weights = [op for order in orders for op in order if op.kind == _W]
        self.weights = dict(zip(map(_AT, weights), weights))  # (stage, mb, pipe) -> W
        self.devices = len(orders)
        self.device = [op.device for op in self.ops]
        index = dict(zip(map(OP_KEY, self.ops), range(len(self.ops))))
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
    curves = [_Counted(table, times, d, weights[d]) if with_weights else _Released(table, times, d)
              for d in range(table.devices)]
    bound = max(curve.peak for curve in curves)
    events = list(zip(times, table.device, repeat(0), range(len(table.ops))))
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
        taken[d].add(place(table, times, weights[d], n, t, taken[d], curves[d], bound))
    if not with_weights:  # rule 1 again, for the moved ops
        weights = [_weight_slots(table, times, d) for d in range(table.devices)]
    return _eager(table, times, weights)


def _place_op(table, times, weights, n, t, taken, curve, bound) -> int:
    """Rule 2 for an op: after its dependencies and its lane's previous op."""
    before = [times[k] for k in table.deps[n]]
    if table.previous[n] is not None:
        before.append(times[table.previous[n]])
    backward = table.ops[n].kind == _I
    slot = curve.earliest(max(before, default=-1) + 1, t, table.change[n], backward, taken, bound)
    if slot != t:
        curve.move(slot, t, table.change[n], backward)
        times[n] = slot
    return slot


def _place_weight(table, times, own, k, t, taken, curve, bound) -> int:
    """Rule 2 for the k-th weight gradient of device d (its slots `own`): after the device's k-th input
    gradient and its weight gradient k-1."""
    first = max(curve.backwards[k], own[k - 1] if k else -1) + 1
    slot = curve.earliest(first, t, -1, False, taken, bound)
    if slot != t:
        curve.move(slot, t, -1, False)
        own[k] = slot
    return slot


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


# Rule 2's memory check. Moving one op at a time, the squeeze asks of every free slot before the op's
# own whether its device's peak stays within the bound with the op there; each device's memory over its
# slots is kept and a move changes it where it reaches, not recomputed (_Counted, _Released).
# Two facts make that exact. Every slot holds at most one op or weight gradient: a program's slots
# increase (order.py refuses one not after the previous op's), the counted weight gradients take free
# slots, rule 3 gives a device's ops distinct slots, and a move goes to a free slot (one not taken by
# an op met earlier in the pass; the ops met later sit after the moving op's own slot). And every
# device's peak is within the bound when a pass starts (the bound is the highest) and after every move
# (one is made only where it fits), so a move fits where the levels it changes stay within the bound.

class _Counted:
    """Device d's memory with the weight gradients counted in their slots (the first pass): its level
    after each slot, the sum of the changes up to it (a forward +1, a backward or weight gradient -1).
    An op of change c moved from slot t to s changes the levels in [s, t) by c alone. Also the slots
    of its input gradients, in order (the k-th weight gradient follows the k-th)."""

    def __init__(self, table: _Ops, times: list[int], d: int, weights: list[int]):
        mine = table.on(d)
        slots = [times[n] for n in mine]
        change = [0] * (max(slots + weights, default=-1) + 1)
        consume(map(change.__setitem__, slots, [table.change[n] for n in mine]))
        consume(map(change.__setitem__, weights, repeat(-1)))
        self.levels = list(accumulate(change))
        self.peak = max(0, max(self.levels, default=0))
        self.backwards = sorted(times[n] for n in mine if table.ops[n].kind == _I)

    def earliest(self, first: int, t: int, change: int, backward: bool, taken: set[int], bound: int) -> int:
        """The earliest free slot from `first` on, before `t`, where the op fits; else `t`. It fits where
        no level from there to `t` passes the bound once raised by `change`."""
        levels = self.levels
        if change > 0:
            first = next((x + 1 for x in range(t - 1, first - 1, -1) if levels[x] + change > bound), first)
        return next((slot for slot in range(first, t) if slot not in taken), t)

    def move(self, slot: int, t: int, change: int, backward: bool) -> None:
        levels = self.levels
        for x in range(slot, t) if change else ():
            levels[x] += change
        if backward:
            self.backwards.remove(t)
            insort(self.backwards, slot)


class _Released:
    """Device d's memory without the weight gradients (the second pass): a free slot after an input
    gradient frees one unit. Kept per slot: the op's change (None where the slot is free), whether it
    is an input gradient, and the level and the pending input gradients after the slot. An op moved
    from slot t to s changes the walk from s on until, at or after t, it is back in a state it had."""

    def __init__(self, table: _Ops, times: list[int], d: int):
        mine = table.on(d)
        size = max((times[n] for n in mine), default=-1) + 1
        self.change: list[int | None] = [None] * size
        self.backward = [False] * size
        for n in mine:
            self.change[times[n]] = table.change[n]
            self.backward[times[n]] = table.ops[n].kind == _I
        self.level, self.pending = [0] * size, [0] * size
        self.peak = self._walk(0, size)

    def _walk(self, slot: int, t: int | None) -> int:
        """Walk from `slot` on, writing each slot's state, until past `t` the state is one it had
        (None: to the end); returns the highest level met at an op's slot (0 at least)."""
        level, pending = (self.level[slot - 1], self.pending[slot - 1]) if slot else (0, 0)
        peak = 0
        for x in range(slot, len(self.change)):
            step = self.change[x]
            if step is None:
                if pending:
                    level, pending = level - 1, pending - 1
            else:
                level += step
                pending += self.backward[x]
                peak = max(peak, level)
            if t is not None and x >= t and self.level[x] == level and self.pending[x] == pending:
                break
            self.level[x], self.pending[x] = level, pending
        return peak

    def earliest(self, first: int, t: int, change: int, backward: bool, taken: set[int], bound: int) -> int:
        """The earliest free slot from `first` on, before `t`, where the op fits; else `t`."""
        return next((slot for slot in range(first, t) if slot not in taken and
                     self._fits(slot, t, change, backward, bound)), t)

    def _fits(self, slot: int, t: int, change: int, backward: bool, bound: int) -> bool:
        """Whether the walk with the op moved from `t` to `slot` keeps every level at an op's slot
        within the bound, up to where it is back in a state it had."""
        level, pending = (self.level[slot - 1], self.pending[slot - 1]) if slot else (0, 0)
        level += change
        pending += backward
        if level > bound:
            return False
        for x in range(slot + 1, len(self.change)):
            step = None if x == t else self.change[x]
            if step is None:
                if pending:
                    level, pending = level - 1, pending - 1
            else:
                level += step
                pending += self.backward[x]
                if level > bound:
                    return False
            if x >= t and self.level[x] == level and self.pending[x] == pending:
                return True
        return True

    def move(self, slot: int, t: int, change: int, backward: bool) -> None:
        self.change[slot], self.backward[slot] = change, backward
        self.change[t], self.backward[t] = None, False
        self._walk(slot, t)


def _eager(table: _Ops, times: list[int], weights: list[list[int]]) -> list[int]:
    """Rule 3: each op as early as its dependencies and its device's previous op allow, in slot order
    (the weight gradients, counted, only wait for the device)."""
    events = list(zip(times, table.device, repeat(0), range(len(table.ops))))
    events += [(t, d, 1, k) for d in range(table.devices) for k, t in enumerate(weights[d])]
    free = [0] * table.devices
    start = list(times)
    deps = table.deps
    for _, d, is_weight, n in sorted(events):
        begin = free[d]
        if not is_weight:
            for k in deps[n]:
                if start[k] >= begin:
                    begin = start[k] + 1
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
        pending: dict[int, deque[Op]] = {}
        order, waiting = [], 0  # waiting: the pending weight gradients, all chunks
        for t in range(max(at, default=-1) + 1):
            n = at.get(t)
            if n is not None:
                op = table.ops[n]
                order.append(op)
                if op.kind == _I:
                    pending.setdefault(table.chunk[n], deque()).append(table.weights[_AT(op)])
                    waiting += 1
            elif waiting:
                order.append(pending[max(c for c, ws in pending.items() if ws)].popleft())
                waiting -= 1
        for c in sorted(pending, reverse=True):
            order += pending[c]
        orders.append(tuple(order))
    return tuple(orders)
