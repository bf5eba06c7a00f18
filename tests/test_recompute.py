"""Placed recomputation (`recompute F`, ops.OpKind.R): its dependencies, memory, cost, the library's
interleaved_1f1b_recompute against full recomputation, and refusals."""
from __future__ import annotations

import pytest

from conftest import FIXTURES, SCHEDULES, compile_library, refusal
from schedc.driver import compile_source, read_source
from schedc.ops import builtin_deps


def test_the_rule_puts_r_between_a_forward_and_its_backward():
    assert builtin_deps("R", 1, 3, False, True) == (("F", 1),)
    assert builtin_deps("B", 1, 3, False, True) == (("R", 1), ("B", 2))
    assert builtin_deps("I", 2, 3, True, True) == (("R", 2),)
    assert builtin_deps("B", 1, 3, False) == (("F", 1), ("B", 2))


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8)])
def test_same_order_as_interleaved_with_an_r_before_each_backward(p, v, m):
    """Drop the R ops and the order is interleaved_1f1b's; each R directly precedes its B."""
    plain = compile_library("interleaved_1f1b", p=p, v=v, m=m).schedule
    ours = compile_library("interleaved_1f1b_recompute", p=p, v=v, m=m)
    assert ours.ok
    for order, expected in zip(ours.schedule.orders, plain.orders):
        assert [(op.kind, op.stage, op.mb) for op in order if op.kind != "R"] == \
               [(op.kind, op.stage, op.mb) for op in expected]
        for before, op in zip(order, order[1:]):
            if op.kind == "B":
                assert (before.kind, before.stage, before.mb) == ("R", op.stage, op.mb)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (8, 2, 16)])
def test_peak_is_full_recomputations(p, v, m):
    """Full recomputation (the forward saves only its input; the backward reruns it) holds one stage's
    activation at a time on a device: 1 unit, against interleaved 1F1B's (v-1)p + 2(p-1-d) + 1."""
    ours = compile_library("interleaved_1f1b_recompute", p=p, v=v, m=m)
    plain = compile_library("interleaved_1f1b", p=p, v=v, m=m)
    assert ours.timing.peak_memory == (1.0,) * p
    assert plain.timing.peak_memory == tuple(float((v - 1) * p + 2 * (p - 1 - d) + 1) for d in range(p))


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8)])
def test_r_costs_a_forward_and_no_more_than_recomputing_inside_the_backward(p, v, m):
    """R costs F's 1; the step is never longer than recomputing inside the backward (B = 2 + 1), since
    the same work runs in the same order, but an R may start before the gradient has arrived."""
    ours = compile_library("interleaved_1f1b_recompute", p=p, v=v, m=m)
    assert {op.cost for op in ours.schedule.ops() if op.kind == "R"} == {1.0}
    heavy = compile_source(read_source(SCHEDULES / "interleaved_1f1b.sched"), _options(p=p, v=v, m=m))
    assert ours.stats["makespan"] <= heavy.stats["makespan"] + 1e-9


def _options(**params):
    from schedc.frontend.elaborate import Options
    return Options({k: str(v) for k, v in params.items()}, costs={"B": 3.0})


def test_plan_places_r():
    plan = compile_library("interleaved_1f1b_recompute", p=2, v=2, m=2).plan
    ops = [instr.op for step in plan.ranks[0] for instr in step]
    assert ops.count("R") == 4 and ops.count("B") == 4


def test_r_of_a_forward_that_kept_its_state_is_refused_at_the_pop():
    diag = refusal("recompute/r_without_recompute.sched")
    assert "recompute F" in diag.message and diag.span.line == 5


def test_backward_before_its_recompute_is_a_located_deadlock():
    compiled = compile_source(read_source(FIXTURES / "recompute" / "backward_before_recompute.sched"))
    errors = [d for d in compiled.diagnostics if d.severity == "error"]
    assert errors and errors[0].message.startswith("deadlock") and errors[0].span is not None
    assert "R(1,0)" in errors[0].message + errors[0].detail


def test_r_boxes_have_their_own_colour():
    from schedc.render.style import KIND_COLOURS, palette as palette_of
    schedule = compile_library("interleaved_1f1b_recompute", p=2, v=2, m=2).schedule
    palette = palette_of(schedule)
    assert "R" in palette.kinds and palette.fill("R", 0, 0) not in {palette.fill(k, 0, 0) for k in "FB"}
    assert KIND_COLOURS["R"] not in {KIND_COLOURS[k] for k in "FBIW"}
