"""runtime/kfac.py: K-FAC numerics against dense computations, and PipeFisher plans under torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from schedc.runtime.kfac import damped_inverse, layer_input, precondition_layer, weight_grad

ROOT = Path(__file__).resolve().parent.parent
COSTS = {"unit": "ms", "F": 0.14, "B": 0.16, "curvature_A": 0.01, "curvature_B": 0.01, "inversion": 0.2,
         "precondition": 0.07}


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


def _compile(tmp: Path, name: str, **params) -> Path:
    costs = tmp / "costs.json"
    costs.write_text(json.dumps(COSTS))
    out = tmp / name
    args = [sys.executable, "-m", "schedc.cli", "compile", str(ROOT / "schedules" / f"{name}.sched"), "-o",
            str(out), "--costs", str(costs)] + [f"-D{k}={v}" for k, v in params.items()]
    subprocess.run(args, check=True, capture_output=True, text=True)
    return out / "plan.json"


def _run(plan: Path, tmp: Path, steps: int) -> tuple[list[float], dict]:
    metrics, dump = tmp / f"{plan.parent.name}.jsonl", tmp / plan.parent.name
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "benchmarks"),
           "PIPEFISHER_DUMP": str(dump)}
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
            str(29500 + os.getpid() % 3000), str(ROOT / "benchmarks" / "pipefisher_convergence.py"),
            "--worker", str(plan), "--model", "pipefisher_convergence:build_stages", "--layers", "2",
            "--hidden", "16", "--seq", "64", "--vocab", "17", "--mb-size", "16", "--steps", str(steps),
            "--optimizer", "sgd", "--lr", "0.1", "--tasks", "schedc.runtime.kfac", "--quiet",
            "--metrics-out", str(metrics), "--device", "cpu"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    params = {}
    for rank in (0, 1):
        params.update(torch.load(f"{dump}.rank{rank}.pt"))
    return losses, params


def test_replicated_chimera_plan_updates_like_the_single_pipeline_plan(tmp_path):
    """Chimera p=2 (factors and inverse shares exchanged between the two replicas at the end of the
    step) and 1F1B p=2 (everything local) run the same K-FAC: the same data per step, a cycle of 2
    steps with the refresh from the cycle's first step published at its end. Their updates agree."""
    chimera = _compile(tmp_path, "pipefisher", p=2, m=4)
    single = _compile(tmp_path, "pipefisher_1f1b", p=2, m=4, c=1, k=2)
    cycles = [len(json.loads(p.read_text())["ranks"][0]["steps"]) for p in (chimera, single)]
    assert cycles == [2, 2]
    losses_c, params_c = _run(chimera, tmp_path, 6)
    losses_s, params_s = _run(single, tmp_path, 6)
    assert losses_c == pytest.approx(losses_s, rel=1e-4)
    assert losses_c[-1] < losses_c[0]
    for name, value in params_s.items():
        assert torch.allclose(params_c[name], value, atol=1e-5), name
