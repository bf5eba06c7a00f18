"""Self-test of tests/reference_zb.py: the reference orders are valid schedules, and with unit costs
a small simulator written here (not schedc's) gives the published bubbles and peak memories."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

import reference_orders as R
import reference_zb as Z

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "torch" / "dualpipev_4rank_10mb.csv"
UNIT = dict(F=1, B=2, I=1, W=1, FB=3)          # F = I = W, B = I + W, F&B = F + B
SKEWED = dict(F=2, B=3, I=2, W=1, FB=4)        # F&B cheaper than F + B, W smaller than I


# --------------------------------------------------------------------------------------------
# A tiny simulator: units in each rank's order, as early as their inputs allow, no latency
# --------------------------------------------------------------------------------------------

def _pipe(op):
    return op[3] if len(op) > 3 else None


def _done_key(op):
    """B and I both carry the gradient on: either one is 'the backward' of (stage, mb)."""
    return ("BWD" if op[0] in Z.BACKWARDS else op[0],) + tuple(op[1:])


def _inputs(op, num_stages):
    kind, s, i, pipe = op[0], op[1], op[2], _pipe(op)
    tail = (pipe,) if pipe is not None else ()
    if kind == "F":
        return [] if s == 0 else [("F", s - 1, i) + tail]
    if kind in Z.BACKWARDS:
        return [("F", s, i) + tail] + ([("BWD", s + 1, i) + tail] if s < num_stages - 1 else [])
    if kind == "W":
        return [("BWD", s, i) + tail]
    raise ValueError(op)


def simulate(orders, num_stages, cost):
    """Start and end of every unit: a unit starts when its rank is free and every input of both
    its halves has ended.  Returns (per-rank list of (start, end, unit)); raises on a deadlock."""
    end = {}
    pos = [0] * len(orders)
    free = [0] * len(orders)
    timeline = [[] for _ in orders]
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r, units in enumerate(orders):
            while pos[r] < len(units):
                unit = units[pos[r]]
                needs = [d for h in Z.halves(unit) for d in _inputs(h, num_stages)]
                if not all(d in end for d in needs):
                    break
                start = max([free[r]] + [end[d] for d in needs])
                free[r] = start + (cost["FB"] if Z.is_overlap(unit) else cost[unit[0]])
                for h in Z.halves(unit):
                    end[_done_key(h)] = free[r]
                timeline[r].append((start, free[r], unit))
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            stuck = {r: orders[r][pos[r]] for r in range(len(orders)) if pos[r] < len(orders[r])}
            raise AssertionError(f"deadlock; next units per rank: {stuck}")
    return timeline


def bubble(orders, num_stages, cost):
    """Largest idle time of a rank between time 0 and the makespan (DualPipe's 'bubble')."""
    t = simulate(orders, num_stages, cost)
    makespan = max(row[-1][1] for row in t)
    return max(makespan - sum(e - s for s, e, _ in row) for row in t)


def steady_bubble(orders, num_stages, cost):
    """Largest idle time of a rank between its own first and last unit."""
    t = simulate(orders, num_stages, cost)
    return max(row[-1][1] - row[0][0] - sum(e - s for s, e, _ in row) for row in t)


def peak_activations(orders, num_stages, cost):
    """Peak per rank of live forward activations (one per F, from its start to the end of the B,
    or of the W when the backward is split)."""
    peaks = []
    for row in simulate(orders, num_stages, cost):
        events = []
        for start, end, unit in row:
            for op in Z.halves(unit):
                if op[0] == "F":
                    events.append((start, 1))
                elif op[0] in ("B", "W"):
                    events.append((end, -1))
        level = peak = 0
        for _, delta in sorted(events):
            level += delta
            peak = max(peak, level)
        peaks.append(peak)
    return max(peaks)


# --------------------------------------------------------------------------------------------
# Validity of every reference
# --------------------------------------------------------------------------------------------

def check_valid(orders, num_stages, rank_of, mbs_of):
    """Every (stage, mb[, pipe]) has one F and either one B or one I and one W, on the rank of the
    stage; W after its I on that rank; overlapped pairs are a forward and a backward; the replay
    completes."""
    seen = Counter()
    for r, units in enumerate(orders):
        position = {}
        for k, unit in enumerate(units):
            if Z.is_overlap(unit):
                assert len(unit) == 2 and unit[0][0] == "F" and unit[1][0] in Z.BACKWARDS, unit
            for op in Z.halves(unit):
                assert rank_of(op[1], _pipe(op)) == r, (op, r)
                seen[op] += 1
                position[op] = k
        for op, k in position.items():
            if op[0] == "W":
                assert position[("I",) + op[1:]] < k, op
    assert all(c == 1 for c in seen.values())
    keys = {op[1:] for op in seen}
    expected = {(s, i) + ((pipe,) if pipe else ()) for pipe, mbs in mbs_of.items()
                for s in range(num_stages) for i in mbs}
    assert keys == expected
    for key in keys:
        assert ("F",) + key in seen
        full, split = ("B",) + key in seen, ("I",) + key in seen
        assert full != split and split == (("W",) + key in seen), key
    simulate(orders, num_stages, UNIT)


SIZES = [(p, m) for p in (2, 4, 8) for m in sorted({p, p + 1, 2 * p - 1, 2 * p, 3 * p + 1})]


@pytest.mark.parametrize("p,m", SIZES)
def test_single_stage_references_are_valid(p, m):
    check_valid(Z.zb_h2(p, m), p, Z.placement_single(p), {None: range(m)})
    if Z.torch_rounds_allow(p, m):
        check_valid(Z.zb_h1(p, m), p, Z.placement_single(p), {None: range(m)})


@pytest.mark.parametrize("p,m", SIZES)
def test_v_shape_references_are_valid(p, m):
    for orders in (Z.zbv(p, m), Z.v_half(p, m), Z.v_min(p, m), Z.v_half_block(p, m), Z.v_min_block(p, m)):
        check_valid(orders, 2 * p, Z.placement_v(p), {None: range(m)})
    if m >= 2 * p:
        check_valid(Z.dualpipev(p, m), 2 * p, Z.placement_v(p), {None: range(m)})


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("mult", [1, 2])
def test_looped_references_are_valid(p, v, mult):
    m = mult * p
    for orders in (Z.interleaved_zb(p, v, m), Z.looped_bfs(p, v, m)):
        check_valid(orders, p * v, Z.placement_loop(p), {None: range(m)})


@pytest.mark.parametrize("p,m", [(2, 4), (2, 6), (4, 8), (4, 10), (4, 14), (8, 16), (8, 20)])
def test_dualpipe_reference_is_valid(p, m):
    check_valid(Z.dualpipe(p, m), p, Z.placement_dual(p), {"down": range(m // 2), "up": range(m // 2, m)})


def test_torch_artifact_is_torchs_own_dualpipev_order():
    from torch.distributed.pipelining.schedules import _Action
    rows = [[_Action.from_str(c) for c in line.split(",")] for line in FIXTURE.read_text().splitlines()]
    assert Z.convert_torch_order(dict(enumerate(rows))) == Z.dualpipev(4, 10)
    assert Z.torch_csv("ScheduleDualPipeV", 4, 2, 10) == FIXTURE.read_text()


def test_zb_h1_is_1f1b_with_deferred_weights():
    # dropping the W's and reading I as B gives Megatron's 1F1B order on every rank
    p, m = 4, 8
    for got, ref in zip(Z.zb_h1(p, m), R.one_f_one_b(p, m)):
        assert [("B",) + op[1:] if op[0] == "I" else op for op in got if op[0] != "W"] == ref


def test_shapes():
    assert Z.format_order(Z.zb_h2(4, 12)[0]) == " ".join(
        [f"F0.{i}" for i in range(7)] + [f"I0.{k} F0.{7 + k}" for k in range(5)] + ["I0.5"]
        + [f"W0.{k} I0.{6 + k}" for k in range(6)] + [f"W0.{k}" for k in range(6, 12)])
    # DualPipe rank 0 of p=4, m=8 (down 0..3, up 4..7): steps 1-8 of dualpipe.py
    assert Z.format_order(Z.dualpipe(4, 8)[0]) == (
        "F0.0d F0.1d F0.2d F3.4u I3.4u W3.4u F3.5u (F0.3d;B3.5u) (F3.6u;B0.0d) B3.6u "
        "(F3.7u;B0.1d) B3.7u I0.2d W0.2d I0.3d W0.3d")
    # the middle ranks run their first F&B as two ops
    assert Z.format_order(Z.dualpipe(4, 8)[1][5:8]) == "B2.4u (F2.6u;B1.0d) (F1.3d;B2.5u)"
    assert Z.format_order(Z.v_min(4, 8)[3][:8]) == "F3.0 F4.0 F3.1 F4.1 I4.0 I3.0 W4.0 W3.0"


# --------------------------------------------------------------------------------------------
# Bubbles and memory equal the published formulas (unit costs)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("PP", [4, 8, 16])
@pytest.mark.parametrize("cost", [UNIT, SKEWED], ids=["unit", "skewed"])
def test_dualpipe_readme_table(PP, cost):
    F, B, W, FB = cost["F"], cost["B"], cost["W"], cost["FB"]
    m = 3 * PP
    assert bubble(R.one_f_one_b(PP, m), PP, cost) == (PP - 1) * (F + B)
    if cost is UNIT:  # ZB1P's formula is for its F = I = W shape
        assert bubble(Z.zb_h1(PP, m), PP, cost) == (PP - 1) * (F + B - 2 * W)
    assert bubble(Z.dualpipe(PP, 2 * PP), PP, cost) == (PP // 2 - 1) * (FB + B - 3 * W)
    assert bubble(Z.dualpipe(PP, m + m % 2), PP, cost) == (PP // 2 - 1) * (FB + B - 3 * W)
    # DualPipeV: PP counts stages, two per device (the README's note)
    p = PP // 2
    for mb in (2 * p, 2 * p + 3, 5 * p):
        assert bubble(Z.dualpipev(p, mb), PP, cost) == (PP // 2 - 1) * (FB + B - 3 * W)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_zero_bubble_readme_rates(p):
    m = 3 * p
    # unit costs per (chunk) op: F = I = W = 1
    one_f_one_b = bubble(R.one_f_one_b(p, m), p, UNIT)
    assert one_f_one_b == 3 * (p - 1)                       # rate (p-1)/m of the 3m busy time
    assert bubble(Z.zb_h1(p, m), p, UNIT) * 3 == one_f_one_b  # ZB-H1: (p-1)/3m
    assert steady_bubble(Z.zb_h2(p, m), p, UNIT) == 0
    assert steady_bubble(Z.zbv(p, m), 2 * p, UNIT) == 0
    # V-Half and V-Min, against 1F1B of the same model (a stage is two chunks: F = I = W = 2), which
    # idles 6(p-1): the sail-sg generator's squeezed orders idle 3p-7 and 4p-5 for p even and not a
    # multiple of 3 (odd p: 3p-4; 3 | p: 4p-7), a half and two thirds of it less a constant (B/2 and
    # 2B/3 in its README), the same from time 0 and from each rank's first op
    v_1f1b = 2 * one_f_one_b
    half, vmin = Z.v_half(p, m), Z.v_min(p, m)
    assert bubble(half, 2 * p, UNIT) == steady_bubble(half, 2 * p, UNIT) == (3 * p - 7 if p > 2 else 1)
    assert bubble(vmin, 2 * p, UNIT) == steady_bubble(vmin, 2 * p, UNIT) == 4 * p - 5
    if p > 2:
        assert 3 * p - 7 == v_1f1b // 2 - 4 and 4 * p - 5 == v_1f1b * 2 // 3 - 1


@pytest.mark.parametrize("p", [3, 5, 6, 9])
def test_v_half_and_v_min_bubbles_for_odd_p_and_multiples_of_3(p):
    m = 3 * p
    assert steady_bubble(Z.v_half(p, m), 2 * p, UNIT) == (3 * p - 7 if p % 2 == 0 else 3 * p - 4)
    assert steady_bubble(Z.v_min(p, m), 2 * p, UNIT) == (4 * p - 7 if p % 3 == 0 else 4 * p - 5)


@pytest.mark.parametrize("p", [4, 8, 16])
def test_v_half_and_v_min_bubbles_do_not_grow_with_m(p):
    for build in (Z.v_half, Z.v_min, Z.v_half_block, Z.v_min_block):
        assert len({bubble(build(p, m), 2 * p, UNIT) for m in (2 * p, 3 * p, 5 * p)}) == 1


@pytest.mark.parametrize("p", [4, 5, 8, 16])
def test_v_blocks_repeat_with_period_six(p):
    # in the steady state every rank runs the same six ops per microbatch, one slot each
    m = 6 * p
    for build in (Z.v_half_block, Z.v_min_block):
        for units in build(p, m):
            shift = [(k, s, i + 1) for k, s, i in units]
            middle = len(units) // 2
            assert units[middle + 6:middle + 30] == shift[middle:middle + 24]
    # squeezing moves no op of V-Min's steady state and keeps V-Min's bubble
    assert bubble(Z.v_min(p, 3 * p), 2 * p, UNIT) == bubble(Z.v_min_block(p, 3 * p), 2 * p, UNIT)


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16])
def test_peak_activation_memory(p):
    m = 3 * p
    assert peak_activations(R.one_f_one_b(p, m), p, UNIT) == p
    assert peak_activations(Z.zb_h1(p, m), p, UNIT) == p
    # V shapes count chunk activations: a microbatch's worth on a device is two chunks
    assert peak_activations(Z.zbv(p, m), 2 * p, UNIT) == 2 * p
    # the playground table of sail-sg's Controllable Memory: (p+2)//2 and (p+4)//3 microbatches
    assert peak_activations(Z.v_half(p, m), 2 * p, UNIT) == 2 * ((p + 2) // 2)
    assert peak_activations(Z.v_min(p, m), 2 * p, UNIT) == 2 * ((p + 4) // 3)
    assert peak_activations(Z.v_half_block(p, m), 2 * p, UNIT) <= 2 * math.ceil((p + 2) / 2)
    assert peak_activations(Z.v_min_block(p, m), 2 * p, UNIT) <= 2 * math.ceil((p + 4) / 3)
    # DualPipe / DualPipeV: PP + 1 stage activations, PP the stage count
    if p % 2 == 0:
        assert peak_activations(Z.dualpipe(p, m + m % 2), p, UNIT) == p + 1
    assert peak_activations(Z.dualpipev(p, 2 * p + 2), 2 * p, UNIT) == 2 * p + 1


def test_v_block_memory_function_agrees_with_the_simulator():
    # the block's own peak count (the reference generator's memory function) on the W-filled slots
    for p in (4, 8):
        for kind, build in (("half", Z.v_half), ("min", Z.v_min)):
            blocks = [[[t + 6 * i for i in range(3 * p)] for t in b] for b in Z.v_block(kind, p)]
            own = max(Z._peak(Z._fill_weights(rank, split=False)) for rank in blocks)
            assert peak_activations(build(p, 3 * p), 2 * p, UNIT) <= own
