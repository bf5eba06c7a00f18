"""Elaboration: the library's per-rank orders equal independent constructions of the published ones."""
from __future__ import annotations

import pytest

import reference_orders as ref
from conftest import FIXTURES, compile_library
from schedc.compiler import build_schedule, read_source
from schedc.diagnostics import SchedError
from schedc.elaborate import Options


def _orders(schedule, with_pipe: bool = False):
    names = [p.name for p in schedule.pipelines]
    return [[(op.kind, op.stage, op.mb, names[op.pipe]) if with_pipe else (op.kind, op.stage, op.mb)
             for op in order] for order in schedule.orders]


SIZES = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 3 * p)]


@pytest.mark.parametrize("p,m", SIZES)
def test_1f1b_equals_megatron(p, m):
    assert _orders(compile_library("1f1b", p=p, m=m).schedule) == ref.one_f_one_b(p, m)


@pytest.mark.parametrize("p,m", SIZES)
def test_gpipe_all_forwards_then_all_backwards(p, m):
    assert _orders(compile_library("gpipe", p=p, m=m).schedule) == ref.gpipe(p, m)


@pytest.mark.parametrize("v", (2, 3, 4))
@pytest.mark.parametrize("p,m", SIZES)
def test_interleaved_equals_torch_schedule_interleaved_1f1b(p, m, v):
    assert _orders(compile_library("interleaved_1f1b", p=p, v=v, m=m).schedule) == ref.interleaved(p, v, m)


@pytest.mark.parametrize("p,half", [(p, h) for p in (2, 4, 8) for h in (p // 2, p, 2 * p)])
def test_chimera_equals_reference_implementation(p, half):
    schedule = compile_library("chimera", p=p, m=2 * half).schedule
    assert _orders(schedule, with_pipe=True) == ref.chimera(p, 2 * half)


def test_chimera_placement_and_replicas():
    schedule = compile_library("chimera", p=4, m=8).schedule
    down, up = schedule.pipelines
    assert down.placement == (0, 1, 2, 3) and up.placement == (3, 2, 1, 0)
    assert down.microbatches == (0, 1, 2, 3) and up.microbatches == (4, 5, 6, 7)
    assert schedule.replicas == ((0, 1),)


def test_explicit_lists_keep_their_order():
    schedule = build_schedule(read_source(FIXTURES / "explicit.sched"))
    assert _orders(schedule) == [[("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("B", 0, 1)],
                                 [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1)]]


def test_greedy_with_inflight_limit_reproduces_1f1b():
    schedule = build_schedule(read_source(FIXTURES / "greedy.sched"))
    assert _orders(schedule) == ref.one_f_one_b(4, 8)


def test_split_backward_makes_input_and_weight_gradients():
    schedule = build_schedule(read_source(FIXTURES / "split_backward.sched"))
    kinds = {op.kind for op in schedule.ops()}
    assert kinds == {"F", "I", "W"}
    assert schedule.deps[next(op for op in schedule.ops() if op.kind == "W")][0].kind == "I"


def test_param_override_changes_the_expansion():
    schedule = compile_library("1f1b", p=3, m=5).schedule
    assert schedule.devices == 3 and schedule.microbatches == 5 and schedule.op_count() == 30


def test_ops_carry_the_span_of_the_program_item_that_placed_them():
    schedule = compile_library("1f1b", p=4, m=8).schedule
    first = schedule.orders[0][0]
    source_line = schedule.source.line(first.span.line)
    assert source_line.strip() == "F * w"


# --- semantic errors: located, with the exit code of a wrong schedule ------------------------------

@pytest.mark.parametrize("fixture,line,column,text", [
    ("pop_empty.sched", 7, 3, "devices 0, 1: program pops F from an empty queue"),
    ("leftover.sched", 5, 1, "device 0: program leaves 1 op unscheduled: B(0,2)"),
    ("bad_device.sched", 4, 31, "stage 2 of pipeline 'main' is placed on device 2, but devices are 0..1"),
    ("unknown_name.sched", 6, 7, "unknown name 'warmup'"),
    ("failed_require.sched", 4, 1, "requirement failed: m must be a multiple of p"),
    ("bad_task_dep.sched", 5, 33, "F(2, 0) names stage 2, but pipeline 'main' has stages 0..1"),
    ("runaway_loop.sched", 6, 29, "device 0: programs run more than 1,000,256 statements (a runaway loop?)"),
    ("pop_loop.sched", 5, 41, "devices 0, 1: program pops F from an empty queue"),
])
def test_semantic_errors_are_located(fixture, line, column, text):
    with pytest.raises(SchedError) as caught:
        build_schedule(read_source(FIXTURES / fixture))
    exc = caught.value
    assert exc.exit_code == 1
    first = exc.diagnostics[0]
    assert (first.span.line, first.span.column) == (line, column)
    assert text in first.message
    assert f"{FIXTURES / fixture}:{line}:{column}: error: " in exc.render()


def test_every_faulty_device_is_reported_once_per_place():
    with pytest.raises(SchedError) as caught:
        build_schedule(read_source(FIXTURES / "pop_empty.sched"))
    assert [d.message.split(":")[0] for d in caught.value.diagnostics] == ["devices 0, 1"]
    with pytest.raises(SchedError) as caught:
        build_schedule(read_source(FIXTURES / "leftover.sched"))
    assert [d.message for d in caught.value.diagnostics] == [
        "device 0: program leaves 1 op unscheduled: B(0,2)", "device 1: program leaves 1 op unscheduled: B(1,2)"]


def test_unknown_override_is_a_usage_error():
    with pytest.raises(SchedError) as caught:
        compile_library("1f1b", q=3)
    assert caught.value.exit_code == 2 and "unknown param 'q'" in caught.value.render()


def test_absurd_sizes_are_refused_by_the_expansion_limit():
    with pytest.raises(SchedError) as caught:
        compile_library("1f1b", p=4, m=10**9)
    assert "refusing" in caught.value.render()


def test_expansion_limit_is_an_option():
    from schedc.compiler import read_source as read
    from conftest import SCHEDULES
    with pytest.raises(SchedError):
        build_schedule(read(SCHEDULES / "1f1b.sched"), Options({"m": "100"}, max_ops=100))
