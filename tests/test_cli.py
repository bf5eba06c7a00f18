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


def test_compile_over_a_larger_plan_removes_only_its_own_stale_rank_streams(tmp_path):
    assert run("compile", "1f1b", "-D", "p=4", "-o", str(tmp_path)).exit_code == 0
    (tmp_path / "rank9.txt").write_text("# my notes, not a plan\n")
    (tmp_path / "rank3.txt.bak").write_bytes((tmp_path / "rank3.txt").read_bytes())
    result = run("compile", "1f1b", "-D", "p=2", "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "rank0.txt", "rank1.txt", "rank3.txt.bak",
                                                           "rank9.txt"]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["ranks"]) == 2 and plan["hash"][:12] in (tmp_path / "rank1.txt").read_text().splitlines()[0]


def test_simulate_json_prints_the_stats_object():
    result = run("simulate", "interleaved_1f1b", "-D", "p=4", "-D", "v=2", "-D", "m=8", "--json")
    assert result.exit_code == 0
    stats = json.loads(result.output)
    assert stats["bubble"] == pytest.approx(3 / 16)
    assert {"makespan", "utilization", "busy", "idle", "peak_memory"} <= set(stats)


def test_list_shows_the_library_with_params():
    result = run("list")
    for name in ("gpipe", "1f1b", "interleaved_1f1b", "chimera"):
        assert name in result.output
    assert "-D v=2" in result.output


def test_list_shows_the_params_of_composed_schedules_and_addons():
    """pipefisher extends chimera and uses kfac: its params are chimera's p (8 here) and m, and the
    add-on's under its namespace, as the README's table says; the add-on is listed by itself too."""
    lines = run("list").output.splitlines()

    def params(name: str) -> list[str]:
        start = next(n for n, line in enumerate(lines) if line.split()[0] == name)
        block = []
        for line in lines[start + 1:]:
            if not line.startswith(" "):
                break
            block.append(line.split()[1])
        return block

    assert params("pipefisher") == ["p=8", "m=8", "kfac.save_err=0.41", "kfac.kron=0.48"]
    assert params("pipefisher_1f1b") == ["p=4", "m=8", "kfac.save_err=0.41", "kfac.kron=0.48"]
    assert params("kfac") == ["kfac.save_err=0.41", "kfac.kron=0.48"]
    assert any(line.startswith("kfac (add-on)") for line in lines)


def test_render_and_export_take_with(tmp_path):
    """--with on render draws the add-on's tasks (a Chrome trace names them) and on export the same
    schedule is exported, or refused for the tasks torch's CSV cannot hold (exit 1, located)."""
    trace = tmp_path / "t.json"
    drawn = run("render", "1f1b", "--with", "kfac", "-o", str(trace))
    assert drawn.exit_code == 0, drawn.output
    names = {event["args"]["op"] for event in json.loads(trace.read_text())["traceEvents"] if event["ph"] == "X"}
    assert {"curvature_A", "curvature_B", "inversion", "precondition"} <= names
    exported = run("export", "1f1b", "--with", "kfac", "-o", str(tmp_path / "x.csv"))
    assert exported.exit_code == 1 and "also runs the tasks curvature_A" in exported.output
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("command", ["check", "simulate", "render", "export"])
def test_with_on_a_torch_csv_is_a_usage_error(tmp_path, command):
    csv = str(FIXTURES / "torch" / "dualpipev_4rank_10mb.csv")
    out = ["-o", str(tmp_path / ("x.svg" if command == "render" else "x.csv"))] if command in ("render", "export") else []
    result = run(command, csv, "--with", "kfac", *out)
    assert result.exit_code == 2, result.output
    assert "error: --with kfac: add-ons apply to .sched schedules; dualpipev_4rank_10mb.csv is a torch CSV " \
           "order" in result.output


