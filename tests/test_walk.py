"""walk.py: the one activation walk. Each fast form (peak, first_peak, changes_along, the kept Slots of the
squeeze, with and without deferred releases) against the plain loop written out here, on random changes
and random moves."""
from __future__ import annotations

import random

import pytest

from schedc import walk
from schedc.ir import Op


def _plain_levels(changes, start=0):
    out, level = [], start
    for change in changes:
        level += change
        out.append(level)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_levels_peak_and_first_peak_are_the_plain_loop(seed):
    rng = random.Random(seed)
    changes = [rng.choice((1, 1, -1, 0.5, -0.5, 2.25)) for _ in range(rng.randrange(0, 40))]
    start = rng.choice((0, 0.0, 3))
    assert walk.levels(changes, start) == _plain_levels(changes, start)
    assert walk.peak(changes, start) == max([start, *_plain_levels(changes, start)])
    best, at = 0, None
    for n, level in enumerate(_plain_levels(changes)):
        if level > best:
            best, at = level, n
    assert walk.first_peak(changes) == (best, at)


def test_the_unit_rule_and_the_changes_of_an_order():
    assert [walk.unit_change(k) for k in ("F", "B", "I", "W", "R", "g")] == [1, -1, 0, -1, 0, 0]
    order = [Op("F", 0, 0), Op("F", 1, 0), Op("g", 0, 0), Op("B", 1, 0), Op("F", 5, 1)]
    table = {"F": (1.0, 2.0), "B": (-1.0, -2.0)}
    assert walk.changes_along(order, table) == [1.0, 2.0, -2.0]  # stage 5 is outside the table
    assert walk.peak(walk.changes_along(order, table)) == walk.peak_along(order, table) == 3.0


@pytest.mark.parametrize("seed", range(10))
def test_the_peak_along_an_order_is_the_peak_of_its_changes(seed):
    rng = random.Random(seed)
    table = {"F": tuple(rng.choice((1.0, 0.5, 2.0)) for _ in range(4)), "B": (-1.0, -0.5, -2.0, -1.0), "W": (-0.25,)}
    order = [Op(rng.choice("FBWIg"), rng.randrange(0, 5), n) for n in range(rng.randrange(0, 60))]
    assert walk.peak_along(order, table, 0.0) == walk.peak(walk.changes_along(order, table), 0.0)


def _plain_slot_peak(slots: walk.Slots) -> float:
    levels = walk.slot_levels(slots.change, slots.backward, slots.deferred)
    return max([0, *(level for level, step in zip(levels, slots.change) if step is not None)])


def _plain_earliest(slots: walk.Slots, first, t, change, backward, taken, bound):
    """The first slot where the op fits, each trial the whole walk again."""
    for slot in range(first, t):
        if slot in taken:
            continue
        trial = walk.Slots(list(slots.change), list(slots.backward), slots.deferred)
        trial.change[slot], trial.backward[slot] = change, backward
        trial.change[t], trial.backward[t] = None, False
        if _plain_slot_peak(trial) <= bound:
            return slot
    return t


def _random_slots(rng, deferred):
    size = rng.randrange(1, 30)
    placed = [(x, rng.choice((1, 1, -1, 0) if deferred else (1, 1, -1, 0, -1)), rng.random() < 0.3)
              for x in range(size) if rng.random() < 0.5]
    return walk.slots_of(placed, size, deferred)


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_the_kept_slots_move_as_the_walk_redone(deferred, seed):
    _moves(deferred, seed)


@pytest.mark.parametrize("deferred", [False, True])
def test_the_random_moves_do_move(deferred):
    assert sum(_moves(deferred, seed) for seed in range(30)) >= 30


def _moves(deferred, seed) -> int:
    """Random moves of random slots, each checked against the walk redone; how many moved."""
    rng = random.Random(seed)
    slots = _random_slots(rng, deferred)
    assert slots.level == walk.slot_levels(slots.change, slots.backward, deferred)
    assert slots.peak == _plain_slot_peak(slots)
    bound = slots.peak + rng.choice((0, 0, 1, 2))
    moved = 0
    for _ in range(40):
        ops = [x for x, step in enumerate(slots.change) if step is not None]
        if not ops:
            break
        t = rng.choice(ops)
        first = rng.randrange(0, t + 1)
        taken = {x for x in ops if x < t} | {x for x in range(t) if rng.random() < 0.2}
        change, backward = slots.change[t], slots.backward[t]
        want = _plain_earliest(slots, first, t, change, backward, taken, bound)
        assert slots.earliest(first, t, change, backward, taken, bound) == want
        if want != t:
            slots.move(want, t, change, backward)
            moved += 1
        assert slots.level == walk.slot_levels(slots.change, slots.backward, deferred)
        assert _plain_slot_peak(slots) <= bound
        if not deferred:
            assert slots.backwards == [x for x, back in enumerate(slots.backward) if back]
    return moved
