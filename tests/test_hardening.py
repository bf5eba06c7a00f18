"""hardening: a test per defect kind of the second hardening round. Every file the compiler takes is
read through schedc.inputs (a FIFO, a device or a directory refused by name, a size cap, nesting and
integer caps, located errors); every expansion is held to a named budget (schedc.budget); values
that meant nothing (an infinite --memory-limit, -D m=2.5, a huge --global-batch, a deep `extends`
chain) are refused saying what is wrong. Exit codes 0, 1 or 2 only, never a traceback."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, ROOT
from schedc.cli import main
from schedc.diagnostics import SchedError, Source
from schedc.inputs import MAX_DEPTH, MAX_DIGITS, load_json, load_toml, read_source

GPT = str(ROOT / "schedc" / "models" / "gpt-1.7b.toml")
CLUSTER = "dgx-a100-80gb"
LOCATED = re.compile(r":\d+:\d+: error: ")


def cli(*args):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output and result.exit_code in (0, 1, 2), result.output
    assert not isinstance(result.exception, (RecursionError, ValueError, MemoryError, TypeError)), result.exception
    return result


def _plan(tmp_path: Path) -> str:
    out = tmp_path / "plan"
    assert cli("compile", "1f1b", "-D", "p=2", "-D", "m=2", "-o", str(out)).exit_code == 0
    return str(out / "plan.json")


def _fifo(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


# --- one input reader: what a file is, how large, how deep, how long its integers ------------------

def _every_reader(path: str, plan: str) -> list[list[str]]:
    """Each command line that reads `path` as one kind of input (nothing may open a FIFO or a device)."""
    return [["simulate", "1f1b", "--cluster", CLUSTER, "--model", path],         # model TOML
            ["simulate", "1f1b", "--cluster", path, "--model", GPT],             # cluster TOML
            ["simulate", "1f1b", "--costs", path],                               # costs JSON
            ["simulate", "1f1b", "--profile", path, "--microbatch-size", "1"],   # profile CSV
            ["render", "1f1b", "-D", "p=2", "-D", "m=2", "-o", str(Path(plan).parent / "t.dot"),
             "--measured", path],                                                # measured trace
            ["simulate", path]]                                                  # schedule (or plan, by name)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_fifo_a_device_or_a_directory_is_refused_by_name_before_it_is_opened(tmp_path, kind):
    plan = _plan(tmp_path)
    for n, argv in enumerate(_every_reader("@", plan)):
        if kind == "fifo":
            path = _fifo(tmp_path, f"in{n}.json" if n == 5 else f"in{n}")  # the schedule slot: as a plan too
        elif kind == "device":
            path = "/dev/zero"
        else:
            path = str(tmp_path / f"dir{n}")
            os.mkdir(path)
        result = cli(*[path if a == "@" else a for a in argv])
        named = {"fifo": "is a FIFO (named pipe), not a file", "device": "is a character device, not a file",
                 "directory": "a directory"}[kind]
        assert result.exit_code == 2 and named in result.output, (argv, result.output)


def test_run_refuses_a_fifo_plan_before_torchrun(tmp_path):
    result = cli("run", _fifo(tmp_path, "plan.json"), "--steps", "1")
    assert result.exit_code == 2 and "plan.json is a FIFO (named pipe), not a file" in result.output


def test_a_file_past_the_size_cap_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('{"F": 1}' + " " * 2000)
    with pytest.raises(SchedError) as caught:
        read_source(path, "costs", limit=1000)
    assert "costs is larger than 0 MiB; refusing to read it" in caught.value.render() and caught.value.exit_code == 2


@pytest.mark.parametrize("flag", ["--model", "--cluster", "--costs", "plan", "--measured"])
def test_deep_nesting_is_a_located_error_not_a_recursion_error(tmp_path, flag):
    deep = "[" * 5000 + "]" * 5000
    toml = tmp_path / "deep.toml"
    toml.write_text(f"layers = 4\nx = {deep}\n")
    json_file = tmp_path / ("deep.json")
    json_file.write_text('{"F": 1,\n "B": ' + deep + "}")
    argv = {"--model": ["simulate", "1f1b", "--cluster", CLUSTER, "--model", str(toml)],
            "--cluster": ["simulate", "1f1b", "--cluster", str(toml), "--model", GPT],
            "--costs": ["simulate", "1f1b", "--costs", str(json_file)],
            "plan": ["simulate", str(json_file)],
            "--measured": ["render", "1f1b", "-o", str(tmp_path / "t.dot"), "--measured", str(json_file)]}[flag]
    result = cli(*argv)
    where = f":2:{5 + MAX_DEPTH}" if flag in ("--model", "--cluster") else f":2:{6 + MAX_DEPTH}"  # the bracket past it (the object is a level)
    assert result.exit_code == 2 and f"{where}: error: " in result.output, result.output
    assert f"nested deeper than {MAX_DEPTH} levels" in result.output


@pytest.mark.parametrize("flag,text,where", [
    ("--model", "layers = 4\nhidden = " + "9" * 5000 + "\n", ":2:10"),
    ("--cluster", "[gpu]\npeak_tflops = " + "1" * 5000 + "\n", ":2:15"),
    ("--costs", '{"F": 1,\n "B": ' + "2" * 5000 + "}", ":2:7"),
    ("plan", '{"format": "schedc-plan",\n "version": ' + "3" * 5000 + "}", ":2:13"),
])
def test_an_integer_of_thousands_of_digits_is_refused_where_it_is_written(tmp_path, flag, text, where):
    path = tmp_path / ("f.toml" if flag in ("--model", "--cluster") else "f.json")
    path.write_text(text)
    argv = {"--model": ["simulate", "1f1b", "--cluster", CLUSTER, "--model", str(path)],
            "--cluster": ["simulate", "1f1b", "--cluster", str(path), "--model", GPT],
            "--costs": ["simulate", "1f1b", "--costs", str(path)], "plan": ["simulate", str(path)]}[flag]
    result = cli(*argv)
    assert result.exit_code == 2 and f"{path.name}{where}: error: " in result.output, result.output
    assert f"an integer of 5,000 digits (at most {MAX_DIGITS})" in result.output


def test_the_reader_keeps_what_it_should_not_refuse():
    """Strings and comments are not counted: a long digit run or brackets inside them are text; a float
    of many digits is a float; TOML table headers are names, not arrays."""
    text = '{"hash": "' + "1" * 80 + '", "x": [[1]], "f": ' + "1" * 60 + ".5}"
    assert load_json(Source("x.json", text), "plan")["x"] == [[1]]
    toml = '# ' + "[" * 100 + "\n[gpu]\nname = \"" + "9" * 80 + "\"\n[[rows]]\na = [[1, 2], [3]]\n"
    assert load_toml(Source("x.toml", toml), "cluster")["rows"][0]["a"] == [[1, 2], [3]]


def test_invalid_utf8_is_located(tmp_path):
    path = tmp_path / "m.toml"
    path.write_bytes(b"layers = 4\nname = \"\xff\"\n")
    result = cli("simulate", "1f1b", "--cluster", CLUSTER, "--model", str(path))
    assert result.exit_code == 2 and "m.toml:2:9: error: model description is not valid UTF-8" in result.output


def test_the_runtime_config_refuses_a_fifo_a_deep_nest_and_a_huge_integer(tmp_path):
    from schedc.runtime.process.options import OptionError, parse_options
    plan = _plan(tmp_path)
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    huge = tmp_path / "huge.toml"
    huge.write_text("layers = " + "9" * 5000 + "\n")
    for path, message in ((_fifo(tmp_path, "c.toml"), "not a regular file"), (deep, "nested too deeply"),
                          (huge, "Exceeds the limit (4300 digits)")):
        with pytest.raises(OptionError) as caught:
            parse_options([plan, "--model", str(path)])
        assert message in str(caught.value)


# --- one resource rule: a budget checked before the work grows, the limit named -----------------------

PROGRAM = ('schedule x "x"\nparam p = 2\nparam m = 4\npipeline main {{ stages p; device s -> s; microbatches m }}\n'
           "{extra}on device d {{\n{body}\n}}\n")


def test_optional_pops_and_alternatives_with_a_huge_bound_stop_when_they_place_nothing(tmp_path):
    for body in ("  F? * 1000000000\n  B? * 1000000000", "  F * m\n  (B | F)? * 1000000000"):
        path = tmp_path / "x.sched"
        path.write_text(PROGRAM.format(extra="", body=body))
        result = cli("simulate", str(path), "--json")
        assert result.exit_code == 0, result.output
        plain = tmp_path / "plain.sched"
        plain.write_text(PROGRAM.format(extra="", body="  F * m\n  B * m"))
        assert result.output == cli("simulate", str(plain), "--json").output.replace("plain.sched", "x.sched")


def test_a_squeeze_unit_slot_far_past_the_ops_is_refused_naming_the_limit(tmp_path):
    path = tmp_path / "sq.sched"
    path.write_text(PROGRAM.format(extra="squeeze\n", body="  F * m\n  B at 1000000000\n  B * (m - 1)"))
    result = cli("simulate", str(path))
    assert result.exit_code == 2 and "sq.sched:5:1: error: 'squeeze': device 0's program (its B(0,3) at slot " \
        "1,000,000,003) spans 1,000,000,004 unit slots, past the limit of 1,088" in result.output


def test_an_interpreted_program_past_the_statement_budget_is_refused_naming_it():
    result = cli("simulate", str(FIXTURES / "runaway_loop.sched"))
    assert result.exit_code == 2 and "programs run more than 500,000 statements (a runaway loop?), the limit of " \
        "the programs' interpreter" in result.output


def test_every_budget_refusal_exits_as_a_usage_error_wherever_it_is_met(tmp_path):
    """The reader's refusals and the budgets' exit alike (2, budget.REFUSED): the elaboration's (a squeeze's
    slots, the programs' statements), tune's candidates and fills, a render's width."""
    from schedc.budget import REFUSED
    from schedc.diagnostics import EXIT_CODES
    path = tmp_path / "sq.sched"
    path.write_text(PROGRAM.format(extra="squeeze\n", body="  F * m\n  B at 1000000000\n  B * (m - 1)"))
    big = tmp_path / "big.toml"  # heads and layers with many divisors: 183,480 candidates on a million GPUs
    big.write_text("layers = 1024\nhidden = 65536\nheads = 1024\nseq = 2048\nvocab = 65536\n")
    for argv, named in [(("simulate", str(path)), "unit slots, past the limit of 1,088"),
                        (("check", str(FIXTURES / "runaway_loop.sched")), "more than 500,000 statements"),
                        (("compile", "1f1b", "-D", "m=100", "--max-ops", "799", "-o", str(tmp_path / "out")),
                         "more than 799 ops (4 stages x 100 microbatches x 2 op kinds); refusing (--max-ops N"),
                        (("tune", "--model", str(big), "--cluster", CLUSTER, "--gpus", "1048576", "--global-batch",
                          "16777216", "--zero", "0"), "the search would bound 183,480 candidates, past the limit of 150,000"),
                        (("tune", "--model", str(big), "--cluster", CLUSTER, "--gpus", "1048576", "--global-batch",
                          "16777216"), "candidates, past the limit of 150,000 (each"),  # levels 0-3 counted too
                        (("tune", "--model", GPT, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "64",
                          "--schedules", "pipefisher"), "past the limit of 8"),
                        (("render", "1f1b", "--width", "10000000", "-o", str(tmp_path / "t.svg")), "past the limit")]:
        result = cli(*argv)
        assert result.exit_code == EXIT_CODES[REFUSED] == 2 and named in result.output, (argv, result.output)


