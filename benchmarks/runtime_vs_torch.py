# Benchmark: schedc's runtime against torch.distributed.pipelining on the same model, schedule and
# ranks (gloo, CPU, 2 ranks, OMP_NUM_THREADS=1). For GPipe, 1F1B and interleaved 1F1B it compiles the
# library schedule, runs it with `schedc.runtime` and runs ScheduleGPipe / Schedule1F1B /
# ScheduleInterleaved1F1B over the same GPT stages, compares the median step time after warm-up, and
# prints the measured makespan and bubble next to the plan's simulated ones.
# The last line is `ratio X`: the geometric mean over schedules of schedc time / torch time.
#
#   python benchmarks/runtime_vs_torch.py --quick      # under 4 minutes on 2 CPU cores
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RANKS = 2
# name: (library schedule, torch class, chunks per rank)
SCHEDULES = {"gpipe": ("gpipe", "ScheduleGPipe", 1),
             "1f1b": ("1f1b", "Schedule1F1B", 1),
             "interleaved": ("interleaved_1f1b", "ScheduleInterleaved1F1B", 2)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps (under 4 minutes)")
    parser.add_argument("--steps", type=int, help="steps per run (default 30, quick 10)")
    parser.add_argument("--rounds", type=int, help="alternating schedc/torch runs per schedule "
                                                   "(default 3, quick 2)")
    parser.add_argument("--warmup", type=int, help="steps left out of the median (default 5, quick 3)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--mb-size", type=int, default=4)
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated subset")
    parser.add_argument("--torch-worker", metavar="SCHEDULE", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 10 if args.quick else 30
    if args.warmup is None:
        args.warmup = 3 if args.quick else 5
    if args.rounds is None:
        args.rounds = 2 if args.quick else 3
    return args


def model_flags(args: argparse.Namespace) -> list[str]:
    return ["--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
            "--seq", str(args.seq), "--mb-size", str(args.mb_size), "--steps", str(args.steps)]


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def compile_plan(name: str, args: argparse.Namespace, out: Path) -> Path:
    schedule, _, chunks = SCHEDULES[name]
    defines = ["-D", f"p={RANKS}", "-D", f"m={args.microbatches}"] + (["-D", f"v={chunks}"] if chunks > 1 else [])
    subprocess.run([sys.executable, "-m", "schedc.cli", "compile", str(REPO / "schedules" / f"{schedule}.sched"),
                    *defines, "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    return out / "plan.json"


def torchrun(args: list[str]) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS), *args]
    run = subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=REPO)
    if run.returncode:
        sys.exit(f"benchmark run failed:\n{' '.join(command)}\n{run.stderr[-3000:]}")


def run_schedc(plan: Path, args: argparse.Namespace, work: Path) -> tuple[list[float], dict]:
    """Step times after warm-up, and the measured-vs-simulated report."""
    metrics, report = work / "schedc.jsonl", work / "report.json"
    torchrun(["-m", "schedc.runtime", str(plan), *model_flags(args), "--quiet", "--warmup", str(args.warmup),
              "--metrics-out", str(metrics), "--report-out", str(report)])
    seconds = [json.loads(line)["seconds"] for line in metrics.read_text().splitlines()]
    return seconds[args.warmup:], json.loads(report.read_text())


def run_torch(name: str, args: argparse.Namespace, work: Path) -> list[float]:
    out = work / "torch.json"
    torchrun([str(Path(__file__).resolve()), "--torch-worker", name, "--out", str(out),
              *model_flags(args), "--microbatches", str(args.microbatches)])
    return json.loads(out.read_text())[args.warmup:]


def measure(name: str, args: argparse.Namespace, work: Path) -> tuple[float, float, dict]:
    """Median step time of schedc and of torch over alternating runs (the machine's load drifts)."""
    plan = compile_plan(name, args, work / f"plan-{name}")
    ours, theirs, report = [], [], {}
    for _ in range(args.rounds):
        times, report = run_schedc(plan, args, work)
        ours += times
        theirs += run_torch(name, args, work)
    return statistics.median(ours), statistics.median(theirs), report


def torch_worker(args: argparse.Namespace) -> None:
    """One rank of the torch.distributed.pipelining run over the same GPT stages as schedc's runtime."""
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining

    from schedc.runtime.data import Dataset
    from schedc.runtime.model import ModelConfig, Stage, build_gpt, build_pieces, lm_loss, partition

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    _, cls_name, chunks = SCHEDULES[args.torch_worker]
    cfg = ModelConfig(args.layers, args.hidden, args.heads, args.seq, 256, args.mb_size)
    count = RANKS * chunks
    runs = partition(build_pieces(build_gpt, cfg, seed=0), count)
    held = [rank + k * RANKS for k in range(chunks)]
    stages = [pipelining.PipelineStage(Stage(runs[s]), s, count, torch.device("cpu")) for s in held]
    schedule_cls = getattr(pipelining, cls_name)
    schedule = schedule_cls(stages if chunks > 1 else stages[0], n_microbatches=args.microbatches,
                            loss_fn=lm_loss)
    params = [p for stage in stages for p in stage.submod.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    dataset = Dataset(args.seq, 256, 0, synthetic=False)
    times = []
    for step in range(args.steps):
        batch = dataset.batch(step, args.microbatches, args.mb_size)
        begin = time.perf_counter()
        losses: list = []
        inputs = (batch.tokens,) if 0 in held else ()
        target = batch.targets if count - 1 in held else None
        schedule.step(*inputs, target=target, losses=losses)
        optimizer.step()
        optimizer.zero_grad()
        loss = torch.stack(losses).sum() if losses else torch.zeros(())
        dist.all_reduce(loss)
        times.append(time.perf_counter() - begin)
    if rank == 0:
        Path(args.out).write_text(json.dumps(times))
    dist.destroy_process_group()


def compare(args: argparse.Namespace) -> None:
    names = [n for n in args.schedules.split(",") if n]
    ratios = []
    print(f"{RANKS} ranks, gloo CPU, {args.microbatches} microbatches, GPT layers={args.layers} hidden={args.hidden} "
          f"seq={args.seq} mb={args.mb_size}; median of {args.rounds} x {args.steps - args.warmup} steps "
          f"after {args.warmup} warm-up steps per run")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            ours, theirs, report = measure(name, args, Path(tmp))
            ratios.append(ours / theirs)
            print(line(name, ours, theirs, report), flush=True)
    print(f"ratio {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


def line(name: str, ours: float, theirs: float, report: dict) -> str:
    sim = report.get("simulated", {})
    simulated = f"{sim['makespan_ms']:.1f}" if sim.get("makespan_ms") is not None else "-"
    return (f"{name:12s} schedc {ours * 1e3:7.1f} ms  torch {theirs * 1e3:7.1f} ms  ratio {ours / theirs:5.3f}  |  "
            f"makespan measured {report.get('makespan_ms', 0):.1f} ms, simulated {simulated} ms; "
            f"bubble measured {report.get('bubble')}, simulated {sim.get('bubble')}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.torch_worker:
        torch_worker(args)
    else:
        begin = time.monotonic()
        compare(args)
        print(f"# {time.monotonic() - begin:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
