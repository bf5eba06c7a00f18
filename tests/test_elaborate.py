"""Elaboration: the library's per-rank orders equal independent constructions of the published ones."""
from __future__ import annotations

from operator import attrgetter

import pytest

import reference_orders as ref
from conftest import FIXTURES, SCHEDULES, compile_library
from schedc.driver import build_schedule, read_source
from schedc.diagnostics import SchedError, Source
from schedc.frontend.elaborate import Options
from schedc.ir import OP_FIELDS, Op


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
    ("runaway_loop.sched", 6, 29, "device 0: programs run more than 500,000 statements (a runaway loop?)"),
    ("pop_loop.sched", 5, 41, "devices 0, 1: program pops F from an empty queue"),
])
def test_semantic_errors_are_located(fixture, line, column, text):
    with pytest.raises(SchedError) as caught:
        build_schedule(read_source(FIXTURES / fixture))
    exc = caught.value
    assert exc.exit_code == (2 if fixture == "runaway_loop.sched" else 1)  # a budget's refusal: usage (budget.py)
    first = exc.diagnostics[0]
    assert (first.span.line, first.span.column) == (line, column)
    assert text in first.message
    assert f"{FIXTURES / fixture}:{line}:{column}: error: " in exc.render()


def test_every_repeated_declaration_is_reported_at_the_repeat():
    with pytest.raises(SchedError) as caught:
        build_schedule(read_source(FIXTURES / "declared_twice.sched"))
    assert caught.value.exit_code == 1
    assert [(d.span.line, d.span.column, d.message) for d in caught.value.diagnostics] == [
        (4, 1, "param 'p' is declared twice (first at line 3)"),
        (7, 1, "the cost of F is declared twice (first at line 6)"),
        (9, 1, "the queue of B is declared twice (first at line 8)"),
        (11, 1, "task 'probe' is declared twice (first at line 10)"),
        (12, 26, "task 'probe' in `fill bubbles with` is declared twice (first at line 12)"),
    ]


MERGED = """schedule two "fill lists join; a split backward may be said twice"
param p = 2
param m = 2
pipeline main { stages p; device s -> s; microbatches m }
backward split
backward split
memory I(s) = 0.3
task x(s, i) = 1 after F(s, i)
task y(s) = 1 after x(s, *)
fill bubbles with x
fill bubbles with y
on device d { F * m ; I * m ; W * m }
"""


def test_repeats_that_are_joined_stay_legal_and_memory_b_is_i_with_a_split_backward():
    schedule = build_schedule(Source("two.sched", MERGED))
    assert schedule.split_backward and [name for name, _ in schedule.fill] == ["x", "y"]
    with pytest.raises(SchedError) as caught:
        build_schedule(Source("two.sched", MERGED.replace("memory I(s) = 0.3\n", "memory I(s) = 0.3\nmemory B = 1\n")))
    (diag,) = caught.value.diagnostics
    assert diag.span.line == 8 and "memory of I (`memory B` with a split backward) is declared twice" in diag.message


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
    from schedc.driver import read_source as read
    from conftest import SCHEDULES
    with pytest.raises(SchedError):
        build_schedule(read(SCHEDULES / "1f1b.sched"), Options({"m": "100"}, max_ops=100))


# --- ops built by column and queues sorted by column equal their op-by-op definitions -------------

KEYED = '''schedule keyed "queue keys reading every name, two pipelines of two chunks per device"
param p = 4
param m = 8
pipeline down { stages 2 * p; device s -> s % p;             microbatches 0 .. m // 2 }
pipeline up   { stages 2 * p; device s -> p - 1 - s % p;     microbatches m // 2 .. m }
replicate down, up
cost B(s) = 2 + s / 10
queue F by (c, -d, i % 3, s)
queue F.up by (-i, s)
queue B by (pipe == down, -(i // 3))
on device d {
  F.down * m
  F.up * m
  B * (2 * m)
}
'''


