"""frontend/squeeze.py: the squeeze of V-Half and V-Min keeps every check green, stays within the block's
memory peak, never idles more than the plain block, and reproduces the sail-sg generator's orders also
for odd p and multiples of 3 (tests/reference_zb.py follows its rules)."""
from __future__ import annotations

import copy
import random
from itertools import accumulate, chain

import pytest

import reference_zb as Z
from conftest import SCHEDULES, compile_library
from schedc.driver import compile_source
from schedc.diagnostics import Source
from schedc.frontend import squeeze as S
from schedc.frontend.elaborate import Options

CASES = [(name, p, m) for name in ("v_half", "v_min") for p in (3, 5, 6) for m in (1, p - 1, p, 2 * p + 1)]


def plain(name: str, p: int, m: int):
    """The library file without its `squeeze`: the repeated building block."""
    text = (SCHEDULES / f"{name}.sched").read_text().replace("\nsqueeze\n", "\n")
    return compile_source(Source(f"{name}.sched", text), Options({"p": str(p), "m": str(m)}))


@pytest.mark.parametrize("name,p,m", CASES)
def test_squeeze_keeps_the_checks_the_peak_and_the_reference(name, p, m):
    squeezed, block = compile_library(name, p=p, m=m), plain(name, p, m)
    assert squeezed.ok and block.ok, [d.message for d in squeezed.diagnostics + block.diagnostics]
    assert max(squeezed.stats.peak_memory) <= max(block.stats.peak_memory)
    assert max(squeezed.stats.idle_inside) <= max(block.stats.idle_inside)
    assert squeezed.stats.makespan <= block.stats.makespan
    reference = Z.v_half(p, m) if name == "v_half" else Z.v_min(p, m)
    assert [[(op.kind, op.stage, op.mb) for op in order] for order in squeezed.schedule.orders] == reference


def test_squeeze_moves_only_the_warm_up_and_the_cool_down():
    # p = 4, m = 12: the middle of every device's order is the block's, shifted in time only
    p, m = 4, 12
    squeezed, block = compile_library("v_half", p=p, m=m).schedule, plain("v_half", p, m).schedule
    for got, was in zip(squeezed.orders, block.orders):
        middle = len(was) // 2
        assert [str(op) for op in got[middle - 12:middle + 12]] == [str(op) for op in was[middle - 12:middle + 12]]
        assert [str(op) for op in got[:8]] != [str(op) for op in was[:8]] or got[-8:] != was[-8:]


# Rule 2's memory check is kept per device as ops move (walk.Slots, made by squeeze._curve). Held here
# to the rule read plainly: every trial slot recomputes the device's whole peak.

def _plain_peak(table, times, d, weights):
    """Device d's peak in units over its slots: a forward holds one until, with `weights`, the weight
    gradient in one of those slots frees it, else the first free slot after an input gradient."""
    at = {times[n]: n for n in table.on(d)}
    freed = set(weights or ())
    level = peak = pending = 0
    for t in range(max([*at, *freed], default=-1) + 1):
        if t in at:
            level += table.change[at[t]]
            pending += table.ops[at[t]].kind == "I"
            peak = max(peak, level)
        elif weights is not None:
            level -= t in freed
        elif pending:
            level, pending = level - 1, pending - 1
    return peak


def _plain_pass(table, times, with_weights):
    times = list(times)
    weights = [S._weight_slots(table, times, d) for d in range(table.devices)]
    counted = [w if with_weights else None for w in weights]
    bound = max(_plain_peak(table, times, d, counted[d]) for d in range(table.devices))
    events = sorted([(times[n], table.ops[n].device, 0, n) for n in range(len(table.ops))] +
                    [(t, d, 1, k) for d in range(table.devices) for k, t in enumerate(weights[d])] * with_weights)
    taken = [set() for _ in range(table.devices)]
    phase = 0
    for t, d, is_weight, n in events:
        if not is_weight and n == table.first_backward and phase == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_weights):
            phase += not is_weight and n in table.last_forwards and phase == 1
            taken[d].add(t)
            continue
        if is_weight:
            backwards = sorted(times[i] for i in table.on(d) if table.ops[i].kind == "I")
            moved, first = weights[d], max(backwards[n], weights[d][n - 1] if n else -1) + 1
        else:
            lane = [table.previous[n]] if table.previous[n] is not None else []
            moved, first = times, max([times[k] for k in table.deps[n] + lane], default=-1) + 1
        for slot in [s for s in range(first, t) if s not in taken[d]] + [t]:
            moved[n] = slot
            if slot == t or _plain_peak(table, times, d, counted[d]) <= bound:
                break
        taken[d].add(moved[n])
    if not with_weights:
        weights = [S._weight_slots(table, times, d) for d in range(table.devices)]
    return S._eager(table, times, weights)


