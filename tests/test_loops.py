"""frontend/loops.py: a loop of many rounds runs as one generated function. Every program below (the
library's loops over a grid of params, and programs written to reach each branch of the generator and
each fault inside a loop) gives the same orders, spans, unit slots, overlapped pairs and diagnostics as
with every statement interpreted (order._ProgramRun.COMPILED off), and so do the orders' starts."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import SCHEDULES
from schedc.diagnostics import SchedError, Source
from schedc.frontend import elaborate as elaborate_module, loops, order
from schedc.frontend.elaborate import Options, elaborate
from schedc.frontend.parse import parse_source
from schedc.frontend.prefix import BACKWARDS, order_starts

HEAD = """schedule s "s"
param p = 2
param m = 40
pipeline main { stages p; device s -> s; microbatches m }
"""

V_HEAD = """schedule s "s"
param p = 2
param m = 40
pipeline main { stages 2 * p; device s -> s if s < p else 2 * p - 1 - s; microbatches m }
"""  # two chunks per device in a V

PROGRAMS = {
    "lets in a round and in a branch": HEAD + """on device d {
  let a = 1
  for k in 0 .. m { let a = k % 2 ;
    F at (2 * k) ;
    if a == 0 { let b = a + 1 ; B at (2 * k + b) } else if a == 1 and m > 3 { B } else { F } }
}
""",
    "a let rebinds the loop's variable": HEAD + """on device d {
  for k in 0 .. m { F at (2 * k) ; let k = k * 2 + 1 ;
    if k % 4 == 1 and k >= 0 { B at k } else { B at (k + 0.5 * (k > 70)) } }
}
""",
    "optional pops and conditions": HEAD + """backward split