def test_ops_made_by_column_have_every_field_of_ops_made_one_by_one():
    schedule = build_schedule(Source("keyed.sched", KEYED))
    expected = [Op(kind, s, mb, k, 0, pipe.placement[s], schedule.costs[kind][s])
                for k, pipe in enumerate(schedule.pipelines) for s in range(pipe.stages)
                for mb in pipe.microbatches for kind in ("F", "B")]
    but_span = attrgetter(*(name for name in OP_FIELDS if name != "span"))
    assert list(map(but_span, schedule.deps.ops)) == list(map(but_span, expected))
    assert {id(op) for op in schedule.deps.ops} == {id(op) for op in schedule.ops()}  # one object per op
    every_field = attrgetter(*OP_FIELDS)
    made = {op: op for op in expected}
    lines = {"F": {0: 12, 1: 13}, "B": {0: 14, 1: 14}}  # the program line that placed each op
    for op in schedule.ops():
        assert every_field(op)[:7] == every_field(made[op])[:7] and op.parts == 1
        assert op.span.line == lines[op.kind][op.pipe] and hash(op) == hash(made[op])


def test_op_has_no_init_hook_that_columns_would_skip():
    """ops_from_columns fills slots directly, skipping the dataclass __init__: safe while Op has no
    __post_init__ (or a custom __init__) to run."""
    assert not hasattr(Op, "__post_init__")
    assert Op.__init__.__code__.co_filename == "<string>"  # the one dataclass generated, nothing custom


def _popped(ops, key):
    """Ops in the order a queue pops them: by its key, ties broken by pipe, stage, microbatch and part."""
    return sorted(ops, key=lambda op: (*key(op), op.pipe, op.stage, op.mb, op.part))


