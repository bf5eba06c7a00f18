"""tune prints a `schedc run` command only where the runtime accepts it: for every library schedule
under two layouts (t = 1, no recomputation; t = 2, full recomputation, sequence parallelism), the
command tune prints is compiled as printed and put through the runtime's own pre-launch check (what
`schedc run` runs before torchrun, in process); where tune prints no command it prints the runtime's
refusal instead, and that refusal is the check's own on the same plan."""
from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.cli.runnable import LocalRun, run_refusal
from schedc.frontend.library import library_files
from schedc.runtime.process.launch import LaunchError, check_launch

SCHEDULES = sorted(p.stem for p in library_files())
SLOW_TO_TUNE = ("pipefisher", "pipefisher_1f1b")  # a fill compiled for every candidate: minutes
LAYOUTS = {"t1": ["--tp", "1", "--recompute", "none"],
           "t2-full-sp": ["--tp", "2", "--recompute", "full", "--sequence-parallel"]}
TUNE = ["tune", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "64"]
REFUSED = "not runnable by schedc's runtime: "


def _local_lines(output: str) -> list[str]:
    lines = output.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("the same layout scaled to this machine"))
    return [line.strip() for line in lines[start + 1:start + 3] if line.startswith("  ")]


def _printed_run(lines: list[str], tmp_path, monkeypatch):
    """The printed compile run as printed (in tmp_path), then the printed run's pre-launch check."""
    compile_words, run_words = (shlex.split(line) for line in lines)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, compile_words[1:])
    assert result.exit_code == 0, result.output
    assert run_words[:3] == ["schedc", "run", "out/tune-local/plan.json"] and run_words[3] == "--nproc"
    check_launch(run_words[2], int(run_words[4]), run_words[5:], [])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s not in SLOW_TO_TUNE])
def test_tune_prints_only_run_commands_the_runtime_accepts(schedule, layout, tmp_path, monkeypatch):
    result = CliRunner().invoke(main, [*TUNE, "--schedules", schedule, *LAYOUTS[layout]])
    if result.exit_code != 0:  # no layout of this schedule fits the request: nothing to run
        assert "error" in result.output and "schedc run" not in result.output
        return
    lines = _local_lines(result.output)
    if lines[0].startswith(REFUSED):
        assert len(lines) == 1 or not lines[1].startswith("schedc")
        return
    _printed_run(lines, tmp_path, monkeypatch)  # raises LaunchError where the runtime would refuse it


@pytest.mark.parametrize("schedule, layout, refusal", [
    ("seq1f1b", LAYOUTS["t2-full-sp"], "sequence chunks"),
    ("offload_1f1b", ["--tp", "1", "--recompute", "full"], "--recompute none")])
def test_what_the_runtime_refuses_is_not_printed_but_its_reason(schedule, layout, refusal):
    """The issue's two: Seq1F1B's chunks with t = 2, placed offload with full recomputation."""
    result = CliRunner().invoke(main, [*TUNE, "--schedules", schedule, *layout])
    assert result.exit_code == 0, result.output
    lines = _local_lines(result.output)
    assert lines[0].startswith(REFUSED) and refusal in lines[0] and "schedc run" not in result.output


def test_a_runnable_winner_prints_its_commands_and_they_pass_the_check(tmp_path, monkeypatch):
    result = CliRunner().invoke(main, [*TUNE, "--schedules", "1f1b", *LAYOUTS["t1"]])
    assert result.exit_code == 0, result.output
    lines = _local_lines(result.output)
    assert lines[0].startswith("schedc compile 1f1b") and lines[1].startswith("schedc run ")
    _printed_run(lines, tmp_path, monkeypatch)
    with pytest.raises(LaunchError, match="--nproc"):  # the check is live: a wrong count is refused
        check_launch("out/tune-local/plan.json", 3, shlex.split(lines[1])[5:], [])


def test_without_the_runtime_the_commands_are_not_printed_and_the_line_says_why(monkeypatch):
    """A machine without torch: tune's last lines say the check could not run, not a traceback (the
    child's check is a module that cannot be imported here, as the runtime without torch)."""
    from schedc.cli import runnable
    monkeypatch.setattr(runnable, "CHECK", "schedc.runtime.process.no_such_check")
    run = LocalRun("1f1b", ("p=2", "m=4"), 2, ("--steps", "3"))
    message = run_refusal(run)
    assert message.startswith("not checked: the runtime cannot be loaded here"), message
    assert "no_such_check" in message


def test_a_check_that_does_not_end_is_cut_and_said_not_waited_for(tmp_path, monkeypatch):
    """The child's check is ended after CHECK_SECONDS (here a module that sleeps, as a check stuck on a
    hung file system would): tune says it was not checked and goes on."""
    from schedc.cli import runnable
    (tmp_path / "sleeping_check.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{sys.path[0]}")
    monkeypatch.setattr(runnable, "CHECK", "sleeping_check")
    monkeypatch.setattr(runnable, "CHECK_SECONDS", 1)
    message = run_refusal(LocalRun("1f1b", ("p=2", "m=4"), 2, ("--steps", "3")))
    assert message == "not checked: the runtime's check did not end within 1 s"


