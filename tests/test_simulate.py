"""simulate: with F=1, B=2 and no latency the bubble equals the papers' formulas."""
from __future__ import annotations

from fractions import Fraction

import pytest

from conftest import compile_library
from schedc.simulate import simulate

SIZES = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 3 * p)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", SIZES)
def test_bubble_is_p_minus_1_over_m(name, p, m):
    stats = compile_library(name, p=p, m=m).stats
    assert Fraction(stats["bubble_fraction"]).limit_denominator(10_000) == Fraction(p - 1, m)
    assert stats["makespan"] == 3 * (m + p - 1)


@pytest.mark.parametrize("v", (2, 3, 4))
@pytest.mark.parametrize("p,m", [(p, m) for p in (2, 4, 8) for m in (p, 2 * p)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, v, m):
    stats = compile_library("interleaved_1f1b", p=p, v=v, m=m).stats
    assert Fraction(stats["bubble_fraction"]).limit_denominator(10_000) == Fraction(p - 1, v * m)


def test_stats_are_consistent():
    result = compile_library("chimera", p=4, m=8)
    stats = result.stats
    devices = result.schedule.devices
    assert sum(stats["busy"]) + sum(stats["idle"]) == pytest.approx(devices * stats["makespan"])
    assert stats["utilization"] == pytest.approx(sum(stats["busy"]) / (devices * stats["makespan"]))
    assert stats["bubble_fraction"] == pytest.approx(sum(stats["idle"]) / sum(stats["busy"]))


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
    from schedc.compiler import compile_source, read_source
    from schedc.elaborate import Options
    from conftest import SCHEDULES
    slow_last = Options({"p": "2", "m": "2"}, costs={"F": (1.0, 3.0), "B": (2.0, 6.0)})
    stats = compile_source(read_source(SCHEDULES / "1f1b.sched"), slow_last).stats
    assert stats["busy"] == [6.0, 18.0]
