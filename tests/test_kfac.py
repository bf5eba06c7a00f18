"""schedc/runtime/model/kfac.py: K-FAC numerics against dense computations, and PipeFisher plans under torchrun
against K-FAC computed in one process (tests/kfac_reference.py)."""
from __future__ import annotations

import json
import os
from dataclasses import replace
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from kfac_reference import plan_staleness, train_reference
from schedc.runtime.model.kfac import DAMPING, EMA, damped_inverse, layer_input, precondition_layer, weight_grad
from schedc.runtime.model.gpt import ModelConfig

ROOT = Path(__file__).resolve().parent.parent
# measured-like costs (ms): the K-FAC work is small beside F and B, so a refresh takes a few steps even
# where the bubbles are nearly gone (ZB-H1, DualPipeV); I + W = B and DualPipeV's F&B = F + B (no
# overlap gain). With the add-on's own costs (forward units: inversion 8, curvature 1.3 per layer, F 1)
# the p = 2, m = 4 cycle is 20 steps on ZB-H1 and 12 on DualPipeV: each device has 1 (2) units of
# bubble per step, 0.9 (1.8) of it taken by precondition every step, for 21 (42) units of refresh.
COSTS = {"unit": "ms", "F": 0.14, "B": 0.16, "I": 0.08, "W": 0.08, "FB": 0.3, "curvature_A": 0.01,
         "curvature_B": 0.01, "inversion": 0.2, "precondition": 0.07}
MODEL = ModelConfig(layers=2, hidden=16, heads=2, seq=8, vocab=32, mb_size=4)
SEED, STEPS, LR = 0, 6, 0.05
RTOL = 1e-5
BACKWARDS = {"zb_h1": {"I", "W"}, "dualpipev": {"B", "I", "W"}, "v_half": {"I", "W"}}  # else B only


def test_factors_inverses_and_preconditioned_gradient_match_dense():
    torch.manual_seed(0)
    layer = nn.Linear(5, 3)
    x = torch.randn(7, 5)
    y = layer(x)
    y.retain_grad()
    loss = (y ** 2).sum() / 2 + y[:, 0].sum()
    loss.backward()
    a, g = layer_input(layer, x), y.grad
    # factors: E[a aT] with a = [x, 1], E[g gT], against a per-row loop
    dense_a = sum(torch.outer(torch.cat([x[r], torch.ones(1)]), torch.cat([x[r], torch.ones(1)]))
                  for r in range(7)) / 7
    dense_g = sum(torch.outer(g[r], g[r]) for r in range(7)) / 7
    assert torch.allclose(a.T @ a / 7, dense_a, atol=1e-6)
    assert torch.allclose(g.T @ g / 7, dense_g, atol=1e-6)
    # inverses of the damped factors
    damping = 1e-2
    a_inv, g_inv = damped_inverse(dense_a, damping), damped_inverse(dense_g, damping)
    assert torch.allclose(a_inv, torch.linalg.inv(dense_a + damping ** 0.5 * torch.eye(6)), atol=1e-4)
    # preconditioned gradient: (A ⊗ G)^-1 vec(∇) with the damped factors, solved densely
    grad = weight_grad(layer).clone()
    kron = torch.kron(dense_a + damping ** 0.5 * torch.eye(6), dense_g + damping ** 0.5 * torch.eye(3))
    expected = torch.linalg.solve(kron, grad.T.reshape(-1)).reshape(6, 3).T  # vec stacks columns
    precondition_layer(layer, a_inv, g_inv)
    assert torch.allclose(weight_grad(layer), expected, atol=1e-4)
    assert torch.allclose(layer.bias.grad, expected[:, -1], atol=1e-4)


def _compile(tmp: Path, name: str, addons: tuple[str, ...] = (), **params) -> Path:
    costs = tmp / "costs.json"  # the kinds the schedule runs: measured costs name no other
    runs = BACKWARDS.get(name, {"B"}) | ({"FB"} if name == "dualpipev" else set())
    costs.write_text(json.dumps({k: v for k, v in COSTS.items() if k not in ("B", "I", "W", "FB") or k in runs}))
    out = tmp / name
    args = [sys.executable, "-m", "schedc.cli", "compile", str(ROOT / "schedc" / "schedules" / f"{name}.sched"), "-o",
            str(out), "--costs", str(costs)] + [f"-D{k}={v}" for k, v in params.items()]
    args += [f"--with={addon}" for addon in addons]
    subprocess.run(args, check=True, capture_output=True, text=True)
    return out / "plan.json"


