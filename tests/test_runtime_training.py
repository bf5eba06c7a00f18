# Tests of the runtime's training options against the one-process reference run with the same options:
# uneven stages (--stage-layers, --account-for-embedding, --account-for-loss: schedc.layout.split_layers),
# bf16 mixed precision, gradient clipping by the global norm over pipeline, replica and data-parallel
# ranks, the learning-rate schedule, a user loss; and `schedc run` refusing what would fail on every
# rank (a bad split, user code that does not import) before torchrun starts.
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from schedc.costmodel.activations import RUNTIME_GPT, Sizes, stage_bytes
from schedc.layout import SplitError, split_layers
from schedc.runtime.__main__ import main as runtime_main
from test_runtime import _dump, launch_plans, plans  # noqa: F401 (fixtures)

FIVE = ["--layers", "5", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]
SIX = ["--layers", "6", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]
TOLERANCE = 1e-5
BF16_TOLERANCE = 1e-2  # bf16 rounding of per-microbatch against whole-batch GEMMs (measured: 2.6e-3)


def smoothed_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A user loss for --loss: label-smoothed cross entropy, the mean over the microbatch's tokens."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), label_smoothing=0.1)


@pytest.mark.parametrize("args,want", [
    ((8, 3), (3, 3, 2)), ((8, 3, (2, 3, 3)), (2, 3, 3)), ((5, 1), (5,)),
    ((6, 4, None, True, False), (1, 2, 2, 1)), ((6, 4, None, False, True), (2, 2, 2, 0)),
    ((6, 4, None, True, True), (1, 2, 2, 1)), ((2, 3, None, True), (0, 1, 1)),
])
def test_split_layers(args, want):
    assert split_layers(*args) == want and sum(want) == args[0]


@pytest.mark.parametrize("args,message", [
    ((4, 2, (1, 1)), "--stage-layers 1,1 sums to 2 layers; the model has 4 (--layers)"),
    ((4, 2, (0, 4)), "--stage-layers 0,4: stage 0 has no layer; every stage needs at least one"),
    ((4, 2, (1, 2, 1)), "--stage-layers 1,2,1 names 3 stages; the plan has 2"),
    ((4, 2, (1, 3), False, True), "--account-for-loss only change the even split: give one or the other"),
    ((1, 2), "the plan has 2 model stages but the model has 1 layers to split; every stage needs at least one "
             "(use --layers 2 or more)"),
    ((1, 4, None, True, True), "1 layers to split with the embedding and the loss counted as layers; every stage "
                               "needs at least one (use --layers 2 or more)"),
])
def test_a_split_that_cannot_be_names_the_option(args, message):
    with pytest.raises(SplitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        split_layers(*args)


def _reference(tmp: Path, name: str, plan: Path, options: list[str], dp: int = 1):
    out = tmp / f"ref_{name}"
    assert runtime_main([str(plan), "--reference", *options, "--dp", str(dp), "--quiet", "--save-grads", str(out),
                         "--metrics-out", str(out / "metrics.jsonl")]) == 0
    return _dump(out), _losses(out / "metrics.jsonl")


def _losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def _errors(got: tuple, want: tuple) -> tuple[float, float]:
    (loss, grads), (ref_loss, ref_grads) = got, want
    assert sorted(grads) == sorted(ref_grads)
    worst = max(((grads[n] - r).norm() / r.norm()).item() for n, r in ref_grads.items())
    return abs(loss - ref_loss) / abs(ref_loss), worst


# name: (schedule, params, model, options, dp); every case one step but the learning-rate schedule's
CASES = {
    "explicit": ("1f1b", {"p": 2, "m": 4}, FIVE, ["--stage-layers", "1,4"], 1),
    "embedding": ("zb_h1", {"p": 2, "m": 3}, FIVE, ["--account-for-embedding"], 1),
    "loss_only": ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4}, SIX, ["--account-for-loss"], 1),
    "both_ends": ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4}, SIX,
                  ["--account-for-embedding", "--account-for-loss"], 1),
    "clip_pipeline": ("1f1b", {"p": 2, "m": 4}, FIVE, ["--clip-grad", "0.05"], 1),
    "clip_replicas": ("chimera", {"p": 2, "m": 4}, FIVE, ["--clip-grad", "0.05"], 1),
    "clip_data": ("gpipe", {"p": 1, "m": 2}, FIVE, ["--clip-grad", "0.05"], 2),
    "lr_schedule": ("1f1b", {"p": 2, "m": 4}, FIVE, ["--lr", "0.01", "--lr-warmup-steps", "2",
                                                       "--lr-decay-steps", "4", "--steps", "6"], 1),
    "user_loss": ("1f1b", {"p": 2, "m": 4}, FIVE, ["--loss", "test_runtime_training:smoothed_loss"], 1),
    "bf16": ("1f1b", {"p": 2, "m": 4}, FIVE, ["--dtype", "bf16"], 1),
    "bf16_recompute": ("zb_h1", {"p": 2, "m": 3}, FIVE, ["--dtype", "bf16", "--recompute", "full"], 1),
    # sequence chunks (Seq1F1B, runtime/execution/chunks.py): data-parallel replicas' chunks, six steps, the
    # attention core recomputed over the earlier chunks' keys, bf16
    "chunks_clip_data": ("seq1f1b", {"p": 1, "m": 2, "k": 2}, FIVE, ["--clip-grad", "0.05"], 2),
    "chunks_lr_schedule": ("seq1f1b", {"p": 2, "m": 4, "k": 4}, FIVE, ["--lr", "0.01", "--lr-warmup-steps", "2",
                                                                      "--lr-decay-steps", "4", "--steps", "6"], 1),
    "chunks_selective": ("seq1f1b", {"p": 2, "m": 4, "k": 2}, FIVE, ["--recompute", "selective"], 1),
    "chunks_bf16": ("seq1f1b", {"p": 2, "m": 4, "k": 2}, FIVE, ["--dtype", "bf16"], 1),
}
SPLITS = {"explicit": (1, 4), "embedding": (2, 3), "loss_only": (2, 2, 2, 0), "both_ends": (1, 2, 2, 1)}


