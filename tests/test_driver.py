"""driver: the one way into the compiler. A pass added to PASSES runs under every way in: compile of a
.sched file, render (and simulate) of a plan.json, simulate --cluster and tune, which each run their
named subset of PASSES at the call. The input kinds are chosen in one place."""
from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.diagnostics import warning
from schedc.driver import PLAN, SCHEDULE, TORCH_CSV, kind_of
from schedc.driver import passes

MODEL = """layers = 8
hidden = 1024
heads = 16
seq = 512
vocab = 8192
"""


@pytest.fixture
def seen(monkeypatch) -> list[str]:
    """A dummy pass appended to PASSES: it records the schedule it saw and leaves a warning."""
    names: list[str] = []

    def _dummy(u: passes.Unit) -> passes.Unit:
        names.append(u.schedule.name)
        return replace(u, diagnostics=u.diagnostics + (warning("the dummy pass ran"),))

    monkeypatch.setattr(passes, "PASSES", passes.PASSES + (_dummy,))
    return names


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_an_added_pass_runs_under_compile(seen, tmp_path):
    result = run("compile", "1f1b", "-D", "p=2", "-D", "m=4", "-o", str(tmp_path / "plan"))
    assert result.exit_code == 0, result.output
    assert seen == ["one_f_one_b"] and "the dummy pass ran" in result.output


def test_an_added_pass_runs_under_render_and_simulate_of_a_plan(seen, tmp_path):
    assert run("compile", "1f1b", "-D", "p=2", "-D", "m=4", "-o", str(tmp_path / "plan")).exit_code == 0
    seen.clear()
    drawn = run("render", str(tmp_path / "plan" / "plan.json"), "-o", str(tmp_path / "t.dot"))
    assert drawn.exit_code == 0, drawn.output
    assert seen == ["one_f_one_b"]
    seen.clear()
    assert run("simulate", str(tmp_path / "plan" / "plan.json")).exit_code == 0
    assert seen == ["one_f_one_b"]


def test_an_added_pass_runs_under_simulate_on_a_cluster(seen, tmp_path):
    model = tmp_path / "m.toml"
    model.write_text(MODEL)
    result = run("simulate", "1f1b", "-D", "p=2", "-D", "m=8", "--model", str(model), "--cluster", "dgx-a100-80gb",
                 "--microbatch-size", "1")
    assert result.exit_code == 0, result.output
    assert "one_f_one_b" in seen and "the dummy pass ran" in result.output


def test_an_added_pass_runs_under_tune(seen, tmp_path):
    model = tmp_path / "m.toml"
    model.write_text(MODEL)
    result = run("tune", "--model", str(model), "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "16",
                 "--schedules", "1f1b", "--tp", "1", "--top", "2", "--json")
    assert result.exit_code == 0, result.output
    assert seen and set(seen) == {"one_f_one_b"}  # once per order the search times, of the one schedule


def test_each_subset_leaves_out_only_what_it_has_no_use_for():
    every = set(passes.PASSES)
    assert every - set(passes.analysis()) == set(passes.LOWERING)
    assert every - set(passes.replay()) == set(passes.LOWERING) | set(passes.FILLED)
    assert every - set(passes.untimed()) == set(passes.LOWERING) | set(passes.TIMED)


@pytest.mark.parametrize("name,kind", [("1f1b", SCHEDULE), ("x/y.sched", SCHEDULE), ("rows.csv", TORCH_CSV),
                                       ("out/plan.json", PLAN)])
def test_kind_of_reads_the_name(name, kind):
    assert kind_of(name) == kind


def test_an_added_pass_runs_under_check(seen, tmp_path):
    result = run("check", "1f1b", "-D", "p=2", "-D", "m=4")
    assert result.exit_code == 0, result.output
    assert seen == ["one_f_one_b"] and "the dummy pass ran" in result.output


def test_checks_optional_checks_are_passes_that_its_options_select(monkeypatch):
    """--placement and --model/--memory-limit select passes of PASSES (no check runs beside them): with
    the two passes taken out of PASSES the same options find nothing."""
    assert {passes._check_placement, passes._check_memory_bytes} <= set(passes.PASSES)
    assert passes._check_memory_bytes in passes.TIMED  # it reads the timing: not tune's untimed subset
    args = ("check", "1f1b", "-D", "p=2", "-D", "m=4", "--placement", "v")
    refused = run(*args)
    assert refused.exit_code == 1 and "the v placement" in refused.output
    assert run("check", "1f1b", "-D", "p=2", "-D", "m=4").exit_code == 0
    kept = tuple(p for p in passes.PASSES if p not in (passes._check_placement, passes._check_memory_bytes))
    monkeypatch.setattr(passes, "PASSES", kept)
    assert run(*args).exit_code == 0


@pytest.mark.parametrize("name", ["1f1b", "x/y.sched", "rows.csv", "out/plan.json", "plan.json.sched", "a.JSON"])
def test_the_command_line_asks_the_driver_what_a_file_is(name):
    from schedc.cli.common import is_plan
    assert is_plan(name) == (kind_of(name) == PLAN)


def test_the_process_exits_in_one_module_of_the_command_line():
    """sys.exit and SystemExit appear in cli/common.py alone (end: finish and fail call it; tune, demo, run
    and the group's closed pipe too)."""
    from pathlib import Path
    import re
    cli = Path(__file__).resolve().parent.parent / "schedc" / "cli"
    exits = sorted(p.name for p in cli.glob("*.py") if re.search(r"\bsys\.exit\(|\bSystemExit\(", p.read_text()))
    assert exits == ["common.py"]