def test_a_render_past_its_op_limit_is_refused_when_elaborated(tmp_path):
    result = cli("render", "1f1b", "-D", "p=512", "-D", "m=480", "-o", str(tmp_path / "t.json"))
    assert result.exit_code == 2 and "schedule would expand to more than 200,000 ops" in result.output
    assert "render draws every op" in result.output and "`schedc simulate` for the summary" in result.output
    assert not (tmp_path / "t.json").exists()


def test_a_huge_timeline_png_is_drawn_at_a_lower_resolution_or_refused():
    from schedc.render.dot import MIN_PNG_DPI, PNG_DPI, png_dpi
    small = 'a [pos="0,0"];\nb [pos="600,-100"];\n'
    assert png_dpi(small, "t.png") == PNG_DPI
    wide = 'a [pos="0,0"];\nb [pos="24000,-6000"];\n'  # 1,024 devices of 1F1B: some 340 million pixels
    assert MIN_PNG_DPI <= png_dpi(wide, "t.png") < PNG_DPI
    with pytest.raises(SchedError) as caught:
        png_dpi('a [pos="0,0"];\nb [pos="100000,-60000"];\n', "t.png")
    assert f"the PNG at {MIN_PNG_DPI} dpi would have" in caught.value.render() and "past the limit of 40,000,000" \
        in caught.value.render()