@pytest.mark.slow
def test_training_options_give_the_reference_with_the_same_options(plans, tmp_path):  # noqa: F811
    """One 2-rank launch. Uneven splits (their stages' saved bytes, measured, are those of their layer
    counts: the split the runtime made), clipping (a norm far below the gradients', so it scales them)
    over two pipeline ranks, over Chimera's replicas, over two data-parallel ranks, the warm-up and
    cosine schedule over six steps, a user loss, and Seq1F1B's sequence chunks under data parallelism,
    six steps, selective recomputation: rel <= 1e-5 against the reference with the same options;
    bf16 against the bf16 reference within BF16_TOLERANCE (measured: 2.6e-3 on the gradients, 1e-7 on
    the loss; fp32 cases 3.4e-7 at most)."""
    jobs = []
    for name, (schedule, params, model, options, dp) in CASES.items():
        steps = [] if "--steps" in options else ["--steps", "1"]
        jobs.append((plans(schedule, **params), [*model, *options, *steps, "--dp", str(dp), "--quiet", "--save-grads",
                                                 str(tmp_path / name), "--report-out", str(tmp_path / f"{name}.json"),
                                                 "--metrics-out", str(tmp_path / name / "metrics.jsonl")]))
    run = launch_plans(jobs, 2, tmp_path)
    assert run.returncode == 0, run.stderr
    for name, (schedule, params, model, options, dp) in CASES.items():
        steps = [] if "--steps" in options else ["--steps", "1"]
        want, want_losses = _reference(tmp_path, name, plans(schedule, **params), [*model, *options, *steps], dp)
        loss, grads = _errors(_dump(tmp_path / name), want)
        limit = BF16_TOLERANCE if "bf16" in name else TOLERANCE
        assert loss <= limit and grads <= limit, (name, loss, grads)
        assert _losses(tmp_path / name / "metrics.jsonl") == pytest.approx(want_losses, rel=limit), name
    _assert_splits(tmp_path)
    _assert_options_mattered(plans, tmp_path)


def _assert_splits(tmp: Path) -> None:
    sizes = Sizes(16, 2, 32, 2, 128, 256)
    for name, counts in SPLITS.items():
        stages = json.loads((tmp / f"{name}.json").read_text())["memory"]["stages"]
        want = {str(s): stage_bytes(sizes, RUNTIME_GPT, n, s == 0, s == len(counts) - 1) for s, n in enumerate(counts)}
        assert {s: v["saved_bytes_per_microbatch"] for s, v in stages.items()} == want, name


