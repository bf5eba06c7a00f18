"""simulate: with F=1, B=2 and no latency the bubble equals the papers' formulas."""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from heapq import heappop, heappush

import pytest

from conftest import compile_library
from schedc.passes import simulate as simulate_module
from schedc.passes.simulate import forget_index, predecessors, simulate

SIZES = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 3 * p)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", SIZES)
def test_bubble_is_p_minus_1_over_m(name, p, m):
    stats = compile_library(name, p=p, m=m).stats
    assert Fraction(stats["bubble"]).limit_denominator(10_000) == Fraction(p - 1, m)
    assert stats["makespan"] == 3 * (m + p - 1)


@pytest.mark.parametrize("v", (2, 3, 4))
@pytest.mark.parametrize("p,m", [(p, m) for p in (2, 4, 8) for m in (p, 2 * p)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, v, m):
    stats = compile_library("interleaved_1f1b", p=p, v=v, m=m).stats
    assert Fraction(stats["bubble"]).limit_denominator(10_000) == Fraction(p - 1, v * m)


def test_stats_are_consistent():
    result = compile_library("chimera", p=4, m=8)
    stats = result.stats
    devices = result.schedule.devices
    assert sum(stats["busy"]) + sum(stats["idle"]) == pytest.approx(devices * stats["makespan"])
    assert stats["utilization"] == pytest.approx(sum(stats["busy"]) / (devices * stats["makespan"]))
    assert stats["bubble"] == pytest.approx(sum(stats["idle"]) / sum(stats["busy"]))


def test_the_bubble_is_idle_over_busy_and_no_fraction_is_above_one():
    """One bubble (DESIGN.md, Narayanan et al.): idle over busy time, (p - 1)/m, a ratio that exceeds 1
    when the devices idle longer than they work (1F1B, p = 4, m = 1: 3, as the formula says); what is
    called a fraction (utilization, and 1 - utilization the idle share) stays within [0, 1]."""
    stats = compile_library("1f1b", p=4, m=1).stats
    assert stats["bubble"] == 3.0 and "bubble_fraction" not in stats
    assert 0 <= stats["utilization"] <= 1
    assert stats["bubble"] == pytest.approx((1 - stats["utilization"]) / stats["utilization"])


def test_1f1b_holds_fewer_activations_than_gpipe():
    assert compile_library("1f1b", p=4, m=8).stats["peak_memory"] == [4, 3, 2, 1]
    assert compile_library("gpipe", p=4, m=8).stats["peak_memory"] == [8, 8, 8, 8]


def test_every_op_respects_its_dependencies_and_its_device():
    schedule = compile_library("interleaved_1f1b", p=4, v=2, m=8).schedule
    timing = simulate(schedule, latency=0.5)
    for op in schedule.ops():
        for dep in schedule.deps[op]:
            gap = 0.5 if dep.device != op.device else 0.0
            assert timing.start[op] >= timing.end[dep] + gap - 1e-9
    for order in schedule.orders:
        for a, b in zip(order, order[1:]):
            assert timing.start[b] >= timing.end[a]


def test_latency_lengthens_the_makespan():
    schedule = compile_library("1f1b", p=4, m=8).schedule
    assert simulate(schedule, 0.25).makespan > simulate(schedule, 0.0).makespan


def test_measured_costs_per_stage_change_the_timing():
    from schedc.driver import compile_source, read_source
    from schedc.frontend.elaborate import Options
    from conftest import SCHEDULES
    slow_last = Options({"p": "2", "m": "2"}, costs={"F": (1.0, 3.0), "B": (2.0, 6.0)})
    stats = compile_source(read_source(SCHEDULES / "1f1b.sched"), slow_last).stats
    assert stats["busy"] == [6.0, 18.0]


def test_an_overlapped_pair_on_two_stages_costs_each_half_at_its_own_stage():
    """DualPipeV p=2: device 0 holds stages 0 and 3, and overlaps F of one with B of the other. With
    stage 3 three times as slow and FB = F + B (nothing saved), device 0's busy time is each op at its
    own stage's cost, 4 x (1 + 2) + 4 x (3 + 6), however the pairs fall; with FB half a unit below
    F + B, each of its pairs saves half a unit."""
    from schedc.driver import compile_source, read_source
    from schedc.frontend.elaborate import Options
    from conftest import SCHEDULES
    per_stage = {"F": (1.0, 1.0, 1.0, 3.0), "B": (2.0, 2.0, 2.0, 6.0), "I": (1.0, 1.0, 1.0, 3.0),
                 "W": (1.0, 1.0, 1.0, 3.0)}
    for saved in (0.0, 0.5):
        costs = {**per_stage, "FB": tuple(f + b - saved for f, b in zip(per_stage["F"], per_stage["B"]))}
        compiled = compile_source(read_source(SCHEDULES / "dualpipev.sched"),
                                  Options({"p": "2", "m": "4"}, costs=costs))
        pairs = [sum(f.device == d for f, _ in compiled.schedule.fused) for d in range(2)]
        assert pairs[0] > 0 and any(f.stage != b.stage for f, b in compiled.schedule.fused)
        assert compiled.stats["busy"] == [48.0 - saved * pairs[0], 24.0 - saved * pairs[1]]


def reference_sequence(schedule, latency):
    """The plain event loop simulate must agree with: a heap of ready ops by (start, index); an op is
    ready when its device's previous op and its placed dependencies have ended."""
    ops = [op for order in schedule.orders for op in order]
    index = {op.key: n for n, op in enumerate(ops)}
    succ, indegree, n = [[] for _ in ops], [0] * len(ops), 0
    for order in schedule.orders:
        for m in range(n + 1, n + len(order)):
            succ[m - 1].append(m)
            indegree[m] += 1
        n += len(order)
    for n, op in enumerate(ops):
        for key in schedule.deps.keys_of(op):
            if key in index:
                succ[index[key]].append(n)
                indegree[n] += 1
    ready, sequence = [0.0] * len(ops), []
    heap = [(0.0, n) for n in range(len(ops)) if indegree[n] == 0]
    while heap:
        time, n = heappop(heap)
        sequence.append((time, time + ops[n].cost, ops[n]))
        for m in succ[n]:
            arrive = sequence[-1][1] + (latency if ops[m].device != ops[n].device else 0.0)
            ready[m] = max(ready[m], arrive)
            indegree[m] -= 1
            if indegree[m] == 0:
                heappush(heap, (ready[m], m))
    return sequence


def _schedule(name):
    """A library schedule at p=4, m=8, or a test fixture (`fixtures/NAME`) at its own parameters."""
    if name.startswith("fixtures/"):
        from schedc.driver import compile_source, read_source
        from conftest import FIXTURES
        return compile_source(read_source(FIXTURES / f"{name.removeprefix('fixtures/')}.sched")).schedule
    return compile_library(name, p=4, m=8).schedule


def _variants(schedule):
    """The schedule, with its backward ops taking no time, with one device's order reversed (a deadlock)
    and without the first op of each device (dependencies that are not placed)."""
    free = {op: replace(op, cost=0.0) for op in schedule.ops() if op.kind in ("B", "I", "W")}
    yield schedule
    yield replace(schedule, orders=tuple(tuple(free.get(op, op) for op in order) for order in schedule.orders))
    yield replace(schedule, orders=(schedule.orders[0][::-1],) + schedule.orders[1:])
    yield replace(schedule, orders=tuple(order[1:] for order in schedule.orders))


NAMES = ["1f1b", "gpipe", "chimera", "interleaved_1f1b", "pipefisher", "pipefisher_1f1b", "fixtures/split_backward"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("latency", [0.0, 0.5])
def test_simulate_matches_the_plain_event_loop(name, latency):
    for schedule in _variants(_schedule(name)):
        timing, expected = simulate(schedule, latency), reference_sequence(schedule, latency)
        assert timing.sequence == tuple(expected)
        assert timing.complete == (len(expected) == schedule.op_count())
        assert [(timing.start[op], timing.end[op]) for _, _, op in expected] == [(s, e) for s, e, _ in expected]
        assert len(timing.start) == len(expected)


@pytest.mark.parametrize("name", NAMES + ["v_half", "v_min", "dualpipe", "dualpipev"])  # + mixed backwards
def test_predecessors_follow_keys_of(name):
    schedule = _schedule(name)
    ops, preds, firsts = predecessors(schedule)
    index = {op.key: n for n, op in enumerate(ops)}
    for n, op in enumerate(ops):
        before = () if n in firsts else (n - 1,)
        assert preds[n] == before + tuple(index.get(key, len(ops)) for key in schedule.deps.keys_of(op))


def test_a_big_compile_keeps_no_index_and_one_forgotten_is_built_again_alike(monkeypatch):
    from schedc.driver import passes
    compiled = compile_library("interleaved_1f1b", p=4, v=2, m=8)
    assert compiled.plan is not None and simulate_module._LAST[0] is compiled.schedule  # a small one: kept
    monkeypatch.setattr(passes, "KEEP_INDEX", 64)
    compiled = compile_library("interleaved_1f1b", p=4, v=2, m=8)  # 96 ops
    assert compiled.plan is not None and simulate_module._LAST == []  # lowering let it go
    schedule = _schedule("1f1b")
    kept = predecessors(schedule)
    assert simulate_module._LAST[0] is schedule
    forget_index()
    assert simulate_module._LAST == [] and predecessors(schedule) == kept


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 4, "m": 8}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}),
                                         ("chimera", {"p": 4, "m": 8})])