def test_tune_refuses_more_filled_candidates_than_its_budget_before_searching():
    result = cli("tune", "--model", GPT, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "64",
                 "--schedules", "pipefisher", "--zero", "0")
    assert result.exit_code == 2 and "pipefisher: the search would compile and fill 180 candidates, past the " \
        "limit of 8" in result.output and "narrow the search with --tp, --pp" in result.output


# --- silent nonsense: said as what it is -------------------------------------------------------------

def test_an_infinite_memory_limit_is_refused():
    for argv in (["check", "1f1b", "--model", GPT, "--microbatch-size", "1"],
                 ["tune", "--model", GPT, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "64",
                  "--schedules", "1f1b"]):
        result = cli(*argv, "--memory-limit", "1e400GiB")
        assert result.exit_code == 2 and "--memory-limit 1e400GiB: more than 1e+18 bytes" in result.output


def test_a_fractional_define_names_the_define():
    result = cli("simulate", "1f1b", "-D", "m=2.5")
    assert result.exit_code == 2 and "microbatch count must be an integer, got 2.5" in result.output
    assert "note: m was given with -D m=2.5" in result.output


def test_with_on_a_torch_csv_is_a_usage_error(tmp_path):
    out = tmp_path / "order.csv"
    assert cli("export", "1f1b", "-D", "p=2", "-D", "m=2", "-o", str(out)).exit_code == 0
    result = cli("simulate", str(out), "--with", "kfac")
    assert result.exit_code == 2 and "add-ons apply to .sched schedules" in result.output


