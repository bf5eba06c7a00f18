# Tests of --dtype bf16-main (runtime/model/precision.py), Megatron-LM's mixed precision: bf16 weights
# and messages, fp32 main gradients and weights. On one process the arithmetic is checked against a
# hand-made fp32 accumulation; across ranks the pipelined run against the one-process reference doing
# the same per microbatch (the same op order, so bit for bit where the sums run in the same order).
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from schedc.plan import Instr
from schedc.runtime.__main__ import main as runtime_main
from schedc.runtime.execution.executor import attach_flat_grads
from schedc.runtime.model.gpt import ModelConfig, Stage, build_model, partition
from schedc.runtime.model.precision import MainParams, boundary_shapes, gradient
from schedc.runtime.process.options import OptionError, parse_options
from test_runtime import _dump, launch_plans, plans  # noqa: F401 (fixtures)

FOUR = ["--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]


def _stage() -> Stage:
    torch.manual_seed(0)
    stage = Stage([("a", nn.Linear(8, 8)), ("b", nn.Linear(8, 4))])
    attach_flat_grads(stage)
    return stage


def test_main_weights_are_the_bf16_weights_in_fp32_and_gradients_add_up_in_fp32():
    """Two microbatches' bf16 gradients land in the fp32 main gradient as their fp32 sum (each freed
    from .grad); the step moves the fp32 main weights and the bf16 weights are their rounding."""
    stage = _stage()
    fp32 = [p.detach().clone() for p in stage.parameters()]
    main = MainParams({0: stage})
    (flat,) = main.parameters()
    assert all(p.dtype == torch.bfloat16 for p in stage.parameters()) and flat.dtype == torch.float32
    assert torch.equal(flat, torch.cat([w.to(torch.bfloat16).float().reshape(-1) for w in fp32]))
    want = torch.zeros_like(flat)
    for mb in range(2):
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(mb)).to(torch.bfloat16)
        stage(x).float().square().sum().backward()
        want += torch.cat([p.grad.float().reshape(-1) for p in stage.parameters()])
        main.after(Instr("B", 0, mb))
        assert all(p.grad is None for p in stage.parameters())
    assert torch.equal(stage.flat_grad, want) and torch.equal(flat.grad, want)
    assert torch.equal(torch.cat([gradient(p).reshape(-1) for p in stage.parameters()]), want)
    optimizer = torch.optim.SGD(main.parameters(), lr=1e-3)
    before = flat.detach().clone()
    optimizer.step()
    main.after_step()
    assert torch.equal(flat.detach(), before.add(want, alpha=-1e-3))  # SGD: w -= lr g, in fp32
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in stage.parameters()]),
                       flat.detach().to(torch.bfloat16))


def test_a_forward_leaves_the_main_gradients_alone():
    stage = _stage()
    main = MainParams({0: stage})
    stage(torch.ones(2, 8, dtype=torch.bfloat16)).sum().backward()
    main.after(Instr("F", 0, 0))
    assert not stage.flat_grad.any() and all(p.grad is not None for p in stage.parameters())


def test_boundary_shapes_come_from_the_meta_device_in_bf16():
    """No forward on the host: every piece's weights may be absent; the boundary is what a real bf16
    stage returns."""
    cfg = ModelConfig(layers=4, hidden=32, heads=2, seq=16, vocab=256, mb_size=2)
    pieces = build_model(cfg)
    runs = partition(pieces, 2)
    shapes = boundary_shapes(runs, cfg)
    stage = Stage([(n, m) for n, m in runs[0]]).to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        out = stage(torch.zeros(2, 16, dtype=torch.long))
    assert shapes == [(out.shape, torch.bfloat16)]


@pytest.mark.parametrize("options,named", [
    (["--zero", "1", "--dp", "2"], "--zero"), (["--distributed-optimizer", "--dp", "2"], "--zero"),
    (["--tasks", "schedc.runtime.kfac"], "--tasks")])
def test_what_main_weights_do_not_compose_with_is_refused(options, named):
    with pytest.raises(OptionError, match=f"--dtype bf16-main does not compose with {named} yet"):
        parse_options(["plan.json", "--dtype", "bf16-main", *options])


