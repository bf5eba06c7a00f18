"""The activation walk: one device's memory along a sequence of changes, each adding (+) or freeing (-)
what its op holds. Every count of activations in schedc walks here: an order's ops (memory.peak_memory,
costmodel.bytes.layer_levels, the synthesis's local search), a timeline's allocations and releases
(memory.peaks and the memory check), the in-flight count of `order greedy` and the squeeze's slots.

    F F B F B B              changes along the order (changes_along, unit_change: a forward holds one
    +1 +1 -1 +1 -1 -1        activation until its B or W frees it)
    1  2  1  2  1  0         levels; peak 2

The plain form is `levels`; `peak`, `peak_along` and `Slots` are its fast forms (one loop in C; one loop
over the ops, no list; a walk kept while ops move between slots), each held to it by tests/test_walk.py.
"""
from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate

from .ops import RELEASES, OpKind

_F = OpKind.F.value


def unit_change(kind: str) -> int:
    """What an op of `kind` does to its device's activations, in activations: a forward holds one, its
    release (B, or W after a split backward) frees it."""
    return 1 if kind == _F else -1 if kind in RELEASES else 0


def changes_along(order: Iterable, table: Mapping[str, Sequence]) -> list:
    """The changes of an order's ops that change memory: table[kind][stage] for each op whose kind the
    table names and whose stage it holds, in program order."""
    out = []
    for op in order:
        row = table.get(op.kind)
        if row is not None and 0 <= op.stage < len(row):
            out.append(row[op.stage])
    return out


def levels(changes: Iterable, start: float = 0) -> list:
    """The plain form: the level after each change, from `start`."""
    return list(accumulate(changes, initial=start))[1:]


def peak(changes: Iterable, start: float = 0) -> float:
    """The highest level, `start` at least: max(start, *levels(changes, start)) in one pass."""
    return max(accumulate(changes, initial=start))


def peak_along(order: Iterable, table: Mapping[str, Sequence], start: float = 0) -> float:
    """peak(changes_along(order, table), start) in one loop over the ops, no list made (an order of 10^4
    ops is walked once per compile and per structure of tune)."""
    alive = high = start
    get = table.get
    for op in order:
        row = get(op.kind)
        if row is not None and 0 <= op.stage < len(row):
            alive += row[op.stage]
            if alive > high:
                high = alive
    return high


def first_peak(changes: Iterable) -> tuple[float, int | None]:
    """The highest level above 0 and the index of the change that first reaches it (None: none above 0)."""
    best, at = 0, None
    for n, level in enumerate(accumulate(changes)):
        if level > best:
            best, at = level, n
    return best, at


# The squeeze's slots: a walk kept while ops move --------------------------------------------------------

def slot_levels(change: Sequence, backward: Sequence[bool], deferred: bool) -> list:
    """The plain form of Slots: the level after each slot. A slot holds a change or None (free); with
    `deferred`, a free slot runs one pending release (each slot marked `backward` adds one, which frees
    one unit when it runs: a W after its input gradient)."""
    out, level, pending = [], 0, 0
    for step, back in zip(change, backward):
        if step is None:
            if deferred and pending:
                level, pending = level - 1, pending - 1
        else:
            level, pending = level + step, pending + back
        out.append(level)
    return out


class Slots:
    """One device's memory over numbered slots while ops move to earlier free slots (the squeeze): the
    change each slot holds (None: free), its level after it, `peak` the highest level (0 at least).
    `earliest` finds where a moving op fits under a bound, `move` moves it. Two fast paths, each equal to
    slot_levels walked again (tests/test_walk.py): without deferred releases a move from t to s changes
    the levels in [s, t) by the op's change alone, and where an op fits comes from one scan back from t;
    with them a move rewalks from s until, at or after t, the state is one it had. Both need every slot
    to hold one change at most and the levels to be within the bound before a move (the squeeze's
    facts). `backwards`: the slots marked backward, ascending, kept without deferred releases."""

    def __init__(self, change: list, backward: list[bool], deferred: bool):
        self.change, self.backward, self.deferred = change, backward, deferred
        size = len(change)
        self.level, self.pending = [0] * size, [0] * size
        if deferred:
            self.peak = self._walk(0, None)
        else:
            self.level = list(accumulate(map(_or_zero, change)))
            self.peak = max(0, max(self.level, default=0))
            self.backwards = [x for x in range(size) if backward[x]]

    def earliest(self, first: int, t: int, change: int, backward: bool, taken: set[int], bound: int) -> int:
        """The earliest slot from `first` on, before `t`, not in `taken`, where the op at t fits with
        every level within `bound`; else `t`."""
        if self.deferred:
            return next((slot for slot in range(first, t) if slot not in taken and
                         self._fits(slot, t, change, backward, bound)), t)
        if change > 0:  # it fits after the last level in [first, t) that its change would raise too high
            level = self.level
            first = next((x + 1 for x in range(t - 1, first - 1, -1) if level[x] + change > bound), first)
        return next((slot for slot in range(first, t) if slot not in taken), t)

    def move(self, slot: int, t: int, change: int, backward: bool) -> None:
        """The op at t, of `change` (and marked `backward`), to the free slot `slot` before it."""
        self.change[slot], self.backward[slot] = change, backward
        self.change[t], self.backward[t] = None, False
        if self.deferred:
            self._walk(slot, t)
            return
        level = self.level
        for x in range(slot, t) if change else ():
            level[x] += change
        if backward:
            self.backwards.remove(t)
            insort(self.backwards, slot)

    def _walk(self, slot: int, t: int | None) -> int:
        """Walk from `slot` on, writing each slot's state, until past `t` the state is one it had (None:
        to the end); returns the highest level met at an op's slot (0 at least)."""
        level, pending = (self.level[slot - 1], self.pending[slot - 1]) if slot else (0, 0)
        high = 0
        for x in range(slot, len(self.change)):
            step = self.change[x]
            if step is None:
                if pending:
                    level, pending = level - 1, pending - 1
            else:
                level += step
                pending += self.backward[x]
                high = max(high, level)
            if t is not None and x >= t and self.level[x] == level and self.pending[x] == pending:
                break
            self.level[x], self.pending[x] = level, pending
        return high

    def _fits(self, slot: int, t: int, change: int, backward: bool, bound: int) -> bool:
        """Whether the walk with the op moved from `t` to `slot` keeps every level at an op's slot within
        the bound, up to where it is back in a state it had."""
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


def _or_zero(step):
    return 0 if step is None else step


def slots_of(placed: Iterable[tuple[int, int, bool]], size: int, deferred: bool) -> Slots:
    """Slots from (slot, change, backward) of each op placed, over `size` slots."""
    change: list = [None] * size
    backward = [False] * size
    for slot, step, back in placed:
        change[slot], backward[slot] = step, back
    return Slots(change, backward, deferred)