def test_a_deep_extends_chain_is_not_called_a_cycle(tmp_path):
    base = 'schedule s0 "s"\nparam p = 2\nparam m = 2\npipeline main { stages p; device s -> s; microbatches m }\n' \
           "on device d { F * m ; B * m }\n"
    (tmp_path / "s0.sched").write_text(base)
    for n in range(1, 20):
        (tmp_path / f"s{n}.sched").write_text(f'schedule s{n} "s"\nextends s{n - 1}\n')
    result = cli("check", str(tmp_path / "s19.sched"))
    assert result.exit_code == 1 and "`extends` chain deeper than 16 schedules: s19 -> s18 -> s17 -> ..." in result.output
    assert "cycle" not in result.output and LOCATED.search(result.output)


def test_a_huge_global_batch_is_said_of_the_option_given():
    result = cli("simulate", "1f1b", "-D", "p=4", "--cluster", CLUSTER, "--model", GPT, "--global-batch", "9" * 23)
    assert result.exit_code == 2 and "--global-batch 99,999,999,999,999,999,999,999 is 99,999,999,999,999,999,999,999 " \
        "microbatches per step" in result.output and "-D m=" not in result.output


# --- calibrate: option ranges, no signal, what was written --------------------------------------------

CAL_MODEL = "layers = 4\nhidden = 256\nheads = 8\nseq = 128\nvocab = 256\nffn = 1024\ndtype = \"fp32\"\n"


@pytest.mark.parametrize("option,value", [("--ranks", "0"), ("--ranks", "1"), ("--threads", "0"), ("--tp", "0")])
def test_calibrate_options_are_held_to_their_ranges(tmp_path, option, value):
    """--ranks 1 hung (rank 0 sent to a rank 1 that was never started): a ping-pong needs two."""
    result = cli("calibrate", "-o", str(tmp_path / "c.toml"), option, value)
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output
    assert not (tmp_path / "c.toml").exists()


def _fit(tmp_path, profile: dict | str):
    import json
    model, costs = tmp_path / "m.toml", tmp_path / "profile.json"
    model.write_text(CAL_MODEL)
    costs.write_text(profile if isinstance(profile, str) else json.dumps(profile))
    return cli("calibrate", "-o", str(tmp_path / "fitted.toml"), "--cluster", CLUSTER, "--costs", str(costs),
               "--model", str(model), "--microbatch-size", "4")


