"""Predicted against measured step time of a 2-rank CPU run (gloo, one thread per rank) of the runtime's GPT.

1. `schedc calibrate` measures the machine (GEMM rate by size, memory-bound kernel bandwidth, gloo
   messages between two local processes) and writes a cluster description of it.
2. One calibration launch runs 1F1B and ZB-H1 at two calibration sizes (CALIBRATION: neither is a
   size predicted) with --profile-out: measured F, B, I and W per stage.
3. One `schedc calibrate --cluster ... --costs ... --model ...` over those four profiles fits the
   compute rates (one factor: the run's kernels against the microbenchmarks') and each op's overhead
   per layer (the CPU's op dispatch and autograd); communication stays as measured in step 1.
4. The cost model predicts the step of every cell (1F1B and ZB-H1 at the two SIZES) from that one
   fitted cluster, and --launches launches each run every cell (in a rotated order) and measure it.

    python benchmarks/calibration_cpu.py --quick     # 3 launches, 4 measured steps: under 3 minutes on 2 cores
    python benchmarks/calibration_cpu.py             # 5 launches, 8 measured steps, m = 8

Each cell prints the prediction, the measured median with its spread (min-max over the launches)
and the error of the prediction against the median; the microbenchmarks' own prediction (step 1
alone) and the load average during the run are printed too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LAUNCH_PLANS = ROOT / "tests" / "launch_plans.py"  # several plans in one launch, one after the other
SIZES = {"small": {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "vocab": 256},
         "large": {"layers": 4, "hidden": 256, "heads": 8, "seq": 128, "vocab": 256}}
CALIBRATION = {"tiny": {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "vocab": 256},
               "mid": {"layers": 4, "hidden": 192, "heads": 6, "seq": 96, "vocab": 256}}
SCHEDULES = ("1f1b", "zb_h1")
MICROBATCH = 4
RANKS = 2


def run(command: list[str]) -> subprocess.CompletedProcess:
    """Run a command with one OpenMP thread; its output, or its error output and exit on a failure."""
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        sys.exit(f"{' '.join(command)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done


def schedc(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("schedc")
    return run([str(exe) if exe.exists() else "schedc", *args])


def model_file(out: Path, name: str, sizes: dict[str, int]) -> Path:
    path = out / f"gpt-{name}.toml"
    path.write_text(f"# the runtime's GPT at the {name} size (fp32 on CPU)\n"
                    + "".join(f"{k} = {v}\n" for k, v in sizes.items()) + 'dtype = "fp32"\n')
    return path


def compile_cell(schedule: str, m: int, model: Path, cluster: Path, out: Path) -> float:
    """Compile the schedule for 2 ranks on the cluster; its predicted step (ms)."""
    schedc("compile", schedule, "-D", f"p={RANKS}", "-D", f"m={m}", "--model", str(model), "--cluster", str(cluster),
           "--microbatch-size", str(MICROBATCH), "--recompute", "none", "-o", str(out))
    return 1000 * json.loads((out / "plan.json").read_text())["stats"]["iteration_s"]


def job(plan_dir: Path, sizes: dict[str, int], steps: int, tag: str) -> list:
    """One [plan, runtime options] entry of a launch: the report (and profile) under plan_dir, named by tag."""
    options = [f"--{k}={v}" for k, v in sizes.items()] + [
        f"--microbatch-size={MICROBATCH}", "--steps", str(steps + 2), "--warmup", "2", "--threads", "1", "--synthetic",
        "--quiet", "--report-out", str(plan_dir / f"report-{tag}.json"),
        "--profile-out", str(plan_dir / f"profile-{tag}.json")]
    return [str(plan_dir / "plan.json"), options]


def launch(jobs: list, path: Path) -> None:
    """Run the jobs in one 2-rank gloo launch."""
    path.write_text(json.dumps(jobs))
    run([sys.executable, "-m", "schedc.runtime.process.launch", "--standalone", "--nproc-per-node", str(RANKS),
         str(LAUNCH_PLANS), str(path)])


def compare(predicted: dict[str, float], measured: dict[str, list[float]]) -> list[dict]:
    """Per cell: the prediction, the measured median, min and max, and the prediction's error
    against the median (predicted / median - 1)."""
    rows = []
    for cell, prediction in predicted.items():
        runs = measured[cell]
        median = statistics.median(runs)
        rows.append({"cell": cell, "predicted_ms": prediction, "median_ms": median, "min_ms": min(runs),
                     "max_ms": max(runs), "launches": len(runs), "error": prediction / median - 1})
    return rows


def table(rows: list[dict], micro: dict[str, float] | None = None) -> str:
    """The rows as a Markdown table (with the microbenchmarks' own prediction when given)."""
    extra = " microbenchmarks alone |" if micro else ""
    lines = ["| cell | predicted | measured median | spread (min-max) | launches | error |" + extra,
             "|---|---|---|---|---|---|" + ("---|" if micro else "")]
    for r in rows:
        alone = f" {micro[r['cell']]:,.1f} ms |" if micro else ""
        lines.append(f"| {r['cell']} | {r['predicted_ms']:,.1f} ms | {r['median_ms']:,.1f} ms | "
                     f"{r['min_ms']:,.1f}-{r['max_ms']:,.1f} ms | {r['launches']} | {100 * r['error']:+.1f} % |" + alone)
    worst = max(abs(r["error"]) for r in rows)
    lines.append(f"largest error {100 * worst:.1f} % over {len(rows)} cells")
    return "\n".join(lines)


def calibrate(out: Path, quick: bool, m: int, steps: int) -> Path:
    """Steps 1 to 3: the microbenchmarks, the calibration launch, the one fit; the fitted cluster."""
    measured_cluster, fitted = out / "cpu.toml", out / "cpu-fitted.toml"
    print(schedc("calibrate", "-o", str(measured_cluster), "--ranks", str(RANKS), "--threads", "1",
                 *(["--quick"] if quick else [])).stdout.strip(), flush=True)
    jobs, fit_args = [], []
    for name, sizes in CALIBRATION.items():
        model = model_file(out, name, sizes)
        for schedule in SCHEDULES:
            plan_dir = out / f"calibration-{schedule}-{name}"
            compile_cell(schedule, m, model, measured_cluster, plan_dir)
            jobs.append(job(plan_dir, sizes, steps, f"{schedule}-{name}"))
            fit_args += ["--costs", str(plan_dir / f"profile-{schedule}-{name}.json"), "--model", str(model)]
    launch(jobs, out / "calibration-jobs.json")
    print(schedc("calibrate", "-o", str(fitted), "--cluster", str(measured_cluster), *fit_args).stdout.strip(),
          flush=True)
    return fitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out/calibration", help="working directory (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="3 launches of 4 measured steps at m = 4, calibrate --quick")
    parser.add_argument("--launches", type=int, default=None, help="launches per cell (default 5; 3 with --quick)")
    args = parser.parse_args()
    launches = args.launches or (3 if args.quick else 5)
    steps, m = (4, 4) if args.quick else (8, 8)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    fitted = calibrate(out, args.quick, m, steps)
    cells = [(schedule, size) for schedule in SCHEDULES for size in SIZES]
    predicted, micro = {}, {}
    for schedule, size in cells:
        cell, model = f"{schedule} {size}", model_file(out, size, SIZES[size])
        predicted[cell] = compile_cell(schedule, m, model, fitted, out / f"{schedule}-{size}")
        micro[cell] = compile_cell(schedule, m, model, out / "cpu.toml", out / f"micro-{schedule}-{size}")
    measured: dict[str, list[float]] = {f"{s} {z}": [] for s, z in cells}
    for n in range(launches):
        order = cells[n % len(cells):] + cells[:n % len(cells)]
        launch([job(out / f"{s}-{z}", SIZES[z], steps, str(n)) for s, z in order], out / f"jobs-{n}.json")
        for s, z in cells:
            measured[f"{s} {z}"].append(json.loads((out / f"{s}-{z}" / f"report-{n}.json").read_text())["makespan_ms"])
        print(f"launch {n + 1} of {launches}: " + ", ".join(f"{c} {v[-1]:,.1f} ms" for c, v in measured.items()),
              flush=True)
    load_after = os.getloadavg()
    print(f"p={RANKS}, m={m}, b={MICROBATCH}, {steps} measured steps per launch, gloo, 1 thread per rank; "
          f"sizes {SIZES}")
    print(table(compare(predicted, measured), micro))
    print("load average (1, 5, 15 min) before " + " ".join(f"{x:.2f}" for x in load_before)
          + ", after " + " ".join(f"{x:.2f}" for x in load_after))


if __name__ == "__main__":
    main()