@pytest.mark.parametrize("args,code,where", [
    (["compile", str(FIXTURES / "syntax_error.sched")], 2, "syntax_error.sched:3:15: error: '{' is not closed"),
    (["compile", str(FIXTURES / "pop_empty.sched")], 1, "pop_empty.sched:7:3: error:"),
    (["compile", str(FIXTURES / "bad_device.sched")], 1, "bad_device.sched:4:31: error:"),
    (["compile", "1f1b", "-D", "q=1"], 2, "unknown param 'q'"),
    (["compile", "1f1b", "-D", "p=x"], 2, "value must be a number"),
    (["compile", "no/such/file.sched"], 2, "cannot read file"),
    (["simulate", "1f1bb"], 2, "no library schedule is named so (did you mean 1f1b, seq1f1b?)"),
    (["simulate", "1f1b", "-D", "m=1000000000"], 2, "refusing (--max-ops N raises the limit"),
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
    ('{"F": 1, "B": -2}', ":1:10: error: cost of 'B' must be a finite number >= 0 and at most 1e+15, got -2"),
    ('{"F": NaN, "B": 2}', ":1:2: error: cost of 'F' must be a finite number >= 0 and at most 1e+15, got nan"),
    ('{"F": [1, Infinity, 1, 1], "B": 2}', ":1:2: error: cost of 'F' at stage 1 must be a finite number >= 0 and at most 1e+15, got inf"),
    ('{"F": 1, "B": "x"}', ":1:10: error: cost of 'B' must be a number or a list of numbers per stage"),
    ('{"F": 1,\n', ":2:1: error: cannot read costs: Expecting property name enclosed in double quotes"),
    ('{"F": 1, "B": 2, "memory": {"B": -1}}', ": error: memory of 'B' must be a finite number >= 0 and at most 1e+15, got -1"),
    ('{"F": [1, 2, 3], "B": 2}', ":1:2: error: measured costs for F have 3 stages (one value per stage), the "
                                 "schedule has 4"),
    ('{"F": 1, "B": 2, "F": 3}', ":1:18: error: 'F' is given twice; give each kind once"),
])
def test_measured_costs_must_be_finite_and_not_negative(tmp_path, costs, where):
    """Each is located at its key (or where the JSON parser stopped), but for the memory object's."""
    path = tmp_path / "costs.json"
    path.write_text(costs)
    result = CliRunner().invoke(main, ["simulate", "1f1b", "--costs", str(path)])
    assert result.exit_code == 2
    assert f"{path}{where}" in result.output
    assert "Traceback" not in result.output


BERT_LARGE = ROOT / "tests" / "data" / "bert-large_time_memory_v100.csv"


def test_a_profile_without_the_split_halves_is_refused_for_a_split_schedule():
    """A profile row gives F and B only: ZB-H1 runs I and W, which were taken as 1 unit next to F and B
    in ms (makespan 130 against 1F1B's 293); now an error at the profile's header, saying how to give them."""
    result = CliRunner().invoke(main, ["simulate", "zb_h1", "--profile", str(BERT_LARGE), "--microbatch-size", "32"])
    assert result.exit_code == 2, result.output
    assert (f"{BERT_LARGE}:1:1: error: no measured cost for I and W, which the schedule runs (its backward is "
            'split into I and W): a profile row gives F (time_f), B (time_b)') in result.output
    assert 'give "I" and "W" in a costs JSON with --costs instead' in result.output
    assert run("simulate", "1f1b", "--profile", str(BERT_LARGE), "--microbatch-size", "32").exit_code == 0


@pytest.mark.parametrize("schedule,costs,errors", [
    # 1F1B given the halves of a split backward and no B: each stray kind at its key, the missing B at the '{'
    ("1f1b", '{"F": [15.9, 10.1],\n "I": [12, 9],\n "W": [12, 10]}',
     [":2:2: error: measured cost of 'I': I and W run only with a split backward",
      ":3:2: error: measured cost of 'W': I and W run only with a split backward",
      ':1:1: error: no measured cost for B, which the schedule runs: add "B" to this file']),
    ("1f1b", '{"F": 1, "B": 2, "Q": 3}', [":1:18: error: measured cost of 'Q': unknown kind 'Q' (kinds: B, F)"]),
    ("1f1b", '{"F": 1, "B": 2, "FB": 3}', [":1:18: error: measured cost of 'FB': no program overlaps a forward"]),
    ("zb_h1", '  {"F": 1, "B": 2, "I": 1}', [":1:12: error: measured cost of 'B': this schedule splits its backward",
                                         ':1:3: error: no measured cost for W, which the schedule runs (its backward '
                                         'is split into I and W): add "W" to this file']),
    ("dualpipev", '{"F": 1, "B": 2}', [':1:1: error: no measured cost for I and W, which the schedule runs']),
    ("1f1b", '{"F": 1, "B": 2}\n', [':1:1: error: no measured cost for curvature_A, curvature_B, inversion and '
                                   'precondition, which the schedule runs']),
    (str(FIXTURES / "torch" / "dualpipev_4rank_10mb.csv"), '{"F": 1, "B": 2, "I": 1}',
     [':1:1: error: no measured cost for W, which the schedule runs']),
])
def test_measured_costs_give_every_kind_the_schedule_runs_and_no_other(tmp_path, schedule, costs, errors):
    """Measured costs are never mixed with the unit defaults (1F1B with F, I, W in ms ran B as 2 units;
    a "Q" was ignored): a missing kind, a kind the schedule does not run and an unknown one are errors
    located in the costs file, exit 2. The kinds: F and B, or I and W, a mixed backward's chosen
    ones, the tasks of an add-on (--with kfac in the sixth case), those a torch CSV names."""
    path = tmp_path / "costs.json"
    path.write_text(costs)
    params = ["-D", "p=2"] if schedule in ("1f1b", "zb_h1") else []
    addons = ["--with", "kfac"] if costs.endswith("\n") else []
    result = CliRunner().invoke(main, ["simulate", schedule, *params, *addons, "--costs", str(path)])
    assert result.exit_code == 2, result.output
    for expected in errors:
        assert f"{path}{expected}" in result.output
    assert result.output.count("error:") == len(errors) and "Traceback" not in result.output


