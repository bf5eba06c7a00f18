# Benchmark: schedc's runtime against torch.distributed.pipelining on the same model, schedule and
# ranks (gloo, CPU, 2 ranks, OMP_NUM_THREADS=1). For GPipe, 1F1B, interleaved 1F1B, ZB-V, interleaved
# zero bubble and DualPipeV it compiles the library schedule with `schedc compile`, then, in one torchrun
# launch per schedule, builds schedc's executor for that plan and torch's class of the same name
# (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleZBVZeroBubble,
# ScheduleInterleavedZeroBubble, ScheduleDualPipeV) over separate
# copies of the same GPT stages, and times the two on alternating steps (ABBA order), so that both see
# the same machine load. Each step is the schedule, the optimizer step and a loss all-reduce. It prints
# the median step times, the median of the per-step ratios schedc / torch (adjacent steps, so load drift
# cancels) with their quartiles (the spread), and schedc's measured makespan and bubble next to the
# plan's simulated ones.
# The last line is `ratio X`: the geometric mean over schedules of those ratios.
#
#   python benchmarks/runtime_vs_torch.py --quick      # about 4 minutes on 2 CPU cores
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
# name: (library schedule, torch class, chunks per rank, V-shaped: rank r holds stages r and 2p-1-r)
SCHEDULES = {"gpipe": ("gpipe", "ScheduleGPipe", 1, False),
             "1f1b": ("1f1b", "Schedule1F1B", 1, False),
             "interleaved": ("interleaved_1f1b", "ScheduleInterleaved1F1B", 2, False),
             "zbv": ("zbv", "ScheduleZBVZeroBubble", 2, True),
             "interleaved_zb": ("interleaved_zb", "ScheduleInterleavedZeroBubble", 2, False),
             "dualpipev": ("dualpipev", "ScheduleDualPipeV", 2, True)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="schedc runtime vs torch.distributed.pipelining")
    parser.add_argument("--quick", action="store_true", help="fewer steps (under 4 minutes)")
    parser.add_argument("--steps", type=int, help="steps of each runtime per schedule (default 60, quick 25)")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the median (default 5)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--microbatch-size", "--mb-size", dest="mb_size", type=int, default=4)
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated subset")
    parser.add_argument("--worker", metavar="SCHEDULE", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 25 if args.quick else 60
    return args


def model_flags(args: argparse.Namespace) -> list[str]:
    return ["--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
            "--seq", str(args.seq), "--microbatch-size", str(args.mb_size)]


# -- the driver ------------------------------------------------------------------------------------

def compile_plan(name: str, args: argparse.Namespace, out: Path) -> Path:
    schedule, _, chunks, v_shape = SCHEDULES[name]
    defines = ["-D", f"p={RANKS}", "-D", f"m={args.microbatches}"] + (
        ["-D", f"v={chunks}"] if chunks > 1 and not v_shape else [])
    subprocess.run([sys.executable, "-m", "schedc.cli", "compile", str(REPO / "schedc" / "schedules" / f"{schedule}.sched"),
                    *defines, "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    return out / "plan.json"


def measure(name: str, args: argparse.Namespace, work: Path) -> dict:
    """One torchrun launch: both runtimes on alternating steps; rank 0's times and schedc's report."""
    plan, out = compile_plan(name, args, work / f"plan-{name}"), work / f"{name}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS),
               str(Path(__file__).resolve()), "--worker", name, "--plan", str(plan), "--out", str(out),
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--microbatches", str(args.microbatches), *model_flags(args)]
    run = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         cwd=REPO)
    if run.returncode:
        sys.exit(f"benchmark run failed:\n{' '.join(command)}\n{run.stderr[-3000:]}")
    return json.loads(out.read_text())


def compare(args: argparse.Namespace) -> None:
    names = [n for n in args.schedules.split(",") if n]
    ratios = []
    print(f"{RANKS} ranks, gloo CPU, {args.microbatches} microbatches, GPT layers={args.layers} hidden={args.hidden} "
          f"seq={args.seq} mb={args.mb_size}; median of {args.steps - args.warmup} alternating steps each "
          f"after {args.warmup} warm-up steps")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            result = measure(name, args, Path(tmp))
            ours, theirs = result["schedc"][args.warmup:], result["torch"][args.warmup:]
            per_step = [a / b for a, b in zip(ours, theirs)]  # paired by step
            ratios.append(statistics.median(per_step))
            print(line(name, statistics.median(ours), statistics.median(theirs), per_step, result["report"]),
                  flush=True)
    print(f"ratio {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


def line(name: str, ours: float, theirs: float, per_step: list[float], report: dict) -> str:
    sim = report.get("simulated", {})
    simulated = f"{sim['makespan_ms']:.1f}" if sim.get("makespan_ms") is not None else "-"
    low, _, high = statistics.quantiles(per_step, n=4) if len(per_step) > 1 else per_step * 3
    return (f"{name:14s} schedc {ours * 1e3:7.1f} ms  torch {theirs * 1e3:7.1f} ms  ratio "
            f"{statistics.median(per_step):5.3f} (quartiles {low:.3f}-{high:.3f})  |  "
            f"makespan measured {report.get('makespan_ms', 0):.1f} ms, simulated {simulated} ms; "
            f"bubble measured {report.get('bubble')}, simulated {sim.get('bubble')}")


# -- one rank ----------------------------------------------------------------------------------------

def build_schedc(args: argparse.Namespace):
    """schedc's executor for the plan, as `python -m schedc.runtime` builds it (this starts the world)."""
    from schedc.plan import load_plan
    from schedc.runtime.model import train
    from schedc.runtime.model.train import model_runs
    from schedc.runtime.model.gpt import boundary_shapes
    from schedc.runtime.process.options import parse_options
    from schedc.runtime.process.world import Env, pick_device, start

    opts = parse_options([args.plan, *model_flags(args), "--steps", str(args.steps), "--warmup", str(args.warmup)])
    plan, env = load_plan(opts.plan), Env.read()
    train.check_plan(plan, opts, env)
    pieces, runs = model_runs(opts, plan.meta["stages"])
    shapes = boundary_shapes(pieces, runs, opts.model_config)
    world = start(plan, opts.dp, env, pick_device("cpu", env), opts.timeout)
    return plan, opts, world, train.build_executor(plan, opts, world, runs, shapes)


def build_torch(args: argparse.Namespace, rank: int, opts):
    """torch.distributed.pipelining's schedule over a separate copy of the same GPT stages."""
    import torch
    from torch.distributed import pipelining

    from schedc.runtime.model.train import make_optimizer
    from schedc.runtime.model.gpt import ModelConfig, Stage, build_gpt, build_pieces, lm_loss, partition

    _, cls_name, chunks, v_shape = SCHEDULES[args.worker]
    cfg = ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=256,
                      mb_size=args.mb_size)
    count = RANKS * chunks
    runs = partition(build_pieces(build_gpt, cfg, seed=0), count)
    held = [rank, count - 1 - rank] if v_shape else [rank + k * RANKS for k in range(chunks)]
    stages = [pipelining.PipelineStage(Stage(runs[s]), s, count, torch.device("cpu")) for s in held]
    schedule = getattr(pipelining, cls_name)(stages if chunks > 1 else stages[0],
                                             n_microbatches=args.microbatches, loss_fn=lm_loss)
    optimizer = make_optimizer([p for stage in stages for p in stage.submod.parameters()], opts)  # as schedc's
    return schedule, optimizer, 0 in held, count - 1 in held


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from schedc.runtime.model import train
    from schedc.runtime.model.data import Dataset

    plan, opts, world, executor = build_schedc(args)
    schedule, optimizer, first, last = build_torch(args, world.rank, opts)
    dataset = Dataset(args.seq, 256, 0, synthetic=False)

    def schedc_step(step: int, batch) -> None:
        executor.run_step(step, batch)
        loss = executor.take_loss()
        dist.all_reduce(loss)

    def torch_step(step: int, batch) -> None:
        losses: list = []
        schedule.step(*((batch.tokens,) if first else ()), target=batch.targets if last else None, losses=losses)
        optimizer.step()
        optimizer.zero_grad()
        loss = torch.stack(losses).sum() if losses else torch.zeros(())
        dist.all_reduce(loss)

    times: dict[str, list[float]] = {"schedc": [], "torch": []}
    dist.barrier()
    origin = time.perf_counter_ns()
    for step in range(args.steps):
        batch = dataset.batch(step, args.microbatches, args.mb_size)
        order = [("schedc", schedc_step), ("torch", torch_step)]
        for name, run in order if step % 2 == 0 else order[::-1]:
            dist.barrier()
            begin = time.perf_counter()
            run(step, batch)
            times[name].append(time.perf_counter() - begin)
    opts.report_out = f"{args.out}.report"
    opts.quiet = True
    train._finish(plan, opts, world, executor, origin, 0)
    if world.rank == 0:
        report = json.loads(Path(opts.report_out).read_text())
        Path(args.out).write_text(json.dumps({**times, "report": report}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
    else:
        begin = time.monotonic()
        compare(args)
        print(f"# {time.monotonic() - begin:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
