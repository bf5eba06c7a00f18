"""PipeFisher vs a first-order baseline on scikit-learn's digits, both through schedc's runtime.

A small MLP (64 -> hidden -> ... -> 10) is split over a 2-device pipeline. PipeFisher: the plan of
schedc/schedules/pipefisher_1f1b.sched (K-FAC curvature, inversion and preconditioning in the bubbles) with
SGD on the preconditioned gradients. Baseline: the plain 1F1B plan with AdamW. Each gets the best
learning rate of a small grid (the same number of candidates), per seed and target. Over 3 seeds
(model initialisation and data order) and 3 target training losses (mean of the last 3 steps'
losses), it reports PipeFisher's steps / the baseline's to each target, their mean and range, wall
time per step with and without fills, and as its last line `steps_ratio X`, X the mean of the 9.

    python benchmarks/pipefisher_convergence.py [--quick]

The model and the data plug into the runtime as any user's do: `--model-code pipefisher_convergence:build_stages
--data pipefisher_convergence:digits` (this folder on PYTHONPATH).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = 1536  # training rows used (of 1797)
MEASURED_MS = {"unit": "ms", "F": 0.14, "B": 0.16, "curvature_A": 0.01, "curvature_B": 0.01, "inversion": 0.2,
               "precondition": 0.07}


# -- the model and the data, as the runtime wants them --------------------------------------------

class Pixels(nn.Module):
    """Stage 0's first piece: pixel values 0..16 (as the runtime's integer "tokens") -> hidden."""

    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(64, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x.float() / 16.0))


class Hidden(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class Classes(nn.Module):
    """Logits as [rows, 1, 10], so the runtime's token loss is the classification loss."""

    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).unsqueeze(1)


def build_stages(cfg) -> list[tuple[str, nn.Module]]:
    """The runtime's --model-code hook: an MLP of cfg.layers hidden layers of width cfg.hidden."""
    return [("pixels", Pixels(cfg.hidden)), *[(f"hidden.{i}", Hidden(cfg.hidden)) for i in range(cfg.layers)],
            ("classes", Classes(cfg.hidden))]


class Digits:
    """scikit-learn's digits as the runtime's data: batch(step, microbatches, size), rows drawn from
    (seed, step) like the runtime's own data, pixel values as the "tokens", the class as the target."""

    def __init__(self, seed: int):
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        self.x = torch.tensor(x[:SAMPLES], dtype=torch.long)
        self.y = torch.tensor(y[:SAMPLES], dtype=torch.long)
        self.seed = seed

    def batch(self, step: int, microbatches: int, size: int):
        from schedc.runtime.model.data import Batch
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        rows = torch.randint(0, len(self.x), (microbatches * size,), generator=gen)
        return Batch(self.x[rows], self.y[rows, None], size)


def digits(cfg, seed: int) -> Digits:
    """The runtime's --data hook."""
    return Digits(seed)


# -- the driver -----------------------------------------------------------------------------------

def compile_plan(schedule: str | Path, out: Path, extra: list[str] = (), **params) -> Path:
    args = [sys.executable, "-m", "schedc.cli", "compile", str(ROOT / "schedc" / "schedules" / schedule), "-o", str(out),
            *extra]
    for k, v in params.items():
        args += ["-D", f"{k}={v}"]
    subprocess.run(args, check=True, capture_output=True, text=True)
    return out / "plan.json"


SEEDS = (0, 1, 2)
TARGETS = (0.5, 0.3, 0.2)