def test_measured_costs_of_every_kind_time_the_schedule(tmp_path):
    """F = 3 and B = 5 ms on 1F1B, p = 2, m = 8: the makespan is (m + p - 1)(F + B) = 9 * 8 = 72."""
    path = tmp_path / "costs.json"
    path.write_text('{"unit": "ms", "F": 3, "B": 5}')
    stats = json.loads(run("simulate", "1f1b", "-D", "p=2", "-D", "m=8", "--costs", str(path), "--json").output)
    assert stats["makespan"] == 72


def test_a_profile_cell_that_is_not_a_number_is_refused(tmp_path):
    path = tmp_path / "profile.csv"
    path.write_text("bs,time_f,time_b\n1,1.5,oops\n")
    result = CliRunner().invoke(main, ["simulate", "1f1b", "--profile", str(path), "--microbatch-size", "1"])
    assert result.exit_code == 2
    assert f"{path}: error: profile column time_b must be a finite number >= 0 and at most 1e+15, got 'oops'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
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
    assert (ROOT / "schedc" / "schedules" / "1f1b.sched").read_text().splitlines()[line - 1].startswith("param")


def test_defines_with_integral_float_values_are_integers():
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "m=1e1", "-D", "p=2.0", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["ops"] == 2 * 2 * 10


@pytest.mark.parametrize("latency", ["nan", "-1", "inf", "1e308"])
def test_latency_must_be_finite_and_not_negative(latency):
    result = CliRunner().invoke(main, ["simulate", "1f1b", "--latency", latency])
    assert result.exit_code == 2 and "Invalid value for '--latency': must be a finite number >= 0" in result.output


def test_costs_too_large_to_sum_are_refused(tmp_path):
    source = tmp_path / "big.sched"
    source.write_text((ROOT / "schedc" / "schedules" / "gpipe.sched").read_text() + "\ncost F = 1e308\n")
    result = CliRunner().invoke(main, ["simulate", str(source)])
    assert result.exit_code == 1 and f"{source}:" in result.output and ("16:1: error: cost of F must be a finite number >= 0 and at most 1e+15, got 1e+308"
                                                              in result.output)
    costs = tmp_path / "costs.json"
    costs.write_text('{"F": 1e308}')
    result = CliRunner().invoke(main, ["simulate", "gpipe", "--costs", str(costs)])
    assert result.exit_code == 2 and "cost of 'F' must be a finite number >= 0 and at most 1e+15, got 1e+308" in result.output


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
    assert len(result.output) < 20_000 and "10,000 errors" in result.output


def test_simulate_caps_per_device_lines_and_table_for_many_devices():
    result = run("simulate", "1f1b", "-D", "p=300")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert max(map(len, lines)) < 200, max(lines, key=len)
    assert "peak activations per device " + "/".join(["8"] * 20) + " ... and 280 more (at most 8)" in result.output
    assert "  ... and 280 more devices (--json lists every device)" in lines
    assert len(lines) < 30
    assert len(json.loads(run("simulate", "1f1b", "-D", "p=300", "--json").output)["busy"]) == 300


