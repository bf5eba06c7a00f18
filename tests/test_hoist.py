"""frontend/hoist.py: a loop of many rounds runs its body with its invariants folded in. The folded body
reads only the names the loop binds, and a program runs to the same orders, spans and diagnostics as
with every expression evaluated round by round (order.HOIST_ROUNDS past any loop)."""
from __future__ import annotations

import pytest

from conftest import SCHEDULES
from schedc.diagnostics import SchedError, Source
from schedc.frontend import ast, order
from schedc.frontend.elaborate import Options, elaborate
from schedc.frontend.expr import evaluate, free_names
from schedc.frontend.hoist import hoisted
from schedc.frontend.parse import parse_source

HEAD = """schedule s "s"
param p = 2
param m = 40
pipeline main { stages p; device s -> s; microbatches m }
"""


def _loop(program: str) -> ast.Loop:
    decl = parse_source(Source("s.sched", HEAD + program))
    body = next(d for d in decl.decls if isinstance(d, ast.Program)).body
    return next(stmt for stmt in body if isinstance(stmt, ast.Loop))


def test_the_names_a_body_never_binds_are_folded_in():
    loop = _loop("on device d {\n  for t in 0 .. 30 { if t % 6 == a % 6 and t < a + 6 * m { F at t } }\n}\n")
    (when,) = hoisted(loop, {"a": 2, "m": 4, "p": 2})
    assert free_names(when.test) == {"t"}
    for t in range(40):
        assert evaluate(when.test, {"t": t}) == (t % 6 == 2 and t < 26)
    assert when.test.span == loop.body[0].test.span


def test_a_name_the_body_binds_is_left_to_each_round():
    loop = _loop("on device d {\n  for t in 0 .. 30 { let a = t + m\n F at (a - m) }\n}\n")
    let, item = hoisted(loop, {"a": 7, "m": 4})
    assert free_names(let.value) == {"t"} and free_names(item.slot) == {"a"}
    assert evaluate(item.slot, {"a": 9}) == 5


PROGRAMS = {
    "v_half": (SCHEDULES / "v_half.sched").read_text(),
    "v_min": (SCHEDULES / "v_min.sched").read_text(),
    "shadowing let": HEAD + """on device d {
  let a = 1
  for k in 0 .. m { let a = k % 2 ;
    F ;
    if a == 0 { B } else if a == 1 and m > 3 { B } else { F } }
}
""",
    "division by zero late": HEAD + """on device d {
  for k in 0 .. m { F at (2 * k + 0 * (1 // (35 - k))) ; B at (2 * k + 1) }
}
""",
    "unknown name late": HEAD + """on device d {
  for k in 0 .. m { if k < 37 + d { F ; B } else { F[w] } }
}
""",
    "slot before the previous": HEAD + """on device d {
  for k in 0 .. m { F at (2 * k - m * (k == 33)) ; B at (2 * k + 1) }
}
""",
    "nested loops": HEAD + """on device d {
  for i in 0 .. m { for k in 0 .. 1 { F ; B if k % 2 == i % 2 or p > 1 } }
}
""",
}


def _outcome(text: str, params: dict):
    source = Source("s.sched", text)
    try:
        schedule = elaborate(parse_source(source), source, Options(params))
    except SchedError as exc:
        return str(exc)
    return [[(str(op), op.span.line, op.span.column) for op in o] for o in schedule.orders]


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_program_runs_alike_with_its_loops_folded_or_not(name, monkeypatch):
    params = {"p": "4", "m": "8"} if name.startswith("v_") else {}
    folded = _outcome(PROGRAMS[name], params)
    monkeypatch.setattr(order, "HOIST_ROUNDS", 10 ** 18)
    assert folded == _outcome(PROGRAMS[name], params)


def test_an_else_if_counts_as_a_statement_of_its_own():
    # the budget: 500,000 statements; the loop costs 1, then each round 1 and its if and else if 1 each,
    # so after 166,666 rounds 1 is left: the next round's count takes it and its `if` is refused
    text = HEAD + "on device d {\n  for k in 0 .. 1000000000 {\n    if k < 0 { F } else if k < 0 { F }\n  }\n}\n"
    with pytest.raises(SchedError) as caught:
        elaborate(parse_source(Source("s.sched", text)), Source("s.sched", text), Options({}))
    assert "s.sched:7:5: error: device 0: programs run more than 500,000 statements" in str(caught.value)