def _assert_options_mattered(plans, tmp: Path) -> None:  # noqa: F811
    """Without the option the reference is another: clipping scaled the gradients, the schedule moved
    the losses, the user's loss is not the default one."""
    plain, plain_losses = _reference(tmp, "plain", plans("1f1b", p=2, m=4), [*FIVE, "--steps", "6", "--lr", "0.01"])
    _, clipped = _dump(tmp / "ref_clip_pipeline")
    assert math.sqrt(sum(g.square().sum().item() for g in clipped.values())) == pytest.approx(0.05, rel=1e-4)
    assert math.sqrt(sum(g.square().sum().item() for g in plain[1].values())) > 1.0
    assert _losses(tmp / "ref_lr_schedule" / "metrics.jsonl")[1:] != pytest.approx(plain_losses[1:], rel=1e-4)
    assert _dump(tmp / "ref_user_loss")[0] != pytest.approx(plain[0], rel=1e-4)


@pytest.mark.parametrize("args,message", [
    (["--stage-layers", "1,1"], "--stage-layers 1,1 sums to 2 layers; the model has 4 (--layers)"),
    (["--stage-layers", "x"], "--stage-layers 'x': give one layer count per stage, as 2,3,3,2"),
    (["--stage-layers", "2,2", "--account-for-loss"], "--account-for-loss only change the even split: give one"),
    (["--clip-grad", "0"], "--clip-grad must be a finite norm > 0, got 0.0"),
    (["--lr-warmup-steps", "3", "--lr-decay-steps", "3"], "--lr-decay-steps 3 must be past the warm-up's"),
    (["--model-code", "no_such_module:build"], "--model-code 'no_such_module:build': No module named 'no_such_module'"),
    (["--data", "test_runtime_training:nothing"], "--data 'test_runtime_training:nothing': module "),
    (["--loss", "test_runtime_training"], "--loss 'test_runtime_training': expected 'package.module:function'"),
    (["--loss", "test_runtime_training:FIVE"], "--loss 'test_runtime_training:FIVE': FIVE is not a function"),
    (["--loss", "test_runtime_training:smoothed_loss", "--tp", "2"], "give one of --loss and --tp"),
])
def test_run_refuses_a_bad_split_or_user_code_before_torchrun(plans, args, message):  # noqa: F811
    from schedc.cli import main
    result = CliRunner().invoke(main, ["run", str(plans("1f1b", p=2, m=4)), "--layers", "4", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_run_finds_user_code_in_the_current_directory(plans, tmp_path, monkeypatch):  # noqa: F811
    """As `python -m schedc.runtime` does: a module beside the user, not installed, imports."""
    import sys
    (tmp_path / "here_loss.py").write_text("import torch.nn.functional as F\n\n"
                                           "def loss(logits, targets):\n"
                                           "    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    from schedc.runtime.process.launch import launch_from_cli
    assert launch_from_cli(plans("1f1b", p=2, m=4), None, ["--layers", "4", "--hidden", "32", "--heads", "2",
                                                          "--seq", "16", "--steps", "1", "--quiet", "--reference",
                                                          "--loss", "here_loss:loss"]) == 0
    assert str(tmp_path) not in sys.path


TENSOR_CASES = {"tp_clip": ["--clip-grad", "0.05"], "tp_selective": ["--recompute", "selective"],
                "tp_full": ["--recompute", "full"],
                "sp_selective": ["--sequence-parallel", "--recompute", "selective", "--clip-grad", "0.05"]}


@pytest.mark.slow
def test_clipping_and_recomputation_under_tensor_parallelism(plans, tmp_path):  # noqa: F811
    """One 4-rank launch, 1F1B at t = 2, p = 2: the global norm counts a split weight's shards each once
    and a replicated weight once (not on every tensor rank), and the tensor-parallel block's attention
    core is recomputed like the whole one's: the reference's loss and gradients (rel <= 1e-5)."""
    plan = plans("1f1b", p=2, m=4)
    jobs = [(plan, [*FIVE, "--tp", "2", *options, "--steps", "1", "--quiet", "--save-grads", str(tmp_path / name)])
            for name, options in TENSOR_CASES.items()]
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr
    for name, options in TENSOR_CASES.items():
        reference = [o for o in options if o not in ("--sequence-parallel", "--recompute", "selective", "full")]
        want, _ = _reference(tmp_path, name, plan, [*FIVE, *reference, "--steps", "1"])
        loss, grads = _errors(_dump(tmp_path / name), want)
        assert loss <= TOLERANCE and grads <= TOLERANCE, (name, loss, grads)