# name: (schedule, params, options, dp, tolerance); 0 is bit for bit
CASES = {
    "1f1b": ("1f1b", {"p": 2, "m": 4}, [], 1, 0.0),
    "zb_h1": ("zb_h1", {"p": 2, "m": 4}, [], 1, 0.0),  # split backward: W's gradients folded too
    "dualpipev": ("dualpipev", {"p": 2, "m": 4}, [], 1, 0.0),  # OVERLAP_F_B's backward halves
    "interleaved": ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4}, ["--steps", "3"], 1, 0.0),
    "offload": ("offload_1f1b", {"p": 2, "m": 4}, [], 1, 0.0),  # bf16 storages to the host and back
    "recompute": ("zb_h1", {"p": 2, "m": 4}, ["--recompute", "full"], 1, 0.0),
    # two replicas: their sums added, (g0 + g1) + (g2 + g3) against ((g0 + g1) + g2) + g3 (measured: equal)
    "data_clip": ("1f1b", {"p": 1, "m": 2}, ["--clip-grad", "0.05"], 2, 1e-6),
    # activations all-reduced over the tensor ranks in bf16 (Megatron's), the reference's sums one GEMM's in
    # fp32: measured 8.0e-3 (9.0e-3 with sequence parallelism), bf16 autocast 4.3e-3
    "tensor": ("1f1b", {"p": 1, "m": 4}, ["--tp", "2", "--sequence-parallel"], 1, 1e-2),
}


@pytest.mark.slow
def test_main_weights_give_the_reference_with_the_same_arithmetic(plans, tmp_path):  # noqa: F811
    """One 2-rank launch; every case against the one-process bf16-main reference, over three steps
    where given (the losses of every step); the messages half the bytes of fp32's."""
    jobs = []
    for name, (schedule, params, options, dp, _) in CASES.items():
        steps = [] if "--steps" in options else ["--steps", "1"]
        jobs.append((plans(schedule, **params), [*FOUR, "--dtype", "bf16-main", *options, *steps, "--dp", str(dp),
                                                 "--quiet", "--save-grads", str(tmp_path / name),
                                                 "--metrics-out", str(tmp_path / name / "metrics.jsonl")]))
    jobs.append((plans("1f1b", p=2, m=4), [*FOUR, "--steps", "1", "--quiet", "--save-grads", str(tmp_path / "fp32")]))
    run = launch_plans(jobs, 2, tmp_path)
    assert run.returncode == 0, run.stderr
    for name, (schedule, params, options, dp, tolerance) in CASES.items():
        steps = [] if "--steps" in options else ["--steps", "1"]
        out = tmp_path / f"ref_{name}"
        reference = [str(plans(schedule, **params)), "--reference", *FOUR, "--dtype", "bf16-main", "--dp", str(dp),
                     *[o for o in options if o not in ("--tp", "2", "--sequence-parallel")], *steps, "--quiet",
                     "--save-grads", str(out), "--metrics-out", str(out / "metrics.jsonl")]
        assert runtime_main(reference) == 0
        (loss, grads), (want_loss, want) = _dump(tmp_path / name), _dump(out)
        assert sorted(grads) == sorted(want)
        worst = max(((grads[n].float() - w.float()).norm() / w.float().norm()).item() for n, w in want.items())
        assert worst <= tolerance and abs(loss - want_loss) <= max(tolerance, 1e-6) * abs(want_loss), (name, worst)
        assert _losses(tmp_path / name) == pytest.approx(_losses(out), rel=max(tolerance, 1e-6)), name
    sent = json.loads((tmp_path / "1f1b" / "sent.json").read_text())["bytes_sent"]
    assert [2 * n for n in sent] == json.loads((tmp_path / "fp32" / "sent.json").read_text())["bytes_sent"]


def _losses(directory: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (directory / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_resumed_main_weights_run_continues_with_identical_losses(plans, tmp_path):  # noqa: F811
    """The checkpoint keeps the fp32 main weights (the bf16 ones alone would lose their low bits)."""
    plan = plans("1f1b", p=2, m=4)
    common = [*FOUR, "--dtype", "bf16-main", "--steps", "4", "--quiet"]
    jobs = [(plan, [*common, "--metrics-out", str(tmp_path / "full.jsonl")]),
            (plan, [*FOUR, "--dtype", "bf16-main", "--steps", "2", "--quiet", "--save", str(tmp_path / "ckpt")]),
            (plan, [*common, "--resume", str(tmp_path / "ckpt"), "--metrics-out", str(tmp_path / "resumed.jsonl")])]
    run = launch_plans(jobs, 2, tmp_path)
    assert run.returncode == 0, run.stderr
    full = [json.loads(line)["loss"] for line in (tmp_path / "full.jsonl").read_text().splitlines()]
    resumed = [json.loads(line)["loss"] for line in (tmp_path / "resumed.jsonl").read_text().splitlines()]
    assert resumed == full[2:]
