"""cli: the commands, their exit codes (0 ok, 1 wrong schedule, 2 usage/syntax) and no tracebacks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, ROOT
from schedc.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_compile_writes_plan_and_rank_streams(tmp_path):
    result = run("compile", "1f1b", "-D", "p=4", "-D", "m=8", "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "bubble 0.3750" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "rank0.txt", "rank1.txt", "rank2.txt",
                                                           "rank3.txt"]


def test_simulate_json_prints_the_stats_object():
    result = run("simulate", "interleaved_1f1b", "-D", "p=4", "-D", "v=2", "-D", "m=8", "--json")
    assert result.exit_code == 0
    stats = json.loads(result.output)
    assert stats["bubble_fraction"] == pytest.approx(3 / 16)
    assert {"makespan", "utilization", "busy", "idle", "peak_memory"} <= set(stats)


def test_list_shows_the_library_with_params():
    result = run("list")
    for name in ("gpipe", "1f1b", "interleaved_1f1b", "chimera"):
        assert name in result.output
    assert "-D v=2" in result.output


@pytest.mark.parametrize("args,code,where", [
    (["compile", str(FIXTURES / "syntax_error.sched")], 2, "syntax_error.sched:4:1: error:"),
    (["compile", str(FIXTURES / "pop_empty.sched")], 1, "pop_empty.sched:7:3: error:"),
    (["compile", str(FIXTURES / "bad_device.sched")], 1, "bad_device.sched:4:31: error:"),
    (["compile", "1f1b", "-D", "q=1"], 2, "unknown param 'q'"),
    (["compile", "1f1b", "-D", "p=x"], 2, "value must be a number"),
    (["compile", "no/such/file.sched"], 2, "cannot read file"),
    (["simulate", "1f1b", "-D", "m=1000000000"], 1, "refusing"),
])
def test_errors_exit_with_the_right_code_and_location(args, code, where):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == code
    assert where in result.output
    assert "Traceback" not in result.output


def test_help_answers_without_importing_the_compiler():
    code = ("import sys; from schedc.cli import main\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('lark', 'torch', 'schedc.frontend.elaborate'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_compile_never_imports_torch(tmp_path):
    code = ("import sys; from schedc.cli import main\n"
            f"try: main(['compile', 'chimera', '-o', {str(tmp_path)!r}])\nexcept SystemExit: pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("costs,where", [
    ('{"F": 1, "B": -2}', "cost of 'B' must be a finite number >= 0, got -2"),
    ('{"F": NaN, "B": 2}', "cost of 'F' must be a finite number >= 0, got nan"),
    ('{"F": [1, Infinity, 1, 1], "B": 2}', "cost of 'F' at stage 1 must be a finite number >= 0, got inf"),
    ('{"F": 1, "B": 2, "memory": {"B": -1}}', "memory of 'B' must be a finite number >= 0, got -1"),
])
def test_measured_costs_must_be_finite_and_not_negative(tmp_path, costs, where):
    path = tmp_path / "costs.json"
    path.write_text(costs)
    result = CliRunner().invoke(main, ["simulate", "1f1b", "--costs", str(path)])
    assert result.exit_code == 2
    assert f"{path}: error: {where}" in result.output
    assert "Traceback" not in result.output


def test_a_profile_cell_that_is_not_a_number_is_refused(tmp_path):
    path = tmp_path / "profile.csv"
    path.write_text("bs,time_f,time_b\n1,1.5,oops\n")
    result = CliRunner().invoke(main, ["simulate", "1f1b", "--profile", str(path), "--microbatch-size", "1"])
    assert result.exit_code == 2
    assert f"{path}: error: profile column time_b must be a finite number >= 0, got 'oops'" in result.output
    assert "Traceback" not in result.output


def test_compile_check_and_render_read_a_profile_row(tmp_path):
    profile = str(ROOT / "tests" / "data" / "bert-large_time_memory_v100.csv")
    row = ["--profile", profile, "--microbatch-size", "32"]
    compiled = run("compile", "pipefisher", *row, "-o", str(tmp_path / "plan"))
    assert compiled.exit_code == 0, compiled.output
    assert "utilization 0.6859 -> 0.9649 (0.9572 without the overhead of cut pieces)" in run("simulate", "pipefisher", "-D", "p=8", "-D", "m=8", *row).output
    assert run("check", "pipefisher", *row).exit_code == 0
    assert run("render", str(tmp_path / "plan" / "plan.json"), *row, "-o", str(tmp_path / "t.svg")).exit_code == 0
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("args,message", [
    (["--microbatch-size", "32"], "give --profile too"),
    (["--costs", "c.json", "--profile", "p.csv"], "--costs or as --profile, not both"),
    (["--costs", str(ROOT / "tests" / "data" / "bert-large_time_memory_v100.csv")], "is read with --profile"),
])
def test_measured_cost_options_that_do_not_fit_together_are_refused(args, message):
    result = CliRunner().invoke(main, ["compile", "1f1b", *args])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_a_full_disk_on_export_is_a_usage_error_and_a_device_is_never_replaced():
    import stat
    result = CliRunner().invoke(main, ["export", "1f1b", "-o", "/dev/full"])  # every write: ENOSPC
    assert result.exit_code == 2 and "no space left" in result.output.lower(), result.output
    assert stat.S_ISCHR(Path("/dev/full").stat().st_mode) and not Path("/dev/full.tmp").exists()


@pytest.mark.parametrize("define,message", [
    ("m=1e309", "-D m=1e309: value must be a finite number"),
    ("m=nan", "-D m=nan: value must be a finite number"),
    ("m=99999999999999999999999999999", "-D m=999999999999999999999999...: value is too large"),
    ("p=1e300", "-D p=1e300: value is too large"),
    ("p=2.5", "param p is the device count and must be an integer 1..16,384, got 2.5"),
])
def test_defines_are_range_checked_at_the_param(define, message):
    result = CliRunner().invoke(main, ["check", "1f1b", "-D", define])
    first = result.output.splitlines()[0]
    assert result.exit_code in (1, 2) and message in first and "1f1b.sched:" in first, result.output
    line = int(first.split("1f1b.sched:")[1].split(":")[0])
    assert (ROOT / "schedules" / "1f1b.sched").read_text().splitlines()[line - 1].startswith("param")


def test_defines_with_integral_float_values_are_integers():
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "m=1e1", "-D", "p=2.0", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["ops"] == 2 * 2 * 10


@pytest.mark.parametrize("latency", ["nan", "-1", "inf", "1e308"])
def test_latency_must_be_finite_and_not_negative(latency):
    result = CliRunner().invoke(main, ["simulate", "1f1b", "--latency", latency])
    assert result.exit_code == 2 and "Invalid value for '--latency': must be a finite number >= 0" in result.output


def test_costs_too_large_to_sum_are_refused(tmp_path):
    source = tmp_path / "big.sched"
    source.write_text((ROOT / "schedules" / "gpipe.sched").read_text() + "\ncost F = 1e308\n")
    result = CliRunner().invoke(main, ["simulate", str(source)])
    assert result.exit_code == 1 and f"{source}:" in result.output and "is too large (at most 1e+15" in result.output
    costs = tmp_path / "costs.json"
    costs.write_text('{"F": 1e308}')
    result = CliRunner().invoke(main, ["simulate", "gpipe", "--costs", str(costs)])
    assert result.exit_code == 2 and "cost of 'F' must be a finite number >= 0, got 1e+308 (at most 1e+15)" in result.output


@pytest.mark.parametrize("command", [["compile", "1f1b", "-o", "{out}"], ["render", "1f1b", "-o", "{out}/x.dot"],
                                     ["export", "1f1b", "-o", "{out}/x.csv"]])
def test_every_output_path_makes_its_directory_or_says_why_not(tmp_path, command):
    fresh = [a.replace("{out}", str(tmp_path / "new" / "dir")) for a in command]
    assert CliRunner().invoke(main, fresh).exit_code == 0
    (tmp_path / "file").write_text("x")
    blocked = [a.replace("{out}", str(tmp_path / "file" / "sub")) for a in command]
    result = CliRunner().invoke(main, blocked)
    assert result.exit_code == 2 and f"{tmp_path / 'file'} is not a directory" in result.output, result.output
    assert "Traceback" not in result.output and not list(tmp_path.rglob("*.tmp"))


def test_a_full_disk_on_compile_leaves_no_partial_plan(tmp_path):
    """A 16 KiB file system (a tmpfs, where this process may mount one; else /dev/full's directory
    cannot be made, which is refused the same way)."""
    import subprocess
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(small)],
                             capture_output=True).returncode == 0
    try:
        out = small / "out" if mounted else Path("/dev/full/out")
        result = CliRunner().invoke(main, ["compile", "1f1b", "-D", "p=8", "-D", "m=64", "-o", str(out)])
        assert result.exit_code == 2 and f"cannot write {out}" in result.output, result.output
        assert not mounted or "no space left on the device" in result.output
        assert not list(small.rglob("*"))[1:] and not list(small.rglob("*.tmp"))
    finally:
        if mounted:
            subprocess.run(["umount", str(small)], check=True)


def test_the_stats_of_a_schedule_that_fails_its_checks_are_not_shown(tmp_path):
    broken = str(FIXTURES / "broken" / "deadlock.sched")
    table = CliRunner().invoke(main, ["simulate", broken])
    assert table.exit_code == 1 and "no stats for a schedule that fails its checks" in table.output
    assert "utilization" not in table.output and "makespan" not in table.output
    as_json = CliRunner().invoke(main, ["simulate", broken, "--json"])
    assert as_json.exit_code == 1 and '"valid": false' in as_json.output and "utilization" not in as_json.output
    for ext in ("dot", "html"):
        drawn = CliRunner().invoke(main, ["render", broken, "-o", str(tmp_path / f"x.{ext}")])
        text = (tmp_path / f"x.{ext}").read_text()
        assert drawn.exit_code == 1 and "fails its checks" in text and "utilization" not in text.split("<h2>Source")[0]


def test_repeated_diagnostics_are_capped_and_counted(tmp_path):
    row = tmp_path / "dup.csv"
    row.write_text(",".join(["0F0"] * 10_000) + "\n")  # one op, 9,999 times too often
    result = CliRunner().invoke(main, ["check", str(row)])
    lines = [line for line in result.output.splitlines() if ": error: " in line]
    assert result.exit_code == 1 and len(lines) == 22, lines[-3:]  # 20 alike, their count, the missing B
    assert "and 9,979 more like this (F(0,0) runs twice" in lines[20]
    assert len(result.output) < 20_000 and "10000 errors" in result.output
