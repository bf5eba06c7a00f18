"""The measured calibration path on this CPU machine.

1. `schedc calibrate` measures the machine (GEMM rate by size, memory-bound kernel bandwidth, gloo
   messages between two local processes) and writes a cluster description of it.
2. The runtime runs a 1F1B plan of its GPT on 2 ranks (gloo) with --profile-out: measured F and B per
   stage, and the measured step.
3. `schedc calibrate --cluster ... --costs profile.json --model ...` scales the description's compute
   rates so that the cost model's F + B of that run match the profile (communication stays measured).
4. The cost model predicts the 2-rank step (the run it was fitted to) and the 4-rank step (2 layers per
   stage instead of 4: not fitted), and the runtime runs the 4-rank plan and measures it.

    python benchmarks/calibration_cpu.py            # one line per p and run: predicted vs measured

The microbenchmarks' own prediction (step 1 alone) is printed too.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZES = {"layers": 8, "hidden": 256, "heads": 8, "seq": 128, "vocab": 256}
MICROBATCH, MICROBATCHES = 8, 8


def schedc(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("schedc")
    command = [str(exe) if exe.exists() else "schedc", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def plan(p: int, model: Path, cluster: str, out: Path) -> dict:
    """Compile 1F1B for p ranks on the cluster; the plan's stats (the prediction)."""
    schedc("compile", "1f1b", "-D", f"p={p}", "-D", f"m={MICROBATCHES}", "--model", str(model), "--cluster", cluster,
           "--microbatch-size", str(MICROBATCH), "--recompute", "none", "-o", str(out))
    return json.loads((out / "plan.json").read_text())["stats"]


def measure(plan_dir: Path, p: int, steps: int, run: int) -> tuple[float, Path]:
    """Run the plan on p gloo ranks; the measured step (ms, mean over the measured steps) and the profile."""
    sizes = [f"--{k}={v}" for k, v in SIZES.items()] + [f"--mb-size={MICROBATCH}"]
    report, profile = plan_dir / f"report-{run}.json", plan_dir / f"profile-{run}.json"
    schedc("run", str(plan_dir / "plan.json"), "--nproc", str(p), "--steps", str(steps), "--warmup", "2",
           "--threads", "1", "--synthetic", "--quiet", "--report-out", str(report), "--profile-out", str(profile),
           *sizes)
    return json.loads(report.read_text())["makespan_ms"], profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out/calibration", help="working directory (default %(default)s)")
    parser.add_argument("--steps", type=int, default=8, help="runtime steps per run (2 warm-up steps left out)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each p")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measured_cluster, fitted_cluster = str(out / "cpu.toml"), str(out / "cpu-fitted.toml")
    print(schedc("calibrate", "-o", measured_cluster, "--ranks", "2", "--threads", "1").stdout.strip())
    model = out / "gpt-cpu.toml"
    model.write_text("# the runtime's GPT at the sizes run here (fp32 on CPU)\n"
                     + "".join(f"{k} = {v}\n" for k, v in SIZES.items()) + 'dtype = "fp32"\n')
    micro = {p: plan(p, model, measured_cluster, out / f"micro-p{p}") for p in (2, 4)}
    measured = {}
    for run in range(args.runs):
        step, profile = measure(out / "micro-p2", 2, args.steps, run)
        measured.setdefault(2, []).append(step)
        if run == 0:
            print(schedc("calibrate", "-o", fitted_cluster, "--cluster", measured_cluster, "--costs", str(profile),
                         "--model", str(model), "--microbatch-size", str(MICROBATCH)).stdout.strip())
        measured.setdefault(4, []).append(measure(out / "micro-p4", 4, args.steps, run)[0])
    fitted = {p: plan(p, model, fitted_cluster, out / f"fitted-p{p}") for p in (2, 4)}
    for p in (2, 4):
        for run, step in enumerate(measured[p]):
            predicted = 1000 * fitted[p]["iteration_s"]
            print(f"1f1b p={p} m={MICROBATCHES} b={MICROBATCH} run {run}: measured {step:.1f} ms; predicted "
                  f"{predicted:.1f} ms with the fitted cluster ({'fitted to this run' if p == 2 and run == 0 else 'not fitted'}), "
                  f"measured/predicted {step / predicted:.3f}; microbenchmarks alone {1000 * micro[p]['iteration_s']:.1f} ms "
                  f"({step / (1000 * micro[p]['iteration_s']):.2f}x)", flush=True)


if __name__ == "__main__":
    main()
