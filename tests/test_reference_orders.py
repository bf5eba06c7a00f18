"""Self-test of tests/reference_orders.py (the independent reference orders)."""

import os
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_orders as R  # noqa: E402

import torch.distributed.pipelining.schedules as torch_pipelining  # noqa: E402

P_SINGLE = [2, 3, 4, 8]
V_CHUNKS = [2, 3, 4]
CHIMERA_SIZES = [(p, m) for p in (2, 4, 8) for m in (p, 2 * p, 4 * p)]  # m/2 in {p/2, p, 2p}


def check_invariants(orders, num_stages, mbs_of, rank_of):
    """Each (stage, mb[, pipe]) has exactly one F and one B, on the rank that holds the stage;
    F before B on that rank; the dependency replay completes."""
    seen = Counter()
    for r, ops in enumerate(orders):
        pos = {}
        for k, op in enumerate(ops):
            kind, s, i = op[0], op[1], op[2]
            pipe = R._pipe(op)
            assert kind in ("F", "B")
            assert rank_of(s, pipe) == r, (op, r)
            seen[op] += 1
            pos[op] = k
        for op, k in pos.items():
            if op[0] == "B":
                f = ("F",) + tuple(op[1:])
                assert f in pos and pos[f] < k, op
    expected = set()
    for pipe, mbs in mbs_of.items():
        for s in range(num_stages):
            for i in mbs:
                tail = (s, i) if pipe is None else (s, i, pipe)
                expected.add(("F",) + tail)
                expected.add(("B",) + tail)
    assert set(seen) == expected
    assert all(c == 1 for c in seen.values())
    R.replay(orders, num_stages)


@pytest.mark.parametrize("p", P_SINGLE)
@pytest.mark.parametrize("mult", [1, 2, 3])
def test_gpipe_and_1f1b(p, mult):
    m = mult * p
    for orders in (R.gpipe(p, m), R.one_f_one_b(p, m)):
        check_invariants(orders, p, {None: range(m)}, R.placement_single(p))


@pytest.mark.parametrize("p", P_SINGLE)
@pytest.mark.parametrize("mult", [1, 2, 3])
def test_gpipe_matches_torch(p, mult):
    m = mult * p
    sched = torch_pipelining.ScheduleGPipe(R._MockStage(0, p, 0, p), m)
    got = [R._convert_torch_actions(sched.pipeline_order[d]) for d in range(p)]
    assert got == R.gpipe(p, m)


@pytest.mark.parametrize("p", P_SINGLE)
@pytest.mark.parametrize("mult", [1, 2, 3])
def test_1f1b_matches_torch(p, mult):
    # torch 2.13 Schedule1F1B._get_pipeline_order has an off-by-one on the LAST rank (0 warm-up
    # forwards: it emits F1..F m instead of F0..F m-1), so only ranks 0..p-2 are compared; its
    # runtime (_step_microbatches) does run the Megatron order on every rank.
    m = mult * p
    sched = torch_pipelining.Schedule1F1B(R._MockStage(0, p, 0, p), m)
    ref = R.one_f_one_b(p, m)
    for d in range(p - 1):
        assert R._convert_torch_actions(sched.pipeline_order[d]) == ref[d]


def test_1f1b_shape():
    o = R.one_f_one_b(4, 8)
    assert R.format_order(o[0]) == "F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 F0.6 B0.3 F0.7 B0.4 B0.5 B0.6 B0.7"
    assert R.format_order(o[3]) == "F3.0 B3.0 F3.1 B3.1 F3.2 B3.2 F3.3 B3.3 F3.4 B3.4 F3.5 B3.5 F3.6 B3.6 F3.7 B3.7"
    # m < p - 1: warm-up capped at m
    assert R.one_f_one_b(4, 2)[0] == [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("B", 0, 1)]


@pytest.mark.parametrize("p", P_SINGLE)
@pytest.mark.parametrize("v", V_CHUNKS)
@pytest.mark.parametrize("mult", [1, 2, 3])
def test_interleaved_torch_equals_closed_form(p, v, mult):
    m = mult * p
    from_torch = R.interleaved(p, v, m)
    closed = R.interleaved_closed_form(p, v, m)
    assert from_torch == closed
    check_invariants(from_torch, p * v, {None: range(m)}, R.placement_interleaved(p, v))
    assert R.orders_from_torch_csv(R.interleaved_torch_csv(p, v, m)) == from_torch


def test_interleaved_shape():
    o = R.interleaved(4, 2, 8)
    assert R.format_order(o[0][:12]) == "F0.0 F0.1 F0.2 F0.3 F4.0 F4.1 F4.2 F4.3 F0.4 F0.5 F0.6 B4.0"
    assert R.format_order(o[3][:6]) == "F3.0 F3.1 F3.2 F3.3 F7.0 B7.0"


@pytest.mark.parametrize("p,m", CHIMERA_SIZES)
def test_chimera_invariants(p, m):
    orders = R.chimera(p, m)
    n = m // 2
    check_invariants(orders, p, {"down": range(n), "up": range(n, m)}, R.placement_chimera(p))


def test_chimera_p4_m8_golden():
    # hand-derived from pipe-fisher's _call_chimera_pipeline (p=4: h=2; ranks 0,3: a=2,b=0;
    # ranks 1,2: a=1,b=1); also matches the Chimera paper's Fig. 3 pattern per basic unit
    t = R.chimera_table(4, 8)
    assert t[0] == ("F0.0d F0.1d F3.4u B3.4u F3.5u B3.5u B0.0d F0.2d B0.1d F0.3d "
                    "F3.6u B3.6u F3.7u B3.7u B0.2d B0.3d")
    assert t[1] == ("F1.0d F2.4u F1.1d F2.5u B2.4u B1.0d B2.5u B1.1d F1.2d F2.6u "
                    "F1.3d F2.7u B2.6u B1.2d B2.7u B1.3d")
    assert t[2] == ("F1.4u F2.0d F1.5u F2.1d B2.0d B1.4u B2.1d B1.5u F1.6u F2.2d "
                    "F1.7u F2.3d B2.2d B1.6u B2.3d B1.7u")
    assert t[3] == ("F0.4u F0.5u F3.0d B3.0d F3.1d B3.1d B0.4u F0.6u B0.5u F0.7u "
                    "F3.2d B3.2d F3.3d B3.3d B0.6u B0.7u")


def test_chimera_p2_m2():
    t = R.chimera_table(2, 2)
    assert t[0] == "F0.0d F1.1u B1.1u B0.0d"
    assert t[1] == "F0.1u F1.0d B1.0d B0.1u"


@pytest.mark.parametrize("p,m", CHIMERA_SIZES)
def test_chimera_symmetry(p, m):
    # rank d and rank p-1-d run the same program with the pipelines swapped
    orders = R.chimera(p, m)
    n = m // 2
    swap = {"down": "up", "up": "down"}
    for d in range(p):
        mirrored = [(k, s, (i + n) % m, swap[pipe]) for (k, s, i, pipe) in orders[p - 1 - d]]
        assert mirrored == orders[d]