on device d {
  for k in 0 .. 2 * m { F? if k % 2 == 0 ; I? at (k + 100) if k % 2 == 1 ; W? }
}
""",
    "a test on a float": HEAD + """on device d {
  for k in 0 .. 2 * m { let h = k / 2 ;
    if h % 1 == 0 and h < m { F } else if h >= 0 { B? } }
}
""",
    "a test of two names": HEAD + """on device d {
  for k in 0 .. m { let j = k ;
    if k >= 0 and j < m and k % 1 == 0 { F ; B } }
}
""",
    "repeats and groups": HEAD + """on device d {
  for k in 0 .. m // 2 { F * 2 ; (B) * 1 ; (F B)? * 0 }
  for k in 0 .. m { B? * 3 }
}
""",
    "an inner loop of many rounds": HEAD + """on device d {
  for i in 0 .. 32 { for k in 0 .. 35 { F? if i == k % 32 ; B? at (i * 100 + k) if i == k } }
  F? * m ; B? * m
}
""",
    "division by zero late": HEAD + """on device d {
  for k in 0 .. m { F at (2 * k + 0 * (1 // (35 - k))) ; B at (2 * k + 1) }
}
""",
    "a test fails late": HEAD + """on device d {
  for k in 0 .. m { if k % (36 - k) == 0 or k < m { F ; B } }
}
""",
    "unknown name late": HEAD + """on device d {
  for k in 0 .. m { if k < 37 + d { F ; B } else { F[w] } }
}
""",
    "an arity error never reached": HEAD + """on device d {
  for k in 0 .. m { if k < m { F ; B } else { F at abs(1, 2) } }
}
""",
    "slot before the previous": HEAD + """on device d {
  for k in 0 .. m { F at (2 * k - m * (k == 33)) ; B at (2 * k + 1) }
}
""",
    "a slot that is a float": HEAD + """on device d {
  for k in 0 .. m { let s = 2 * k + 0.0 ;
    F at s ; B at (s + 1) }
}
""",
    "a slot that is not an integer": HEAD + """on device d {
  for k in 0 .. m { F at (2 * k + 0.5 * (k == 30)) ; B at (2 * k + 1) }
}
""",
    "an empty queue": HEAD + """on device d {
  for k in 0 .. m + 1 { F ; B }
}
""",
    "an empty optional queue": HEAD + """on device d {
  for k in 0 .. m + 5 { F? ; B? }
}
""",
    "a named op twice": HEAD + """on device d {
  for k in 0 .. m { F(d, k) ; B(d, k % 30) }
}
""",
    "a runaway loop": HEAD + """on device d {
  for k in 0 .. 1000000000 { if k < 0 { F } else if k < 0 { F } }
}
""",
    "a runaway loop of pops": HEAD + """on device d {
  for k in 0 .. 1000000000 { F? at k }
}
""",
    "chunks": V_HEAD + """on device d {
  for k in 0 .. 2 * m { if k % 2 == 0 { F[0] ; F[1] } else { B[1] ; B[0] ; F[2]? } }
}
""",
    "choices": V_HEAD + """backward split
on device d {
  for k in 0 .. 2 * m { F[0]? ; F[1]? ; (I[1] | I[0])? at (k * 10 + 5) ; (W[0] | W[1] | F[3])? ; (I[0] | W[1]) }
}
""",
    "mixed backward": V_HEAD + """backward mixed
on device d {
  for k in 0 .. m { F[0] ; F[1] ; I[1] ; B[0] ; (W[1] | W[0])? ; W? }
  W? * m
}
""",
    "overlapped pairs": V_HEAD + """on device d {
  F[0] ; F[1] ; F[0] ; F[1]
  for k in 0 .. m - 2 { F[0] & B[1] ; F[1] & B[0] }
  B[1] * 2 ; B[0] * 2
}
""",
}
LIBRARY = {
    "v_min": [{"p": p, "m": m} for p in ("2", "3", "4", "6") for m in ("1", "6", "7")],
    "v_half": [{"p": p, "m": m} for p in ("2", "3", "4", "6") for m in ("1", "6", "7")],
    "dualpipe": [{"p": "4", "m": m} for m in ("8", "40")] + [{"p": "8", "m": "64"}],
    "dualpipev": [{"p": "4", "m": m} for m in ("8", "40")] + [{"p": "8", "m": "64"}],
    "chimera": [{"p": "4", "m": m} for m in ("4", "128")],
}


def _outcome(text: str, params: dict, compiled: bool, monkeypatch) -> object:
    """The orders (each op with its span and unit slot) and overlapped pairs, or the error's text."""
    monkeypatch.setattr(order._ProgramRun, "COMPILED", compiled)
    slots: list = []

    def run_programs(*args, **kwargs):
        found = order.run_programs(*args, **kwargs)
        slots.append([list(each) for each in args[9]])  # each device's unit slots, as they were placed
        return found
    monkeypatch.setattr(elaborate_module, "run_programs", run_programs)
    source = Source("s.sched", text)
    try:
        schedule = elaborate(parse_source(source), source, Options(params))
    except SchedError as exc:
        return str(exc)
    return ([[(str(op), op.span) for op in o] for o in schedule.orders], [(str(f), str(b)) for f, b in schedule.fused],
            slots)


def _alike(text: str, params: dict, monkeypatch) -> object:
    """The outcome both ways, asserted equal; and whether a loop ran as a generated function."""
    made = []
    monkeypatch.setattr(order, "compiled", lambda *args: made.append(loops.compiled(*args)) or made[-1])
    plain = _outcome(text, params, False, monkeypatch)
    assert not made
    fast = _outcome(text, params, True, monkeypatch)
    assert fast == plain
    return fast, any(made)


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_program_runs_alike_compiled_or_interpreted(name, monkeypatch):
    _, compiled = _alike(PROGRAMS[name], {}, monkeypatch)
    assert compiled


@pytest.mark.parametrize("name, params", [(n, p) for n, grid in LIBRARY.items() for p in grid])
def test_the_library_runs_alike_compiled_or_interpreted(name, params, monkeypatch):
    outcome, compiled = _alike((SCHEDULES / f"{name}.sched").read_text(), params, monkeypatch)
    assert not isinstance(outcome, str) and sum(map(len, outcome[0])) > 0
    assert compiled or not (int(params["m"]) >= 6 and name in ("v_min", "v_half") or params["m"] == "128")


def test_the_faults_inside_loops_are_the_interpreters():
    messages = {name: _outcome(text, {}, True, pytest.MonkeyPatch()) for name, text in PROGRAMS.items()}
    assert "s.sched:6:40: error: devices 0, 1: division by zero" in messages["division by zero late"]
    assert "programs run more than 500,000 statements" in messages["a runaway loop"]
    assert "programs run more than 500,000 statements" in messages["a runaway loop of pops"]
    assert "unknown name 'w'" in messages["unknown name late"]
    assert "is placed twice" in messages["a named op twice"]
    assert "from an empty queue" in messages["an empty queue"]
    assert "slot must be an integer, got 60.5" in messages["a slot that is not an integer"]
    assert not isinstance(messages["an arity error never reached"], str)


def test_the_starts_of_orders_are_alike(monkeypatch):
    for name, params in (("v_min", {"p": "4", "m": "8"}), ("v_half", {"p": "6", "m": "7"})):
        source = Source(f"{name}.sched", (SCHEDULES / f"{name}.sched").read_text())
        decl = parse_source(source)
        starts = []
        for compiled in (False, True):
            monkeypatch.setattr(order._ProgramRun, "COMPILED", compiled)
            starts.append(order_starts(decl, source, params, BACKWARDS))
        assert starts[0] == starts[1]


ITEMS = st.sampled_from(["F", "B", "F?", "B?", "F at (2 * k)", "B? at (2 * k + 1)", "F if k % 3 == 1",
                         "(F B)?", "F * (k % 2)", "B? * 2"])
TESTS = st.sampled_from(["k % 2 == 0", "k % 3 == 1 and k >= 4", "k < m // 2", "k % 2 == 0 and k < 30 and k != 6",
                         "k > 1000", "d == 0 or k < 3", "k / 2 == 3"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(ITEMS, min_size=1, max_size=3), test=TESTS, then=st.lists(ITEMS, min_size=1, max_size=2),
       orelse=st.lists(ITEMS, max_size=2), rounds=st.integers(30, 90))
def test_generated_loops_run_alike(first, test, then, orelse, rounds, monkeypatch):
    text = HEAD + (f"on device d {{\n  for k in 0 .. {rounds} {{ {' ; '.join(first)}\n"
                   f"    if {test} {{ {' ; '.join(then)} }} else {{ {' ; '.join(orelse)} }} }}\n  F? * m ; B? * m\n}}\n")
    _alike(text, {}, monkeypatch)
