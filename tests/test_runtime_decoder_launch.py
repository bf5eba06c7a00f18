# Tests of the runtime's Llama-family decoder under torchrun, two launches: a tiny Llama's Hugging Face
# config.json (4 layers, hidden 64, 4 heads over 2 key/value heads, SwiGLU 176 wide, RMSNorm, rotary
# positions of theta 500,000, untied) under 1F1B, ZB-H1 and interleaved 1F1B with t = 1 (2 ranks) and
# t = 2 (4 ranks), with and without sequence parallelism, recomputing nothing, the attention core or
# whole layers; sequence chunks and placed R/O/L at t = 1; K-FAC's tasks at t = 1 and 2; context
# parallelism (--cp 2). Each run's loss and first-step gradients (HF names) equal the one-process
# reference's within 1e-5; each forward's saved bytes equal schedc/costmodel/activations.py's decoder rows to the
# byte.
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedc.costmodel.activations import Sizes, runtime_decoder, stage_bytes
from schedc.plan import load_plan
from test_runtime import _dump, launch_plans, plans, reference  # noqa: F401 (fixtures)
from test_runtime_memory import TOLERANCE, relative_errors

MODES = ("none", "selective", "full")
TINY_LLAMA = "tests/data/hf/tiny-llama/config.json"  # Hugging Face's keys: 4 layers, hidden 64, SwiGLU 176
SIZES = Sizes(16, 2, 64, 4, 176, 256, 2)  # its sizes at seq 16, microbatch 2
LLAMA_FACTS = runtime_decoder("swiglu", "rmsnorm", "rope")
T1 = {"1f1b": ("1f1b", {"p": 2, "m": 4}), "zb_h1": ("zb_h1", {"p": 2, "m": 3}),
      "interleaved": ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4})}


@pytest.fixture
def llama() -> list[str]:
    """The model options of the runs and of the reference: the config.json, sequence and microbatch."""
    return ["--model", str(Path(__file__).resolve().parents[1] / TINY_LLAMA), "--seq", "16", "--mb-size", "2"]


def _job(plan: Path, model: list[str], out: Path, *options: str) -> tuple[Path, list[str]]:
    return plan, [*model, "--steps", "1", "--quiet", *options, "--save-grads", str(out),
                  "--report-out", str(out / "report.json")]


def _check(cases: list[tuple[str, Path, Path]], reference, model: list[str]) -> None:  # noqa: F811
    for name, plan, out in cases:
        loss, grads = relative_errors(_dump(out), reference(plan, model))
        assert loss <= TOLERANCE and grads <= TOLERANCE, (name, loss, grads)


KFAC_STEPS = 10  # PipeFisher's 1F1B at p = 2, m = 4 refreshes K-FAC over a cycle of 8 steps: step 8 preconditions


def _kfac_jobs(plan: Path, model: list[str], directory: Path, *options: str) -> list[tuple[Path, list[str]]]:
    """K-FAC's tasks over KFAC_STEPS steps without and with full recomputation, and the same plan's
    tasks ignored (plain SGD)."""
    assert load_plan(plan).cycle_steps == KFAC_STEPS - 2
    sgd = [*model, *options, "--steps", str(KFAC_STEPS), "--quiet", "--optimizer", "sgd", "--lr", "0.05"]
    runs = [[*sgd, "--ignore-tasks"]]  # first: the launch's process keeps the handlers --tasks registers
    runs += [[*sgd, "--tasks", "schedc.runtime.kfac", "--recompute", mode] for mode in ("none", "full")]
    return [(plan, [*run, "--metrics-out", str(directory / f"kfac_{name}")])
            for name, run in zip(("sgd", "none", "full"), runs)]


def _check_kfac(directory: Path) -> None:
    """The same losses with and without recomputation; plain SGD's through the first cycle, then not
    (the first preconditioned update, of step 8, moves step 9's loss: the decoder's linear layers)."""
    losses = {name: [json.loads(line)["loss"] for line in (directory / f"kfac_{name}").read_text().splitlines()]
              for name in ("none", "full", "sgd")}
    assert len(losses["none"]) == KFAC_STEPS and losses["full"] == pytest.approx(losses["none"], rel=TOLERANCE)
    assert losses["none"][:-1] == pytest.approx(losses["sgd"][:-1], rel=TOLERANCE)
    assert abs(losses["none"][-1] - losses["sgd"][-1]) > 1e-3 * abs(losses["sgd"][-1])