def test_queues_sort_like_their_keys_evaluated_op_by_op():
    schedule = build_schedule(Source("keyed.sched", KEYED))
    p = 4
    for d, order in enumerate(schedule.orders):
        mine = [op for op in schedule.deps.ops if op.device == d]
        forwards = _popped([op for op in mine if op.kind == "F"],
                           lambda op: (op.stage // p, -op.device, op.mb % 3, op.stage))  # c is s // p here
        up = _popped([op for op in forwards if op.pipe == 1], lambda op: (-op.mb, op.stage))
        backwards = _popped([op for op in mine if op.kind == "B"], lambda op: (op.pipe == 0, -(op.mb // 3)))
        assert list(order) == [op for op in forwards if op.pipe == 0] + up + backwards


@pytest.mark.parametrize("body,column", [
    ("for k in 0 .. 1000000000 { }", 3),
    ("() * 1000000000", 3),
    ("for k in 0 .. 100000 { for j in 0 .. 100000 { } }", 26),
])
def test_loops_that_run_nothing_still_count_against_the_budget(body, column):
    from schedc.diagnostics import Source
    text = ('schedule x "x"\nparam p = 2\nparam m = 2\npipeline main { stages p; device s -> s; microbatches m }\n'
            f"on device d {{\n  {body}\n  F * m ; B * m\n}}\n")
    with pytest.raises(SchedError) as caught:
        build_schedule(Source("loop.sched", text))
    first = caught.value.diagnostics[0]
    assert (first.span.line, first.span.column) == (6, column), first
    assert "programs run more than 500,000 statements (a runaway loop?)" in first.message


@pytest.mark.parametrize("name,params,message", [
    # a split backward has three ops per stage and microbatch: 8 x 43,691 x 3 passes the limit, x 2 would not
    ("zbv", dict(m=43691), "zbv.sched:11:1: error: schedule would expand to more than 1,048,576 ops (8 stages x 43,691 "
                           "microbatches x 3 op kinds); refusing (--max-ops N raises the limit"),
    ("1f1b", dict(p=8, m=65537), "1f1b.sched:9:1: error: schedule would expand to more than 1,048,576 ops (8 stages x "
                                 "65,537 microbatches x 2 op kinds); refusing (--max-ops N raises the limit"),
    ("gpipe", dict(p=16385, m=1), "gpipe.sched:4:1: error: param p is the device count and must be an integer "
                                  "1..16,384, got 16385"),
])
def test_the_expansion_limit_counts_every_op_kind_and_bounds_the_devices(name, params, message):
    with pytest.raises(SchedError) as caught:
        compile_library(name, **params)
    # too many ops is a budget's refusal, naming --max-ops; a -D p no device count the command line's: both 2
    assert message in caught.value.render() and caught.value.exit_code == 2


def test_tasks_count_against_the_expansion_limit_before_they_are_made():
    """A task of 1,024 pieces per stage and microbatch on 1F1B at p=4, m=100 (800 built-in ops) would make
    409,600 ops, and one after F(s, *) 100 dependency entries each: refused at the task's declaration."""
    text = (read_source(__import__("conftest").SCHEDULES / "1f1b.sched").text
            + "task t(s, i) = 1 after F(s, *) split 1024\n")
    with pytest.raises(SchedError) as caught:
        build_schedule(Source("t.sched", text), Options({"m": "100"}, max_ops=200_000))
    rendered = caught.value.render()
    assert "t.sched:17:1: error: task 't' would expand the schedule past 200,000 ops and dependency entries (its ops," \
        in rendered, rendered
    with pytest.raises(SchedError) as caught:
        build_schedule(Source("t.sched", text.replace("split 1024", "split 1")), Options({"m": "100"}, max_ops=10_000))
    assert "error: task 't' would expand the schedule past 10,000 ops and dependency entries (its dependencies," \
        in caught.value.render()


@pytest.mark.parametrize("op", ["F(0)", "F(0, 1, 2)"])
def test_a_built_in_op_named_with_other_than_two_numbers_says_what_it_takes(op):
    """F(0) read as 'not an op of this device'; a task of one stage param may be t(0), F may not."""
    text = ('schedule x "x"\nparam p = 2\nparam m = 2\npipeline main { stages p; device s -> s; microbatches m }\n'
            f"on device d {{ {op} }}\n")
    with pytest.raises(SchedError) as caught:
        build_schedule(Source("t.sched", text))
    assert "F(...) takes a stage and a microbatch" in caught.value.render()


@pytest.mark.parametrize("op,why", [
    ("F(0, 5)", "microbatch 5 is not one of pipeline 'main' (0..1)"),
    ("F(1, 0)", "(it runs on device 1)"),
    ("F(7, 0)", "stage 7 is outside 0..1"),
])
def test_a_named_op_of_no_such_or_another_device_says_which(op, why):
    text = ('schedule x "x"\nparam p = 2\nparam m = 2\npipeline main { stages p; device s -> s; microbatches m }\n'
            f"on device 0 {{ {op} }}\non device 1 {{ F B F B }}\n")
    with pytest.raises(SchedError) as caught:
        build_schedule(Source("t.sched", text))
    assert f"is not an op of this device{'' if why.startswith('(') else ':'} {why}" in caught.value.render()


@pytest.mark.parametrize("costs,got", [({"B": -3.0}, "-3"), ({"F": [1.0, float("nan"), 1.0, 1.0]}, "nan"),
                                       ({"W": 2e15}, "2e+15")])
def test_measured_costs_obey_the_declared_costs_range(costs, got):
    """Measured costs given through the API (not only a costs file) meet the one range rule of every
    cost (ops.in_cost_range): a negative one made a later send end first."""
    name = "zb_h1" if "W" in costs else "1f1b"
    with pytest.raises(SchedError) as caught:
        build_schedule(read_source(SCHEDULES / f"{name}.sched"), Options({"p": "4", "m": "8"}, costs))
    kind = next(iter(costs))
    assert f"error: measured cost of {kind} must be a finite number >= 0 and at most 1e+15, got {got}" in str(
        caught.value)


def test_a_param_with_an_integral_value_is_that_integer_however_written(tmp_path):
    """`param p = 4.0` in a file is the device count 4, as -D p=4.0 and -D p=4e0 are; 4.5 is refused."""
    text = (SCHEDULES / "1f1b.sched").read_text()
    path = tmp_path / "float_p.sched"
    path.write_text(text.replace("param p = 4 ", "param p = 4.0 "))
    declared = build_schedule(read_source(path))
    given = build_schedule(read_source(SCHEDULES / "1f1b.sched"), Options({"p": "4e0"}))
    assert declared.params["p"] == given.params["p"] == 4 and type(declared.params["p"]) is int
    assert declared.orders == given.orders
    path.write_text(text.replace("param p = 4 ", "param p = 4.5 "))
    with pytest.raises(SchedError, match="param p is the device count and must be an integer 1..16,384, got 4.5"):
        build_schedule(read_source(path))