def _plain_squeeze(orders, slots, deps, chunk):
    table = S._Ops(orders, deps, chunk)
    times = [t for order, ts in zip(orders, slots) for op, t in zip(order, ts) if op.kind != "W"]
    return S._final_orders(table, _plain_pass(table, _plain_pass(table, times, True), False))


def _squeeze_input(name, p, m, monkeypatch):
    """What elaboration hands the squeeze for the library schedule: orders, slots, deps, chunk index."""
    seen = []
    monkeypatch.setattr(S, "squeeze_orders", lambda *args: seen.append(args) or args[0])
    compile_library(name, p=p, m=m)
    monkeypatch.undo()
    return seen[0]


@pytest.mark.parametrize("name", ["v_half", "v_min"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (3, 4), (4, 9), (5, 2), (6, 13), (7, 7)])
def test_the_kept_memory_check_squeezes_as_the_whole_peak_recomputed(name, p, m, monkeypatch):
    orders, slots, deps, chunk = _squeeze_input(name, p, m, monkeypatch)
    assert S.squeeze_orders(orders, slots, deps, chunk) == _plain_squeeze(orders, slots, deps, chunk)
    # and with idle slots added at random into the programs' (other warm-ups, cool-downs and bounds)
    rng = random.Random(p * 100 + m)
    for _ in range(4):
        spread = [list(accumulate(t - s + rng.choice((0, 0, 0, 1, 2)) for s, t in zip([-1] + ts, ts)))
                  for ts in slots]
        spread = [[t - 1 for t in ts] for ts in spread]
        got = S.squeeze_orders(orders, spread, deps, chunk)
        assert got == _plain_squeeze(orders, spread, deps, chunk)
        assert sorted(map(str, chain(*got))) == sorted(map(str, chain(*orders)))


# The squeeze table's dependency lists are looked up once per class of ops (squeeze.dependency_lists).
# Held here to keys_of asked of every op, on what elaboration hands the squeeze and on the same ops with
# other backward choices: a random part of the (pipe, stage, mb) split, all of them, none, or a plain
# split or unsplit backward.

def _keys_of_lists(ops, deps):
    index = {op.key: n for n, op in enumerate(ops)}
    return [[index[key] for key in deps.keys_of(op) if key in index] for op in ops]


@pytest.mark.parametrize("name", ["v_half", "v_min"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 3), (3, 5), (4, 4), (5, 11), (6, 2), (7, 9), (8, 16), (16, 20)])
def test_the_dependency_lists_are_keys_of_asked_per_op(name, p, m, monkeypatch):
    orders, _, deps, _ = _squeeze_input(name, p, m, monkeypatch)
    ops = [op for order in orders for op in order if op.kind != "W"]
    assert S.dependency_lists(ops, deps) == _keys_of_lists(ops, deps)
    rng = random.Random(p * 1000 + m)
    every = sorted({(op.pipe, op.stage, op.mb) for op in ops})
    for split in (frozenset(rng.sample(every, len(every) // 2)), frozenset(every), frozenset(), True, False):
        other = copy.copy(deps)
        other.split = split
        assert S.dependency_lists(ops, other) == _keys_of_lists(ops, other)
        shuffled = rng.sample(ops, len(ops))
        assert S.dependency_lists(shuffled, other) == _keys_of_lists(shuffled, other)