def _saved(out: Path) -> dict[str, int]:
    memory = json.loads((out / "report.json").read_text())["memory"]
    return {s: v["saved_bytes_per_microbatch"] for s, v in memory["stages"].items()}


@pytest.mark.slow
def test_the_decoder_on_two_ranks_gives_the_reference(plans, reference, llama, tmp_path):  # noqa: F811
    """t = 1: the three schedules under each --recompute; Seq1F1B's 2 chunks; the library's placed
    recomputation (R) and offload (O, L); 1F1B's saved bytes per stage the table's. K-FAC's tasks
    (PipeFisher's 1F1B, _check_kfac)."""
    cases = [(f"{name}_{mode}", plans(schedule, **params), tmp_path / f"{name}_{mode}", ["--recompute", mode])
             for name, (schedule, params) in T1.items() for mode in MODES]
    cases += [(name, plans(schedule, **params), tmp_path / name, [])
              for name, schedule, params in (("seq1f1b", "seq1f1b", {"p": 2, "m": 4, "k": 2}),
                                             ("offload", "offload_1f1b", {"p": 2, "m": 4}),
                                             ("placed_r", "interleaved_1f1b_recompute", {"p": 2, "v": 2, "m": 4}))]
    jobs = [_job(plan, llama, out, *options) for _, plan, out, options in cases]
    jobs += _kfac_jobs(plans("pipefisher_1f1b", p=2, m=4), llama, tmp_path)
    run = launch_plans(jobs, 2, tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    _check([case[:3] for case in cases], reference, llama)
    for mode in MODES:
        want = {str(s): stage_bytes(SIZES, LLAMA_FACTS, 2, s == 0, s == 1, recompute=mode) for s in range(2)}
        assert _saved(tmp_path / f"1f1b_{mode}") == want, mode
    _check_kfac(tmp_path)


@pytest.mark.slow
def test_the_decoder_on_four_ranks_with_tensor_parallelism_gives_the_reference(plans, reference, llama,  # noqa: F811
                                                                               tmp_path):
    """t = 2, p = 2 (query heads 2 and key/value heads 1 a rank, lm_head vocabulary-parallel): 1F1B
    under each --recompute with and without sequence parallelism, each stage's saved bytes on every
    tensor rank the table's; ZB-H1 and interleaved 1F1B with and without sequence parallelism; K-FAC's
    tasks with sequence parallelism (_check_kfac); and 1F1B with context parallelism, --cp 2 (each
    context rank's rotary angles its two chunks')."""
    cases = []
    for sp in (False, True):
        flags = ["--tp", "2", *(["--sequence-parallel"] if sp else [])]
        label = "_sp" if sp else ""
        cases += [(f"1f1b_{mode}{label}", plans("1f1b", p=2, m=4), [*flags, "--recompute", mode]) for mode in MODES]
        cases += [(f"zb_h1{label}", plans("zb_h1", p=2, m=3), [*flags, "--recompute", "selective" if sp else "none"]),
                  (f"interleaved{label}", plans("interleaved_1f1b", p=2, v=2, m=4),
                   [*flags, "--recompute", "full" if sp else "none"])]
    cases.append(("1f1b_cp", plans("1f1b", p=2, m=4), ["--cp", "2", "--recompute", "selective"]))
    jobs = [_job(plan, llama, tmp_path / name, *options) for name, plan, options in cases]
    jobs += _kfac_jobs(plans("pipefisher_1f1b", p=2, m=4), llama, tmp_path, "--tp", "2", "--sequence-parallel")
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    _check([(name, plan, tmp_path / name) for name, plan, _ in cases], reference, llama)
    _check_kfac(tmp_path)
    for sp in (False, True):
        for mode in MODES:
            out = tmp_path / f"1f1b_{mode}{'_sp' * sp}"
            want = {str(s): stage_bytes(SIZES, LLAMA_FACTS, 2, s == 0, s == 1, 2, sp, mode) for s in range(2)}
            assert _saved(out) == want, (mode, sp)
            ranks = [rank["saved_bytes_per_microbatch"] for rank in
                     json.loads((out / "report.json").read_text())["memory"]["ranks"]]
            assert ranks == [{"0": want["0"]}] * 2 + [{"1": want["1"]}] * 2, (mode, sp)  # every tensor rank alike