def test_counts_of_one_are_singular_and_stats_are_never_minus_zero():
    result = run("simulate", "1f1b", "-D", "p=1", "-D", "m=1")
    assert "(p=1 m=1): 1 device, 1 stage, 1 microbatch, 2 ops" in result.output
    checked = run("check", "1f1b", "-D", "p=1", "-D", "m=1")
    assert "ok (2 ops on 1 device: no deadlock, channels match, memory peak 1 activation)" in checked.output
    filled = run("simulate", "pipefisher", "-D", "p=2", "-D", "m=16")
    assert "bubble 0.0000" in filled.output and "-0" not in filled.output
    stats = json.loads(run("simulate", "pipefisher", "-D", "p=2", "-D", "m=16", "--json").output)
    assert str(stats["bubble"]) == "0.0" and stats["utilization_useful"] == 1.0  # not 1.0000000000000002
    floats = [v for v in stats.values() if isinstance(v, float)]
    assert all(round(v, 9) == v for v in floats)


def test_check_and_simulate_read_a_plan_and_other_commands_say_what_a_plan_is(tmp_path):
    assert run("compile", "1f1b", "-D", "p=2", "-D", "m=4", "-o", str(tmp_path)).exit_code == 0
    plan = str(tmp_path / "plan.json")
    checked = run("check", plan)
    assert checked.exit_code == 0
    assert f"{plan}: ok (plan of one_f_one_b, 2 ranks, 34 instructions: fields valid, orders complete, channels match)" in checked.output
    simulated = run("simulate", plan, "--json")
    assert simulated.exit_code == 0
    assert json.loads(simulated.output) == json.loads(run("simulate", "1f1b", "-D", "p=2", "-D", "m=4", "--json").output)
    assert "re-simulated from the plan's per-rank orders, at latency 0" in run("simulate", plan).output
    slow = tmp_path / "slow"
    assert run("compile", "1f1b", "-D", "p=2", "-D", "m=4", "--latency", "0.5", "-o", str(slow)).exit_code == 0
    compiled = json.loads((slow / "plan.json").read_text())["stats"]["makespan"]
    replayed = json.loads(run("simulate", str(slow / "plan.json"), "--json").output)  # at the plan's latency
    assert replayed["makespan"] == compiled > json.loads(run("simulate", str(slow / "plan.json"), "--latency", "0",
                                                             "--json").output)["makespan"]
    drawn = tmp_path / "slow.json"  # render draws it at the plan's latency too, not at 0
    assert run("render", str(slow / "plan.json"), "-o", str(drawn)).exit_code == 0
    assert json.loads(drawn.read_text())["otherData"]["stats"]["makespan"] == compiled
    edited = json.loads(Path(plan).read_text())
    edited["ranks"][0]["steps"][0] = [i for i in edited["ranks"][0]["steps"][0] if i["op"] != "SEND_F"]
    broken = tmp_path / "broken.json"
    from schedc.plan.validate import plan_from_json
    loaded = plan_from_json(edited, verify=False)
    from schedc.plan.write import write_plan
    write_plan(loaded, tmp_path / "b")
    channels = CliRunner().invoke(main, ["check", str(tmp_path / "b" / "plan.json")])
    assert channels.exit_code == 1 and "messages from rank 0 to rank 1 do not match: 0 sent, 4 received" in channels.output
    for args, message in ((["check", plan, "-D", "p=3"], f"{plan} is a compiled plan: -D changes how a schedule"),
                          (["simulate", plan, "--with", "kfac"], "--with changes how a schedule is compiled"),
                          (["compile", plan], f"{plan} is already a compiled plan"),
                          (["export", plan, "-o", str(broken)], f"{plan} is JSON (a compiled plan?), not a schedule")):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert "unexpected '{'" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("fixture,code,message,line", [
    ("syntax_error.sched", 2, "'{' is not closed", 3),
    ("broken/deadlock.sched", 1, "deadlock: device 0 waits at B(0,0)", 11),
])
def test_simulate_json_refusals_carry_the_located_diagnostics(fixture, code, message, line):
    path = str(FIXTURES / fixture)
    result = CliRunner().invoke(main, ["simulate", path, "--json"])
    assert result.exit_code == code
    refusal = json.loads(result.stdout)
    assert refusal["valid"] is False and refusal["errors"] == 1
    first = refusal["diagnostics"][0]
    assert (first["severity"], first["file"], first["line"]) == ("error", path, line) and message in first["message"]
    assert f"{path}:{line}:" in result.stderr  # the text form as well, on stderr