def test_links_of_one_time_everywhere_are_the_scalar_latency(name, params):
    schedule = compile_library(name, **params).schedule
    links = [[0.0 if a == b else 0.25 for b in range(schedule.devices)] for a in range(schedule.devices)]
    scalar, paired = simulate(schedule, 0.25), simulate(schedule, links=links)
    assert paired.makespan == scalar.makespan and dict(paired.start) == dict(scalar.start)
    assert [op for _, _, op in paired.sequence] == [op for _, _, op in scalar.sequence]


def test_a_slow_link_delays_only_what_crosses_it():
    schedule = compile_library("1f1b", p=3, m=3).schedule
    links = [[0.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 0.0, 0.0]]  # only device 1 -> device 2 is slow
    timing = simulate(schedule, links=links)
    f = {op.mb: timing.start[op] for op in schedule.orders[2] if op.kind == "F"}
    assert f[0] == 2 + 5  # F(0,0), F(1,0) end at 2; the message to device 2 takes 5
    plain = simulate(schedule)
    first_b1 = next(op for op in schedule.orders[1] if op.kind == "B")
    assert timing.start[first_b1] == plain.start[first_b1] + 5  # waits for F(2,0), not for a slow reply


# the steady-state bubble: idle between a device's first and last op ----------------------------------