def _launch(plan: Path, tmp: Path, ranks: int = 2, steps: int = STEPS, model: ModelConfig = MODEL) -> subprocess.Popen:
    """The plan on `ranks` ranks under torchrun, SGD with K-FAC, a checkpoint after the last step."""
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port",
            str(29500 + os.getpid() % 3000), "-m", "schedc.runtime", str(plan), "--synthetic",
            "--seed", str(SEED), "--layers", str(model.layers), "--hidden", str(model.hidden),
            "--heads", str(model.heads), "--seq", str(model.seq), "--vocab", str(model.vocab),
            "--mb-size", str(model.mb_size), "--steps", str(steps), "--optimizer", "sgd", "--lr", str(LR),
            "--tasks", "schedc.runtime.kfac", "--quiet", "--metrics-out", str(tmp / "metrics.jsonl"),
            "--device", "cpu", "--save", str(tmp / "checkpoints"), "--every", str(steps)]
    return subprocess.Popen(args, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _results(run: subprocess.Popen, tmp: Path, ranks: int = 2) -> tuple[list[float], list[dict[int, dict]]]:
    """Rank 0's per-step losses and every rank's final stage weights (from the checkpoint)."""
    try:
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 0, stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (tmp / "metrics.jsonl").read_text().splitlines()]
    save = tmp / "checkpoints"
    final = save / json.loads((save / "latest.json").read_text())["dir"]
    stages = [torch.load(final / f"rank{rank}.pt", weights_only=False)["stages"] for rank in range(ranks)]
    return losses, stages


def _distance(pipeline: list[dict[int, dict]], reference: list[dict], start: list[dict]
              ) -> tuple[float, float]:
    """Over every weight tensor of every stage on every rank: the largest |pipeline - reference|
    relative to |reference| and relative to |reference - start| (the reference's whole update)."""
    weights = updates = 0.0
    for held in pipeline:
        for s, state in held.items():
            for key, value in state.items():
                ref, diff = reference[s][key], (value - reference[s][key]).norm()
                weights = max(weights, (diff / ref.norm()).item())
                updates = max(updates, (diff / (ref - start[s][key]).norm()).item())
    return weights, updates


def _curvature_between_i_and_w(plan: dict) -> set[tuple[int, int]]:
    """The (stage, microbatch) pairs whose curvature_B runs after their I and before their W."""
    found = set()
    for rank in plan["ranks"]:
        for step in rank["steps"]:
            at = {(instr["op"], instr["stage"], instr["mb"]): n for n, instr in enumerate(step)}
            found |= {(s, mb) for (op, s, mb), n in at.items() if op == "curvature_B"
                      and at.get(("I", s, mb), n) < n < at.get(("W", s, mb), n)}
    return found


@pytest.mark.slow
@pytest.mark.parametrize("schedule,params,ranks,steps,cycle,lagged", [
    ("pipefisher", {"p": 2, "m": 4}, 2, STEPS, 2, False),
    ("pipefisher_1f1b", {"p": 2, "m": 4}, 2, STEPS, 2, False),
    ("pipefisher", {"p": 4, "m": 4}, 4, 8, 2, True),
    ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4}, 2, 8, 3, False),
    ("zb_h1", {"p": 2, "m": 4}, 2, STEPS, 2, False),
    ("dualpipev", {"p": 2, "m": 4}, 2, 9, 4, False),
    ("v_half", {"p": 2, "m": 4}, 2, 7, 3, False)],
    ids=["chimera", "1f1b", "chimera-lagged", "interleaved-with-kfac", "zb_h1-with-kfac", "dualpipev-with-kfac",
         "v_half-with-kfac"])
