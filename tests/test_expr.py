"""expr: evaluation stays in finite real numbers of bounded size; what would leave them is a located error."""
from __future__ import annotations

import pytest

from schedc.driver import compile_source
from schedc.diagnostics import SchedError, Source
from schedc.frontend.elaborate import Options
from schedc.frontend import ast, expr
from schedc.frontend.expr import MAX_INT, EvalError, PipeRef, evaluate, evaluate_int, fold_constants
from schedc.frontend.parse import parse_source

TEMPLATE = """schedule x "x"
param p = 2
param m = 4
pipeline main {{ stages p; device s -> s; microbatches m }}
on device d {{
  let q = {expr}
  F * m
  B * m
}}
"""


def _expr(text: str):
    decl = parse_source(Source("e.sched", TEMPLATE.format(expr=text)))
    program = [d for d in decl.decls if type(d).__name__ == "Program"][0]
    return program.body[0].value


@pytest.mark.parametrize("text,message", [
    ("(0 - 2) ** 0.5", "a negative number to a fractional power has no real value"),
    ("(0 - 8) ** (1 / 3)", "a negative number to a fractional power has no real value"),
    ("1e308 * 10", "arithmetic overflow: the result is not a finite number"),
    ("1e308 * 10 - 1e308 * 10", "arithmetic overflow"),
    ("ceil(1e308 * 10)", "arithmetic overflow"),
    ("10 ** 64 * 10 ** 64", "integer result of 65 digits is too large"),
    ("-(10 ** 18 * 10)", "too large"),
    ("2.0 ** 64 ** 2", "too large"),
    ("1 / 0", "division by zero"),
    ("7 % 0", "division by zero"),
])
def test_results_leaving_finite_reals_are_refused(text, message):
    node = _expr(text)
    with pytest.raises(EvalError) as caught:
        evaluate(node, {})
    assert message in caught.value.message
    assert caught.value.span.line == 6


@pytest.mark.parametrize("text,value", [("(0 - 8) ** 2", 64), ("4 ** 0.5", 2.0), ("2 ** 62", 2 ** 62),
                                        ("1e308 / 10", 1e307), ("-(2 ** 62)", -(2 ** 62))])
def test_results_in_range_are_kept(text, value):
    assert evaluate(_expr(text), {}) == value


def test_sizes_are_bounded_before_allocation():
    node = _expr("m")
    assert evaluate_int(node, {"m": MAX_INT}, "count") == MAX_INT
    for huge in (MAX_INT + 1, 1e308, 10 ** 40):
        with pytest.raises(EvalError) as caught:
            evaluate_int(node, {"m": huge}, "microbatch count")
        assert "microbatch count" in caught.value.message and "too large" in caught.value.message
    with pytest.raises(EvalError, match="must be an integer, got nan"):
        evaluate_int(node, {"m": float("nan")}, "count")


@pytest.mark.parametrize("define", ["m=1e308", "m=100000000000000000000000000000"])
def test_huge_defines_are_located_errors(define):
    name, value = define.split("=")
    source = Source("e.sched", TEMPLATE.format(expr="1"))
    with pytest.raises(SchedError) as caught:
        compile_source(source, Options({name: value}))
    first = caught.value.render().splitlines()[0]
    # refused where the number enters: at the param it overrides (e.sched:3), a usage error
    assert caught.value.exit_code == 2 and first.startswith("e.sched:3:1: error: -D m=") and "too large" in first, first


def test_a_fractional_power_in_a_schedule_is_reported_where_it_is_written():
    with pytest.raises(SchedError) as caught:
        compile_source(Source("e.sched", TEMPLATE.format(expr="(p - 3) ** 0.5")))
    first = caught.value.render().splitlines()[0]
    assert first.startswith("e.sched:6:11: error:") and "no real value" in first, first


def _plainly(node, env):
    """An `and` chain evaluated as the language reads it: left first, the first falsy value or the last."""
    if isinstance(node, ast.Binary) and node.op == "and":
        value = _plainly(node.left, env)
        return value and _plainly(node.right, env)
    return evaluate(node, env)


@pytest.mark.parametrize("text", ["t % 6 == 2 and t >= 2 and t < 26", "t % 4 != 1 and t > 0 - 3",
                                  "t <= 7 and t % (0 - 5) == 0 - 2", "t == 3 and t % 2 == 1"])
def test_a_chain_of_one_names_comparisons_reads_as_the_plain_chain(text):
    # the chain compiles to one closure while t holds an int; each part alone is the general closure
    node = fold_constants(_expr(text), {})
    assert expr._atoms(node) is not None  # the one closure's shape
    for value in [*range(-40, 40), 2 ** 62, 0.5, 2.0, True, PipeRef("main")]:
        env = {"t": value}
        try:
            want = ("value", _plainly(node, env))
        except EvalError as exc:
            want = ("error", exc.message, exc.span)
        try:
            got = ("value", evaluate(node, env))
        except EvalError as exc:
            got = ("error", exc.message, exc.span)
        assert got == want and type(got[1]) is type(want[1])
    with pytest.raises(EvalError, match="unknown name 't'"):
        evaluate(node, {})