@pytest.mark.parametrize("profile,message", [
    ({"F": [0, 0], "B": [0, 0]}, "the profile's F is 0 at stage 0: no time measured, nothing to fit"),
    ({"F": [50.0, 60.0], "B": [100.0, 0]}, "the profile's B is 0 at stage 1"),
    ({"F": [1e-12, 1e-12], "B": [1e-12, 1e-12]}, "times the cost model's prediction for this model on"),
    ('{"F": ' + "[" * 100 + "]" * 100 + "}", "nested deeper than 64 levels"),
])
def test_a_profile_with_no_signal_is_refused_not_fitted(tmp_path, profile, message):
    result = _fit(tmp_path, profile)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "fitted.toml").exists()


def test_calibrate_says_what_it_wrote_and_refuses_to_write_nothing(tmp_path):
    result = _fit(tmp_path, {"F": [50.0, 60.0], "B": [100.0, 120.0]})
    assert result.exit_code == 0 and f"wrote {tmp_path / 'fitted.toml'}: " in result.output
    assert "8 per node, peak " in result.output and "TFLOP/s (fp32)" in result.output
    nothing = cli("calibrate", "-o", str(tmp_path / "none.toml"), "--cluster", CLUSTER)
    assert nothing.exit_code == 2 and "give --costs and --model with it" in nothing.output


# --- the runtime: user code that exits or raises, checkpoints of another run -------------------------

RUN = ["--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2", "--steps", "1"]
USER_MODULE = '''import sys
def exits(cfg):
    sys.exit(0)
def exits_3(cfg):
    sys.exit(3)
def raises(cfg):
    raise RuntimeError("the user's model is broken")
def data_exits(cfg, seed):
    sys.exit(0)
'''