def test_pipefisher_plan_updates_like_one_process_kfac(tmp_path, schedule, params, ranks, steps, cycle, lagged):
    """The plan's run (Chimera: factors and inverse shares exchanged between the replicas at the end of
    the step; 1F1B: everything local) against K-FAC on the unpartitioned model in this process, with the
    plan's microbatches and staleness: a cycle of 2 steps, curvature from its first step, inverses
    published at the end of the cycle's last step holding the stage's inversion (on 2 ranks its second,
    so steps 0-1 are plain SGD, 2-3 use step 0's curvature and 4-5 step 2's). Chimera on 4 ranks has
    its inversions lagged by the fill: they run in the cycle after their curvature, in its first
    step, on the previous refresh's factors (none in the first cycle), so steps 0-2 are plain SGD,
    3-4 use step 0's curvature and 5-6 step 2's. Interleaved 1F1B, ZB-H1 and DualPipeV get the same
    work from the add-on (`--with kfac`): interleaved 2 chunks per rank, a cycle of 3; ZB-H1 a split
    backward (the output gradients curvature_B reads come from I), a cycle of 2; DualPipeV 2 chunks per
    rank in a V, full backwards in the steady state (inside overlapped F&B ops) and split ones in
    warm-up and drain, a cycle of 4 with inversions cut in 2 pieces over 2 steps; V-Half a split
    backward whose curvature_B of stage 0 runs between its I and W (stage 0 has no input gradient, yet
    its I must compute the gradients inside the stage). Losses and final weights agree; a reference
    without staleness or without K-FAC does not."""
    addons = () if schedule.startswith("pipefisher") else ("kfac",)
    plan_path = _compile(tmp_path, schedule, addons, **params)
    plan = json.loads(plan_path.read_text())
    stages = plan["stages"]
    found, inversion, _ = plan_staleness(plan)
    assert found == cycle and sorted(inversion) == list(range(stages))
    assert (min(inversion.values()) >= cycle) == lagged == bool(plan["stats"]["lagged"])
    assert steps > cycle + max(inversion.values()) + 1  # some steps use the second refresh
    ops = {instr["op"] for rank in plan["ranks"] for step in rank["steps"] for instr in step}
    assert ops & {"B", "I", "W"} == BACKWARDS.get(schedule, {"B"})
    if schedule == "v_half":
        assert 0 in {s for s, _ in _curvature_between_i_and_w(plan)}

    model = replace(MODEL, layers=max(MODEL.layers, stages))  # a layer per stage at least

    def reference(steps: int, **variant):
        return train_reference(plan, model, SEED, steps, LR, DAMPING, EMA, **variant)

    launched = _launch(plan_path, tmp_path, ranks, steps, model)
    try:  # the references meanwhile: K-FAC at the plan's staleness, without staleness, plain SGD
        start = reference(0)[1]
        ref_losses, ref_weights = reference(steps)
        others = {"fresh inverses": reference(steps, fresh=True), "no K-FAC": reference(steps, kfac=False)}
    except BaseException:
        launched.kill()
        raise
    losses, weights = _results(launched, tmp_path, ranks)
    assert all(len(held) == stages * (2 if schedule == "pipefisher" else 1) // ranks for held in weights)
    assert losses == pytest.approx(ref_losses, rel=RTOL)
    assert losses[-1] < losses[0]
    off_weights, off_updates = _distance(weights, ref_weights, start)
    assert off_weights < RTOL and off_updates < 10 * RTOL, (off_weights, off_updates)
    for name, (other_losses, other_weights) in others.items():
        assert losses != pytest.approx(other_losses, rel=100 * RTOL), name
        assert _distance(weights, other_weights, start)[1] > 1e-2, name


def _model_args(model: ModelConfig) -> list[str]:
    return ["--synthetic", "--seed", str(SEED), "--layers", str(model.layers), "--hidden", str(model.hidden),
            "--heads", str(model.heads), "--seq", str(model.seq), "--vocab", str(model.vocab),
            "--mb-size", str(model.mb_size), "--device", "cpu"]


@pytest.mark.slow
def test_kfac_under_tensor_parallelism_updates_like_one_process_kfac(tmp_path):
    """t = 2 on p = 2 (four ranks, one launch): PipeFisher's 1F1B with and without sequence parallelism,
    and ZB-H1 with the add-on under sequence parallelism and selective recomputation. Each tensor rank
    holds half of every column- and row-parallel layer, yet the factors are the whole layers' (the
    pieces gathered) and the update is G⁻¹ ∇[W, b] A⁻¹ of the whole gradient: the six steps' losses
    equal one-process K-FAC's at the plan's staleness, and not plain SGD's."""
    from test_runtime import launch_plans
    plans = {"1f1b": _compile(tmp_path, "pipefisher_1f1b", p=2, m=4),
             "zb_h1": _compile(tmp_path, "zb_h1", ("kfac",), p=2, m=4)}
    cases = {"1f1b": ("1f1b", []), "1f1b_sp": ("1f1b", ["--sequence-parallel"]),
             "zb_h1_sp": ("zb_h1", ["--sequence-parallel", "--recompute", "selective"])}
    jobs = [(plans[plan], [*_model_args(MODEL), "--tp", "2", *extra, "--steps", str(STEPS), "--optimizer", "sgd",
                           "--lr", str(LR), "--tasks", "schedc.runtime.kfac", "--quiet",
                           "--metrics-out", str(tmp_path / f"{name}.jsonl")])
            for name, (plan, extra) in cases.items()]
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    for name, (plan, _) in cases.items():
        layout = json.loads(plans[plan].read_text())
        want = train_reference(layout, MODEL, SEED, STEPS, LR, DAMPING, EMA)[0]
        plain = train_reference(layout, MODEL, SEED, STEPS, LR, DAMPING, EMA, kfac=False)[0]
        got = [json.loads(line)["loss"] for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        print(f"{name}: largest relative loss error {max(abs(a - b) / b for a, b in zip(got, want)):.2e}")
        assert got == pytest.approx(want, rel=RTOL), name
        assert got != pytest.approx(plain, rel=100 * RTOL), name