def run(plan: Path, steps: int, extra: list[str]) -> list[dict]:
    """Run the plan on 2 ranks through schedc's runtime; return rank 0's per-step metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "benchmarks")}
        args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(29500 + os.getpid() % 2000), "-m", "schedc.runtime", str(plan),
                "--model-code", "pipefisher_convergence:build_stages", "--data", "pipefisher_convergence:digits",
                "--layers", "2", "--hidden", "32",
                "--seq", "64", "--vocab", "17", "--microbatch-size", "32", "--steps", str(steps), "--quiet",
                "--metrics-out", str(metrics), "--device", "cpu", *extra]
        done = subprocess.run(args, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        return [json.loads(line) for line in metrics.read_text().splitlines()]


def unfilled_source() -> str:
    """pipefisher_1f1b.sched (1F1B with the K-FAC add-on) without `fill bubbles with`, written out: the
    same K-FAC tasks, popped by each device's program after the step's F and B, so no task runs in a
    bubble. A device runs stage d: m curvature_A and m curvature_B pieces, the inversion's 2 pieces
    and its one precondition."""
    base = (ROOT / "schedc" / "schedules" / "1f1b.sched").read_text()
    kfac = (ROOT / "schedc" / "schedules" / "addons" / "kfac.sched").read_text()
    tasks = [line for line in kfac.splitlines() if not line.startswith(("addon ", "fill bubbles with"))]
    text = base + "\n".join(tasks) + "\n"
    old = "  B * w\n}"
    if text.count(old) != 1:
        raise RuntimeError(f"1f1b.sched changed: cannot find {old!r}")
    return text.replace(old, "  B * w\n  curvature_A * m ; curvature_B * m ; inversion * 2 ; precondition\n}")


def steps_to(losses: list[float], target: float, window: int = 3) -> int | None:
    for n in range(window, len(losses) + 1):
        if sum(losses[n - window:n]) / window <= target:
            return n
    return None


def curves(plan: Path, steps: int, grid: list[float], optimizer: list[str], seed: int, label: str):
    """lr -> (losses, median seconds per step) for one seed."""
    out = {}
    for lr in grid:
        metrics = run(plan, steps, [*optimizer, "--lr", str(lr), "--seed", str(seed)])
        losses = [m["loss"] for m in metrics]
        out[lr] = (losses, sorted(m["seconds"] for m in metrics[1:])[len(metrics[1:]) // 2])
        print(f"{label:<10} seed {seed} lr {lr:<6g} final loss {losses[-1]:.4f}  "
              f"steps to {', '.join(f'{t}: {steps_to(losses, t)}' for t in TARGETS)}  "
              f"median step {out[lr][1] * 1e3:.1f} ms", flush=True)
    return out


def fastest(runs: dict, target: float, steps: int) -> tuple[int, float, bool]:
    """(steps to target, lr, reached) of the best lr; a run that never reaches it counts `steps`."""
    found = [(steps_to(losses, target), lr) for lr, (losses, _) in runs.items()]
    reached = [(n, lr) for n, lr in found if n is not None]
    return (*min(reached), True) if reached else (steps, min(runs), False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and a smaller grid")
    args = parser.parse_args()
    steps = 60 if args.quick else 150
    adam_grid = [3e-3, 1e-2, 3e-2] if args.quick else [1e-3, 3e-3, 1e-2, 3e-2]
    kfac_grid = [0.03, 0.05, 0.1] if args.quick else [0.02, 0.03, 0.05, 0.1]
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        # the K-FAC plan is compiled with costs the runtime measured for this model on CPU
        # (`--profile-out`, rounded; fixed so that the plan, and its cycle, are reproducible)
        costs = Path(tmp) / "costs.json"
        costs.write_text(json.dumps(MEASURED_MS))
        kfac_plan = compile_plan("pipefisher_1f1b.sched", Path(tmp) / "kfac", ["--costs", str(costs)], p=2, m=4)
        base_plan = compile_plan("1f1b.sched", Path(tmp) / "base", p=2, m=4)
        # the same K-FAC work without fills: the tasks run where the programs put them, after the step's compute
        unfilled_sched = Path(tmp) / "pipefisher_1f1b_unfilled.sched"
        unfilled_sched.write_text(unfilled_source())
        unfilled_plan = compile_plan(unfilled_sched, Path(tmp) / "unfilled", ["--costs", str(costs)], p=2, m=4)
        cycle = len(json.loads(kfac_plan.read_text())["ranks"][0]["steps"])
        print(f"PipeFisher plan: 1F1B p=2 m=4, K-FAC cycle of {cycle} steps; {steps} steps per run")
        ratios, times = [], {"filled": [], "first-order": []}
        for seed in SEEDS:
            base = curves(base_plan, steps, adam_grid, ["--optimizer", "adamw"], seed, "adamw")
            kfac = curves(kfac_plan, steps, kfac_grid, ["--optimizer", "sgd", "--tasks", "schedc.runtime.kfac"],
                          seed, "pipefisher")
            times["first-order"] += [t for _, t in base.values()]
            times["filled"] += [t for _, t in kfac.values()]
            for target in TARGETS:
                (b, b_lr, b_ok), (k, k_lr, k_ok) = fastest(base, target, steps), fastest(kfac, target, steps)
                ratios.append(k / b)
                print(f"seed {seed} target {target}: PipeFisher {k}{'' if k_ok else '+'} steps (lr {k_lr:g}), "
                      f"AdamW {b}{'' if b_ok else '+'} (lr {b_lr:g}): ratio {k / b:.3f}", flush=True)
        kfac_lr = fastest(kfac, TARGETS[1], steps)[1]
        unfilled = curves(unfilled_plan, steps, [kfac_lr], ["--optimizer", "sgd", "--tasks", "schedc.runtime.kfac"],
                          SEEDS[-1], "unfilled")
    median = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
    print(f"wall per step (median over runs): filled {median['filled']:.1f} ms, unfilled "
          f"{next(iter(unfilled.values()))[1] * 1e3:.1f} ms, first-order {median['first-order']:.1f} ms")
    mean = sum(ratios) / len(ratios)
    print(f"steps_ratio over {len(SEEDS)} seeds x {len(TARGETS)} targets: mean {mean:.3f}, range "
          f"{min(ratios):.3f}-{max(ratios):.3f} ('+': target not reached in {steps} steps, counted as {steps})")
    print(f"total {time.time() - started:.0f} s")
    print(f"steps_ratio {mean:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