def test_a_filled_plan_re_simulates_its_first_step_with_the_tasks_costs(tmp_path):
    """A PipeFisher plan carries its tasks' costs: re-simulating plan.json gives the compile's first
    step time (each piece was charged 1 unit before), and says the tasks' memory is not in a plan."""
    assert run("compile", "pipefisher", "-o", str(tmp_path)).exit_code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert {"curvature_A", "curvature_B", "inversion", "precondition"} <= set(plan["costs"])
    replayed = json.loads(run("simulate", str(tmp_path / "plan.json"), "--json").output)
    assert replayed["makespan"] == pytest.approx(plan["stats"]["step_times"][0])
    text = run("simulate", str(tmp_path / "plan.json")).output
    assert "step 0 of its cycle of 3 steps" in text and "tasks' memory is not in a plan" in text


def test_model_without_cluster_says_what_it_does():
    """--model without --cluster gives only tasks the model's layers: for a schedule without tasks
    it changes nothing, and says so (it was accepted silently where --tp needs --cluster)."""
    model = str(ROOT / "schedc" / "models" / "gpt-1.7b.toml")
    plain, with_model = run("simulate", "1f1b", "--json"), run("simulate", "1f1b", "--model", model, "--json")
    assert json.loads(with_model.stdout) == json.loads(plain.stdout)
    assert "--model without --cluster only gives a schedule's tasks the model's layers; one_f_one_b has none" \
        in with_model.stderr
    assert "--model without --cluster" not in run("simulate", "pipefisher", "--model", model).stderr


@pytest.mark.parametrize("args", [["simulate", "interleaved_1f1b", "-D", "p=32", "-D", "m=64"], ["--help"]])
def test_a_reader_that_stops_early_ends_the_command_with_sigpipe_not_a_failed_check(args):
    """`schedc simulate X | head -1`, `schedc --help | head -1`: 128 + SIGPIPE (141), as a shell tool
    the signal kills, and no traceback; exit 1 is a schedule that fails its checks."""
    proc = subprocess.Popen([sys.executable, "-m", "schedc.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.parametrize("args", [["compile", "1f1b", "-D", "p=4", "-o", "{out}"], ["simulate", "1f1b", "-D", "p=4"],
                                  ["simulate", "1f1b", "-D", "p=4", "--json"]])
def test_compile_and_simulate_end_their_own_process_with_the_output_whole(tmp_path, args):
    """In its own process a command ends at once after its output (common.done: os._exit, not tearing
    the compiled schedule down): exit 0, every line printed, as a caller of main(args) gets them."""
    args = [a.format(out=tmp_path) for a in args]
    proc = subprocess.run([sys.executable, "-m", "schedc.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run(*args).output and proc.stdout.endswith("\n") and proc.stderr == ""


def test_a_cluster_plans_recorded_message_times_are_not_overridden_by_a_latency(tmp_path):
    model = str(ROOT / "schedc" / "models" / "gpt-1.7b.toml")
    assert run("compile", "1f1b", "-D", "p=2", "--model", model, "--cluster", "dgx-a100-80gb", "--tp", "1", "--dp", "1",
               "--microbatch-size", "1", "--global-batch", "4", "-o", str(tmp_path)).exit_code == 0
    plan = str(tmp_path / "plan.json")
    assert "with the message times the plan records" in run("simulate", plan).output
    for command in (["simulate", plan, "--latency", "0.5"], ["render", plan, "--latency", "0.5", "-o", str(tmp_path / "x.svg")]):
        result = run(*command)
        assert result.exit_code == 2 and "--latency 0.5: the plan records the message time of each pair of ranks" \
            in result.output, result.output


def test_run_help_lists_every_runtime_option():
    """`schedc run --help` shows the runtime's own option table, not only --nproc."""
    from schedc.runtime.process.options import build_parser
    text = run("run", "--help").output
    import argparse
    flags = [a.option_strings[0] for a in build_parser()._actions if a.option_strings and a.option_strings[0] != "-h"
             and a.help != argparse.SUPPRESS]  # --config, the old spelling of --model, is hidden
    assert len(flags) > 30 and [f for f in flags if f not in text] == []
    assert "--nproc" in text and "--recompute" in text and "--stage-layers" in text
