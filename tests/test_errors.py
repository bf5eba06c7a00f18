"""errors: one root per side. The compiler raises SchedError with a kind whose exit code is decided in
one table; the runtime's user errors all derive from runtime.errors.UserError, which its entry point
reports once (exit 1; 2 for options), never as a traceback."""
from __future__ import annotations

import ast

import pytest

from conftest import ROOT
from schedc.diagnostics import EXIT_CODES, SCHEDULE, USAGE, SchedError, error, exit_code, usage

RUN_FAILURES = {"ExecutionError", "RecomputeError", "ChunkError", "OffloadError", "ExchangeError"}  # a rank failing while it runs: each rank reports its own


def test_a_sched_error_exits_by_its_kind():
    assert (EXIT_CODES[USAGE], EXIT_CODES[SCHEDULE]) == (2, 1)
    assert SchedError(error("bad")).exit_code == 1 and usage("--tp 0").exit_code == 2
    assert SchedError(error("bad"), kind=USAGE).exit_code == 2
    assert exit_code([error("x")]) == 1 and exit_code([]) == 0
    with pytest.raises(KeyError):
        _ = SchedError(error("x"), kind="other").exit_code


def test_no_raise_site_sets_an_exit_code():
    """The kind says what an error is; no raise site picks a number (`exit_code=2` was written at 53)."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "schedc").rglob("*.py") if "exit_code=" in p.read_text()]
    assert offenders == []


def test_every_user_error_of_the_runtime_derives_from_its_root():
    classes = {}
    for path in (ROOT / "schedc" / "runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                classes[node.name] = [ast.unparse(b) for b in node.bases]
    assert len(classes) >= 9 and classes["UserError"] == ["ValueError"]
    strays = {name: bases for name, bases in classes.items()
              if name not in RUN_FAILURES | {"UserError"} and bases != ["UserError"]}
    assert strays == {}