@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16)])
def test_1f1b_idles_inside_its_span_only_on_the_devices_that_start_early(p, m):
    # device d starts at d*F and ends (p-1-d)*B before the makespan: (p-1-d)(F+B) idle in between
    stats = compile_library("1f1b", p=p, m=m).stats
    assert stats.idle_inside == tuple(3.0 * (p - 1 - d) for d in range(p))
    assert stats["idle"] == [3.0 * (p - 1)] * p


@pytest.mark.parametrize("name", ["zb_h2", "zbv"])
@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_zero_bubble_h2_and_v_have_no_steady_state_bubble(name, p):
    # Qi et al.'s README: ZB-H2 and ZB-V have zero bubble in the steady state with F = I = W
    stats = compile_library(name, p=p, m=3 * p).stats
    assert stats.idle_inside == (0.0,) * p
    assert max(stats.idle) > 0  # warm-up and drain still idle


def test_the_steady_state_bubble_is_a_stat_printed_and_in_json():
    from click.testing import CliRunner
    from schedc.cli import main
    import json
    as_json = json.loads(CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=4", "-D", "m=8", "--json"]).output)
    assert as_json["idle_inside"] == [9.0, 6.0, 3.0, 0.0]
    assert list(as_json).index("idle_inside") == list(as_json).index("idle") + 1
    text = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=4", "-D", "m=8"]).output
    assert "steady-state bubble: at most 9 idle between a device's first and last op" in text
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["0"], ["3"])]
    assert rows == [["0", "24", "9", "9", "4"], ["3", "24", "9", "0", "1"]]  # device busy idle inside peak


def test_a_filled_cycle_sums_the_steady_state_idle_of_its_steps():
    result = compile_library("pipefisher", p=8, m=8)
    steps = result.timing.steps
    assert len(steps) == result.stats.cycle_steps == 3
    assert result.stats.idle_inside == pytest.approx([sum(s.idle_inside[d] for s in steps) for d in range(8)])
    assert all(0 <= inside <= idle for inside, idle in zip(result.stats.idle_inside, result.stats.idle))


class _Gathers:
    """ZeRO-3-like collectives: half a unit gathered ahead of every op, a quarter reduced behind it."""

    def per_op(self, schedule, ops):
        return [0.5] * len(ops), [0.25] * len(ops)


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 4, "m": 8}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}),
                                         ("dualpipev", {"p": 4, "m": 8}), ("zb_h1", {"p": 4, "m": 8})])
@pytest.mark.parametrize("latency,lanes", [(0.0, False), (0.5, False), (0.0, True)])
def test_the_makespan_alone_is_simulates(name, params, latency, lanes):
    from schedc.passes.simulate import makespan
    schedule = compile_library(name, **params).schedule
    collectives = _Gathers() if lanes else None
    expected = simulate(schedule, latency, collectives=collectives).makespan
    assert makespan(schedule, latency, collectives=collectives) == expected
    assert expected > 0
    links = [[0.0 if a == b else 0.1 * (1 + a + b) for b in range(schedule.devices)] for a in range(schedule.devices)]
    assert makespan(schedule, links=links) == simulate(schedule, links=links).makespan


@pytest.mark.parametrize("name", NAMES + ["dualpipe", "offload_1f1b", "zb_h1"])  # + overlapped pairs, copy lanes
@pytest.mark.parametrize("latency", [0.0, 0.5])
def test_makespan_after_a_simulate_is_the_event_loops(name, latency):
    """makespan without messages, taken over the start order of a simulate just run, against the same
    schedule timed afresh by the event loop (and, for the schedules it covers, the plain reference)."""
    from schedc.passes import simulate as engine
    variants = list(_variants(_schedule(name)))
    for schedule in variants[:1] if variants[0].fused else variants:  # its pairs are the ops themselves
        engine._LAST.clear(), engine._RAN.clear()
        afresh = engine.makespan(schedule)  # no start order to follow: the event loop
        timing = simulate(schedule, latency)
        assert bool(engine._RAN) == (timing.complete and all(e > s for s, e, _ in timing.sequence))
        assert engine.makespan(schedule) == afresh
        if name in NAMES and timing.complete:
            assert afresh == max(end for _, end, _ in reference_sequence(schedule, 0.0))
