"""Megatron-LM's Table 1 (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM"): predicted teraFLOP/s per GPU against the measured ones, all ten rows, one
set of cluster constants (schedc/clusters/dgx-a100-80gb.toml).

t, p, GPUs, batch and the measured figure come from the paper's table; the microbatch size, the
interleaving (--num-layers-per-virtual-pipeline-stage) and the data-parallel implementation (torch DDP,
which overlaps the gradient all-reduce with the backward, or Megatron's local DDP, which does not) from
Megatron-LM's examples/academic_paper_scripts/sc21/run_table_1.sh. All rows recompute activations
(--activations-checkpoint-method uniform). The schedule is the library's 1f1b, or interleaved_1f1b with
v = layers / (p x layers per virtual stage).

    python benchmarks/megatron_table1.py            # one line per row, then mean_abs_error X max_abs_error Y
    python benchmarks/megatron_table1.py --speed 5  # also: `schedc simulate` of the 1T row, whole process, 5 runs

--speed byte-compiles the package once before timing (compile_vs_torch.byte_compile), as an install
has its bytecode: with PYTHONDONTWRITEBYTECODE set, a module changed since its .pyc was written would
otherwise be compiled from source in every timed process.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE))  # the benchmarks' own modules (compile_vs_torch.byte_compile)

from schedc.costmodel.specs import load_cluster, load_model_spec  # noqa: E402
from schedc.layout import Layout  # noqa: E402
from schedc.costmodel import Setting  # noqa: E402
from schedc.driver.cluster import compile_for  # noqa: E402

# model file, t, p, GPUs, global batch, microbatch size, layers per virtual stage (0: none), DDP, TF/s
ROWS = [
    ("gpt-1.7b", 1, 1, 32, 512, 16, 0, "torch", 137),
    ("gpt-3.6b", 2, 1, 64, 512, 16, 0, "torch", 138),
    ("gpt-7.5b", 4, 1, 128, 512, 16, 0, "torch", 142),
    ("gpt-18.4b", 8, 1, 256, 1024, 8, 0, "torch", 135),
    ("gpt-39.1b", 8, 2, 512, 1536, 4, 0, "local", 138),
    ("gpt-76.1b", 8, 4, 1024, 1792, 2, 5, "local", 140),
    ("gpt-145.6b", 8, 8, 1536, 2304, 2, 5, "local", 148),
    ("gpt-310.1b", 8, 16, 1920, 2160, 1, 3, "local", 155),
    ("gpt-529.6b", 8, 35, 2520, 2520, 1, 1, "local", 163),
    ("gpt-1008b", 8, 64, 3072, 3072, 1, 0, "local", 163),
]
CLUSTER = "dgx-a100-80gb"
BLOCKING = True  # Megatron-LM's point-to-point calls wait for both ends of every message


def row_args(name, t, p, gpus, batch, b, per_virtual, ddp):
    """The schedule, its -D params and the layout of one row."""
    model = load_model_spec(str(HERE.parent / "schedc" / "models" / f"{name}.toml"))
    v = model.layers // (p * per_virtual) if per_virtual else 1
    schedule, params = ("interleaved_1f1b", {"p": str(p), "v": str(v)}) if v > 1 else ("1f1b", {"p": str(p)})
    layout = Layout(tp=t, dp=gpus // (t * p), microbatch_size=b, global_batch=batch,
                    overlap_grad_reduce=ddp == "torch", blocking_p2p=BLOCKING)
    return model, schedule, params, layout, v


def table(cluster_name: str = CLUSTER) -> list[float]:
    cluster = load_cluster(cluster_name)
    errors = []
    print(f"{'model':<11} {'t':>2} {'p':>3} {'d':>3} {'b':>3} {'v':>2} {'m':>4}  {'predicted':>9} {'measured':>8} "
          f"{'error':>7}  {'memory GiB':>10}  {'iteration s':>11}  bubble  tp-comm  dp-comm")
    for name, t, p, gpus, batch, b, per_virtual, ddp, measured in ROWS:
        model, schedule, params, layout, v = row_args(name, t, p, gpus, batch, b, per_virtual, ddp)
        on = compile_for(schedule, params, Setting(model, cluster, layout))
        pred = on.prediction
        error = (pred.tflops_per_gpu - measured) / measured
        errors.append(abs(error))
        share = {k: v / pred.iteration_s for k, v in pred.breakdown.items()}
        fits = "fits" if pred.memory_bytes <= cluster.memory_bytes else "OVER"
        print(f"{name:<11} {t:>2} {p:>3} {layout.dp:>3} {b:>3} {v:>2} {pred.microbatches:>4}  "
              f"{pred.tflops_per_gpu:>9.1f} {measured:>8} {100 * error:>+6.1f}%  {pred.memory_bytes / 2**30:>6.1f} {fits}"
              f"  {pred.iteration_s:>11.2f}  {share['bubble_s']:>6.3f}  {share['tensor_parallel_comm_s']:>7.3f}"
              f"  {share['data_parallel_comm_s']:>7.3f}")
    print(f"mean_abs_error {100 * sum(errors) / len(errors):.2f} max_abs_error {100 * max(errors):.2f}")
    return errors


def speed(runs: int) -> None:
    """`schedc simulate` of the 1T row (p = 64, 512 microbatches per pipeline), whole process."""
    from compile_vs_torch import byte_compile
    byte_compile()
    name, t, p, gpus, batch, b, per_virtual, ddp, _ = ROWS[-1]
    schedc = Path(sys.executable).with_name("schedc")
    command = [str(schedc) if schedc.exists() else "schedc", "simulate", "1f1b", "-D", f"p={p}",
               "--model", str(HERE.parent / "schedc" / "models" / f"{name}.toml"), "--cluster", CLUSTER, "--tp", str(t),
               "--dp", str(gpus // (t * p)), "--microbatch-size", str(b), "--global-batch", str(batch), "--json"]
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    print(f"1T row, schedc simulate whole process over {runs} runs: wall s min {min(walls):.3f} median "
          f"{statistics.median(walls):.3f} max {max(walls):.3f}; CPU s min {min(cpus):.3f} median "
          f"{statistics.median(cpus):.3f} max {max(cpus):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default=CLUSTER, help="cluster name or file (default %(default)s)")
    parser.add_argument("--speed", type=int, default=0, metavar="RUNS",
                        help="also time `schedc simulate` of the 1T row, whole process, RUNS times")
    args = parser.parse_args()
    if args.speed:
        speed(args.speed)
    table(args.cluster)


if __name__ == "__main__":
    main()