def test_the_check_without_torch_says_so(tmp_path):
    """The child's own answer where torch is missing: exit 3 and the import's message, which tune words
    as `not checked`."""
    code = ("import sys\nsys.modules['torch'] = None\nfrom schedc.runtime.process.prelaunch import main\n"
            "sys.exit(main(['plan.json', '2']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 3 and "torch" in done.stdout, (done.stdout, done.stderr)


def test_tune_checks_its_run_command_without_importing_torch():
    """The compiler never imports torch: `schedc tune` prints a run command the runtime's check passed
    (in its own process) and its own process ends with no torch module loaded."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom schedc.cli import main\n"
            "result = CliRunner().invoke(main, sys.argv[1:])\n"
            "print(result.exit_code, 'schedc run out/tune-local' in result.output, 'torch' in sys.modules)")
    args = [*TUNE, "--schedules", "1f1b", *LAYOUTS["t1"]]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert done.stdout.split() == ["0", "True", "False"], (done.stdout, done.stderr)


LLAMA_TUNE = ["tune", "--model", "llama3.1-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "64",
              "--schedules", "1f1b", *LAYOUTS["t2-full-sp"]]
TINY = ["--hidden", "64", "--heads", "8", "--kv-heads", "2"]  # 8 query heads over 2 key/value heads: t = 2 splits them


def test_a_llama_winner_is_scaled_to_a_tiny_llama_the_runtime_accepts(tmp_path, monkeypatch):
    """Llama 3.1 8B's winner runs, scaled, as Llama 3.1 8B's facts at hidden 64 (SwiGLU 3.5 x 64 = 224 wide,
    hand arithmetic from its 14,336 / 4,096), not the runtime's GPT; the commands pass the pre-launch check."""
    result = CliRunner().invoke(main, LLAMA_TUNE)
    assert result.exit_code == 0, result.output
    assert "p = 2, a 64-wide llama of the same facts):" in result.output and "the runtime's GPT" not in result.output
    lines = _local_lines(result.output)
    words = shlex.split(lines[1])
    assert words[words.index("--model") + 1] == "llama3.1-8b" and " ".join(TINY + ["--ffn", "224"]) in lines[1]
    _printed_run(lines, tmp_path, monkeypatch)


@pytest.mark.parametrize("model", ["llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "qwen2.5-72b", "mistral-7b",
                                   "examples/hf/llama3.1-70b/config.json", "tests/data/hf/tiny-gpt2/config.json"])
def test_each_dense_family_is_scaled_to_its_own_facts(model):
    """Every dense non-GPT description of the library, the README's config.json and a GPT-2 config.json (64
    learned positions): the tiny model keeps the family, MLP, norm, positions, embeddings and biases, groups
    its query heads where the model does, fits its positions, and its MLP keeps the
    description's ratio to hidden within a multiple of 16."""
    from schedc.cli.tune_report import tiny_model
    from schedc.costmodel.modelspec import load_model_spec
    from schedc.runtime.model.gpt import model_problem
    from schedc.runtime.process.options import parse_options
    from schedc.search.space import Request
    seq = (64 if "gpt2" in model else 8192) if model.endswith(".json") else None
    family, options = tiny_model(Request(model, "dgx-h100-80gb", 8, 64, seq=seq))
    spec = load_model_spec(model, seq)
    cfg = parse_options(["plan.json", *options]).model_config
    grouped = 2 if spec.kv_heads < spec.heads else 8  # GPT-2's full heads stay full
    assert family == spec.family == cfg.family and (cfg.hidden, cfg.heads, cfg.kv_heads) == (64, 8, grouped)
    assert model_problem(cfg) is None and cfg.seq <= (spec.max_positions or cfg.seq)
    facts = ("mlp", "norm", "positions", "tied_embeddings", "bias", "rope_theta")
    assert [getattr(cfg, f) for f in facts] == [getattr(spec, f) for f in facts]
    assert abs(cfg.ffn - 64 * spec.ffn / spec.hidden) <= 8 and cfg.ffn % 16 == 0


def test_a_gpt_winner_still_runs_the_runtimes_gpt():
    from schedc.cli.tune_report import tiny_model
    from schedc.search.space import Request
    assert tiny_model(Request("gpt-1.7b", "dgx-a100-80gb", 8, 64)) is None


@pytest.mark.slow
def test_the_printed_llama_run_trains(tmp_path, monkeypatch):
    """The tiny Llama tune prints for Llama 3.1 8B's winner (1F1B, t = 2, full recomputation, sequence
    parallelism) trains on 4 ranks: three steps, each loss finite, the last below the first."""
    from test_runtime import torchrun
    result = CliRunner().invoke(main, LLAMA_TUNE)
    lines = _local_lines(result.output)
    _printed_run(lines, tmp_path, monkeypatch)
    words = shlex.split(lines[1])
    run, _ = torchrun(tmp_path / words[2], int(words[4]), *words[5:])
    assert run.returncode == 0, run.stderr[-3000:]
    losses = [float(line.split()[3]) for line in run.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and losses[-1] < losses[0], run.stdout