@pytest.mark.parametrize("option,spec,raised", [
    ("--model-code", "hardening_user:exits", "exits(): SystemExit(0): it called sys.exit()"),
    ("--model-code", "hardening_user:exits_3", "exits_3(): SystemExit(3)"),
    ("--model-code", "hardening_user:raises", "raises(): RuntimeError: the user's model is broken"),
    ("--data", "hardening_user:data_exits", "data_exits(): SystemExit(0)"),
    ("--model-code", "hardening_exit_on_import:f", "importing hardening_exit_on_import: SystemExit(3)"),
])
def test_user_code_that_exits_or_raises_is_the_users_code_failing(tmp_path, monkeypatch, capsys, option, spec, raised):
    """sys.exit(0) in a model builder was reported as success and sys.exit(3) leaked exit 3: both are the
    user's code failing (exit 1), named with the function."""
    import sys
    from schedc.runtime.__main__ import main as runtime_main
    (tmp_path / "hardening_user.py").write_text(USER_MODULE)
    (tmp_path / "hardening_exit_on_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("hardening_user", "hardening_exit_on_import"):
        sys.modules.pop(name, None)
    assert runtime_main([_plan(tmp_path), *RUN, "--reference", option, spec]) == 1
    err = capsys.readouterr().err
    assert f"error: {option} '{spec}': the user's code failed in {raised}" in err, err


def _checkpoint(tmp_path: Path, plan: str, **changed) -> Path:
    """A checkpoint directory as two ranks of `plan` would leave it (rank files with their checksums),
    made with RUN's model unless `changed` says otherwise."""
    import hashlib
    import json
    from schedc.plan import load_plan
    from schedc.runtime.execution.checkpoint import identity
    from schedc.runtime.process.options import parse_options
    root = tmp_path / "ckpt"
    (root / "step-00000001").mkdir(parents=True)
    files = {}
    for rank in (0, 1):
        data = f"rank {rank}".encode()
        (root / "step-00000001" / f"rank{rank}.pt").write_bytes(data)
        files[f"rank{rank}.pt"] = hashlib.sha256(data).hexdigest()
    made = identity(load_plan(plan).hash, 2, parse_options([plan, *RUN]))
    made["model"].update(changed)
    (root / "latest.json").write_text(json.dumps({"dir": "step-00000001", "steps_done": 1, **made, "files": files}))
    return root


def test_save_over_a_checkpoint_is_refused_unless_overwrite(tmp_path):
    from schedc.runtime.process.launch import LaunchError, check_launch
    plan = _plan(tmp_path)
    root = _checkpoint(tmp_path, plan)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(LaunchError) as caught:
        check_launch(plan, None, [*RUN, "--save", str(root)], [])
    assert f"--save {root}: the directory holds a checkpoint (1 step done, plan hash " in str(caught.value)
    assert "give --overwrite to replace it" in str(caught.value)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # nothing lost
    check_launch(plan, None, [*RUN, "--save", str(root), "--overwrite"], [])
    check_launch(plan, None, [*RUN, "--steps", "2", "--save", str(root), "--resume", str(root)], [])  # continued


def test_resume_of_another_plan_model_size_or_seed_is_refused_before_torchrun_naming_it(tmp_path):
    from schedc.runtime.process.launch import LaunchError, check_launch
    plan = _plan(tmp_path)
    root = _checkpoint(tmp_path, plan, layers=4, hidden=64)
    with pytest.raises(LaunchError) as caught:
        check_launch(plan, None, [*RUN, "--steps", "2", "--resume", str(root)], [])
    assert "the checkpoint is of another run: it was made with model layers 4 (this run: 2); model hidden 64 " \
        "(this run: 32)" in str(caught.value)
    other = tmp_path / "other"
    assert cli("compile", "gpipe", "-D", "p=2", "-D", "m=2", "-o", str(other)).exit_code == 0
    root = _checkpoint(tmp_path / "o", plan)
    with pytest.raises(LaunchError) as caught:
        check_launch(str(other / "plan.json"), None, [*RUN, "--steps", "2", "--resume", str(root), "--seed", "7"], [])
    assert "made with plan hash" in str(caught.value) and "another schedule or size" in str(caught.value)
    assert "seed 0 (this run: 7)" in str(caught.value)


def test_resume_under_another_optimizer_layer_split_or_model_fact_is_refused_before_torchrun(tmp_path):
    """The checkpoint records the optimizer, the layer split and the model's facts: resuming under
    another is refused naming what differs (it failed on rank 0 with KeyError: 'momentum', or a
    state_dict error, after torchrun had started); a checkpoint that does not record a key (an older
    schedc's) is not compared on it."""
    from schedc.runtime.process.launch import LaunchError, check_launch
    plan = _plan(tmp_path)
    root = _checkpoint(tmp_path, plan)
    for extra, said in ((["--optimizer", "sgd"], "optimizer 'adamw' (this run: 'sgd')"),
                        (["--stage-layers", "1,1"], "stage_layers 'even' (this run: '1,1')"),
                        (["--account-for-loss"], "account_for_loss False (this run: True)")):
        with pytest.raises(LaunchError) as caught:
            check_launch(plan, None, [*RUN, "--steps", "2", "--resume", str(root), *extra], [])
        assert said in str(caught.value), str(caught.value)
    import json
    older = _checkpoint(tmp_path / "old", plan)  # as an older schedc wrote it: no optimizer, no MLP form
    latest = json.loads((older / "latest.json").read_text())
    del latest["optimizer"], latest["model"]["mlp"]
    (older / "latest.json").write_text(json.dumps(latest))
    check_launch(plan, None, [*RUN, "--steps", "2", "--resume", str(older), "--optimizer", "sgd"], [])


def test_a_tasks_module_that_exits_on_import_is_the_users_code_failing(tmp_path, monkeypatch):
    from schedc.runtime.execution.tasks import TaskError, load_task_modules
    (tmp_path / "hardening_tasks_exit.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskError) as caught:
        load_task_modules(["hardening_tasks_exit"])
    assert "--tasks 'hardening_tasks_exit': the user's code failed in importing hardening_tasks_exit: " \
        "SystemExit(0)" in str(caught.value)


def test_a_hundred_thousand_unknown_keys_are_counted_not_each_located(tmp_path):
    """Each unknown key was located by a scan of the whole file: 100,000 of them took minutes."""
    path = tmp_path / "m.toml"
    path.write_text(Path(GPT).read_text() + "".join(f"k{i} = 1\n" for i in range(100_000)))
    result = cli("simulate", "1f1b", "--cluster", CLUSTER, "--model", str(path))
    assert result.exit_code == 2 and "m.toml:7:1: error: unknown key 'k0'" in result.output
    assert "... and 99,980 more unknown keys" in result.output


def test_tune_why_with_an_integer_of_thousands_of_digits_is_a_usage_error():
    result = cli("tune", "--model", GPT, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "64",
                 "--schedules", "1f1b", "--why", "t=1 p=" + "9" * 5000)
    assert result.exit_code == 2 and "p must be a positive integer, got '999999999999... (5,000 characters)'" \
        in result.output


@pytest.mark.slow
def test_a_model_builder_that_never_returns_is_ended_by_the_runs_timeout(tmp_path):
    """It hung past --timeout 5: user code is called under the run's --timeout (in a process of its own
    here: the limit ends the process)."""
    import subprocess
    import sys
    (tmp_path / "hardening_forever.py").write_text("import time\ndef builder(cfg):\n    while True:\n"
                                                   "        time.sleep(0.05)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "schedc.runtime", _plan(tmp_path), *RUN, "--reference", "--model-code",
                           "hardening_forever:builder", "--timeout", "1"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 1 and "error: --model-code 'hardening_forever:builder': the user's code did not return " \
        "from builder() within --timeout 1 s" in done.stderr, done.stderr


def test_an_extends_name_too_long_for_the_file_system_is_an_unknown_schedule(tmp_path):
    """Found by the fuzzer: `extends 1000...0f1b` (400 characters) raised OSError (File name too long)."""
    path = tmp_path / "x.sched"
    path.write_text('schedule x "x"\nextends ' + "1" * 400 + "\n")
    result = cli("check", str(path))
    assert result.exit_code == 1 and "x.sched:2:1: error: unknown schedule '111" in result.output


def test_non_ascii_text_in_strings_is_kept_as_written(tmp_path):
    """A require message or an extends path in UTF-8 is read as written (it was decoded as Latin-1:
    '≥' printed as 'â¥'); an extends path that names no file says so, not 'unknown schedule'."""
    path = tmp_path / "b.sched"
    path.write_text('schedule y "y"\nparam p = 2 "p"\nparam m = 4 "m"\nrequire p >= 3 "p must be ≥ 3 — naïve \\u00e9 \\"q\\""\n'
                    'pipeline main { stages p; device s -> s; microbatches m }\n', encoding="utf-8")
    result = cli("check", str(path))
    assert result.exit_code == 1 and 'requirement failed: p must be ≥ 3 — naïve é "q"' in result.output
    path = tmp_path / "a.sched"
    path.write_text('schedule x "x"\nextends "ünïcødé.sched"\n', encoding="utf-8")
    result = cli("check", str(path))
    assert result.exit_code == 1 and f"{path}:2:1: error: no schedule file 'ünïcødé.sched' next to a.sched" in result.output


def test_an_inline_table_in_a_cluster_file_is_located_at_its_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('name = "x"\ngpu = { peak_tflops = 312, memory_gib = 80, hbm_gbps = 2039, bogus = 1 }\n'
                    'node = { gpus = 8 }\nintra = { bandwidth_gbps = 300, latency_us = -5 }\n')
    result = cli("simulate", "1f1b", "-D", "p=2", "--model", GPT, "--cluster", str(path))
    assert result.exit_code == 2
    assert f"{path}:2:62: error: unknown key 'gpu.bogus'" in result.output
    assert f"{path}:4:33: error: 'intra.latency_us' must be" in result.output


def test_max_ops_sets_the_expansion_limit_of_compile_check_and_simulate(tmp_path):
    """1F1B at p=4, m=100 is 800 ops: within --max-ops 800, refused at 799 naming the option (exit 2)."""
    for verb, *extra in (("compile", "-o", str(tmp_path / "out")), ("check",), ("simulate",)):
        assert cli(verb, "1f1b", "-D", "m=100", "--max-ops", "800", *extra).exit_code == 0
        refused = cli(verb, "1f1b", "-D", "m=100", "--max-ops", "799", *extra)
        assert refused.exit_code == 2 and "more than 799 ops" in refused.output and "--max-ops" in refused.output
    on = ("--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb")  # the cluster's elaboration takes it too
    refused = cli("simulate", "1f1b", "-D", "p=8", *on, "--global-batch", "512", "--max-ops", "1000")
    assert refused.exit_code == 2 and "more than 1,000 ops (8 stages x 512 microbatches" in refused.output
    assert cli("simulate", "1f1b", "-D", "p=8", *on, "--global-batch", "512", "--max-ops", "8192").exit_code == 0
