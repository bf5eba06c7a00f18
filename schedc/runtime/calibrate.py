# `schedc calibrate`: measure the machine at hand and write a cluster description (TOML) for the cost
# model (schedc/costmodel/specs.py, docs/cluster.md): GEMM rate against size, the bandwidth memory-bound kernels
# reach, and point-to-point and all-reduce times between local processes over the backend the runtime
# uses (gloo on CPU). Every "GPU" of the description is one process with --threads threads; the
# processes measured share one node.
#
#   GEMM        linear layers (2048 rows through an n x n weight) for n = 64 ... 512: 1/rate is linear in
#               1/n for rate = P * n / (n + n0), so a least-squares line gives the peak P (gemm = 1) and
#               the half dimension n0
#   memory      bytes read and written per second by add, GELU and layer norm on 2M values (their mean)
#   messages    a message's time between two processes: the latency of 4 bytes, the bandwidth of 8 MB
#   all-reduce  8 MB over --ranks processes: NCCL's bus bandwidth 2(n-1)/n * bytes / time, as the
#               efficiency of the message bandwidth
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Below 64 a product's call overhead (which the model has not) dominates; above 512 the operands leave
# the caches of the CPUs measured here and the rate falls, which the model's rate(n) cannot follow.
SIZES = (64, 128, 192, 256, 384, 512)
QUICK_SIZES = (64, 128, 256)
TOKENS = 2048            # rows of the products: microbatch x sequence, larger than every n
MEMORY_VALUES = 1 << 21  # 8 MB of fp32: the size of a small model's activations, as the runtime moves them


def fit_gemm(rates: dict[int, float]) -> tuple[float, float]:
    """(peak FLOP/s, half dimension) of rate(n) = peak * n / (n + half): 1/rate = a + c/n, fitted by
    least squares relative to each 1/rate (every size weighs alike)."""
    xs = [1.0 / n for n in rates]
    ys = [1.0 / r for r in rates.values()]
    ws = [1.0 / (y * y) for y in ys]
    total = sum(ws)
    mx, my = sum(w * x for w, x in zip(ws, xs)) / total, sum(w * y for w, y in zip(ws, ys)) / total
    slope = (sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys))
             / sum(w * (x - mx) ** 2 for w, x in zip(ws, xs)))
    intercept = my - slope * mx
    if intercept <= 0:  # no visible asymptote: the best rate is the peak, reached from the start
        return max(rates.values()), 1.0
    return 1.0 / intercept, max(slope / intercept, 1.0)


RESIDUAL_LIMIT = 0.2  # a fitted rate more than 20 % off a measured one: the line does not describe the machine


def fit_problems(rates: dict[int, float], peak: float, half: float) -> list[str]:
    """What makes the GEMM fit untrustworthy, in words with the numbers (none: a fit to use). A loaded
    machine gives rates that fall with size (other processes take the cores during the larger
    products), which the model's rate(n) = peak * n / (n + half) cannot follow: the fit then puts the
    half dimension at the edge of the range (1, or past the largest size) and leaves large residuals.

    >>> fit_problems({64: 84e9, 512: 16.6e9}, *fit_gemm({64: 84e9, 512: 16.6e9}))[0][:40]
    'the GEMM rate falls with size (84.0 GFLO'
    """
    sizes = sorted(rates)
    problems = []
    small, large = rates[sizes[0]], rates[sizes[-1]]
    if large < small:
        problems.append(f"the GEMM rate falls with size ({small / 1e9:.1f} GFLOP/s at n = {sizes[0]}, "
                        f"{large / 1e9:.1f} at n = {sizes[-1]}): a busy machine, not a GEMM's curve")
    if half <= 1.0 or half >= sizes[-1]:
        problems.append(f"the fitted half dimension {half:.4g} is at the edge of the sizes measured "
                        f"({sizes[0]} .. {sizes[-1]})")
    worst = max(abs(peak * n / (n + half) / r - 1.0) for n, r in rates.items())
    if worst > RESIDUAL_LIMIT:
        problems.append(f"the fit misses a measured rate by {worst:.0%} (more than {RESIDUAL_LIMIT:.0%})")
    return problems


def fit_warnings(rates: dict[int, float], peak: float, half: float) -> list[str]:
    """fit_problems as warning lines, with the remedy."""
    return [f"warning: {problem}; calibrate again on a quiet machine (uptime's load below the cores)"
            for problem in fit_problems(rates, peak, half)]


def _best_time(fn, min_time: float) -> float:
    """The best time of fn() over repeats lasting at least min_time in all (after one warm-up)."""
    fn()
    best, spent = float("inf"), 0.0
    while spent < min_time or best == float("inf"):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return best


def measure_gemm(sizes=SIZES, min_time: float = 0.2, tokens: int = TOKENS) -> dict[int, float]:
    """FLOP/s of a linear layer as the model runs it: `tokens` rows through an n x n weight (x @ w.T),
    whose smallest dimension is n."""
    import torch
    import torch.nn.functional as F
    rates = {}
    for n in sizes:
        x, w = torch.randn(tokens, n), torch.randn(n, n)
        rates[n] = 2 * tokens * n * n / _best_time(lambda: F.linear(x, w), min_time)
    return rates


def measure_memory(values: int = MEMORY_VALUES, min_time: float = 0.2) -> dict[str, float]:
    """Bytes per second read + written by three memory-bound kernels on `values` fp32 values."""
    import torch
    import torch.nn.functional as F
    x, y = torch.randn(values), torch.randn(values)
    rows = x.view(-1, 1024)
    width = x.element_size()
    kernels = {"add": (lambda: torch.add(x, y), 3), "gelu": (lambda: F.gelu(x), 2),
               "layer_norm": (lambda: F.layer_norm(rows, (1024,)), 2)}
    return {name: moved * values * width / _best_time(fn, min_time) for name, (fn, moved) in kernels.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _comm_rank(rank: int, world: int, port: int, out: str, repeats: int, threads: int) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = {}
        for size in (4, 8 << 20):
            buf = torch.zeros(size // 4)
            times = []
            for _ in range(repeats):  # ping-pong between ranks 0 and 1: half a round trip per message
                dist.barrier()
                start = time.perf_counter()
                if rank == 0:
                    dist.isend(buf, 1).wait()
                    dist.irecv(buf, 1).wait()
                elif rank == 1:
                    dist.irecv(buf, 0).wait()
                    dist.isend(buf, 0).wait()
                times.append((time.perf_counter() - start) / 2)
            results[f"p2p_{size}"] = min(times)
        buf = torch.zeros((8 << 20) // 4)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            times.append(time.perf_counter() - start)
        results["all_reduce_8388608"] = min(times)
        if rank == 0:
            Path(out).write_text(repr(results))
    finally:
        dist.destroy_process_group()


def measure_comm(world: int, repeats: int = 10, threads: int = 1) -> dict[str, float]:
    """Message and all-reduce times between `world` local processes on gloo."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "comm.txt")
        mp.spawn(_comm_rank, args=(world, _free_port(), out, repeats, threads), nprocs=world, join=True)
        import ast
        return ast.literal_eval(Path(out).read_text())


def cluster_toml(name: str, peak: float, half: float, memory_bw: float, ram: float, ranks: int,
                 latency: float, bandwidth: float, bus: float, notes: str = "") -> str:
    """The cluster description of the measurements (units of schedc/clusters/*.toml)."""
    efficiency = min(1.0, max(bus / bandwidth, 1e-3))
    return f"""# Measured by `schedc calibrate` on {name}{notes}: one "GPU" is one process, all in one node.
name = "{name}"

[gpu]
dtype = "fp32"                         # what the GEMMs were timed in: peak_tflops is fp32's
peak_tflops = {peak / 1e12:.6g}          # the GEMM fit's asymptote (efficiency.gemm = 1)
memory_gib = {ram / 2**30:.6g}
hbm_gbps = {memory_bw / 1e9:.6g}             # mean of add, GELU, layer norm (efficiency.hbm = 1)

[node]
gpus = {ranks}

[intra]
bandwidth_gbps = {bandwidth / 1e9:.6g}       # an 8 MB message between two processes
latency_us = {latency * 1e6:.6g}            # a 4-byte message

[inter]                                     # no network: the same processes
bandwidth_gbps = {bandwidth / 1e9:.6g}
latency_us = {latency * 1e6:.6g}

[efficiency]
gemm = 1.0
gemm_half_dim = {half:.6g}
hbm = 1.0
intra = {efficiency:.6g}                     # all-reduce bus bandwidth over the message bandwidth
inter = {efficiency:.6g}
"""


def _ram() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def calibrate(ranks: int = 2, threads: int = 1, quick: bool = False, name: str | None = None) -> tuple[str, dict]:
    """Run the measurements; (the cluster TOML, the raw figures)."""
    import torch
    torch.set_num_threads(threads)
    min_time = 0.05 if quick else 0.2
    rates = measure_gemm(QUICK_SIZES if quick else SIZES, min_time)
    peak, half = fit_gemm(rates)
    memory = measure_memory(MEMORY_VALUES, min_time)
    comm = measure_comm(ranks, 3 if quick else 10, threads)
    latency = comm["p2p_4"]
    bandwidth = (8 << 20) / max(comm["p2p_8388608"] - latency, 1e-9)
    bus = 2 * (ranks - 1) / ranks * (8 << 20) / comm["all_reduce_8388608"] if ranks > 1 else bandwidth
    label = name or f"{socket.gethostname()} CPU, gloo, {threads} thread{'s' * (threads != 1)} per process"
    text = cluster_toml(label, peak, half, statistics.fmean(memory.values()), _ram(), ranks, latency, bandwidth,
                        bus, f" (torch {torch.__version__})")
    return text, {"gemm_flops": rates, "memory_bytes_per_s": memory, "comm_s": comm,
                  "warnings": fit_warnings(rates, peak, half)}


def main(argv: list[str] | None = None) -> int:  # python -m schedc.runtime.calibrate
    parser = argparse.ArgumentParser(prog="schedc calibrate", description=__doc__)
    parser.add_argument("-o", "--out", required=True, help="the cluster TOML to write")
    parser.add_argument("--ranks", type=int, default=2, help="local processes for the message timings")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (as the runtime's --threads)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (seconds, not a minute)")
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.threads < 1:
        print("error: --ranks must be at least 2 (a ping-pong needs two) and --threads at least 1", file=sys.stderr)
        return 2
    text, raw = calibrate(args.ranks, args.threads, args.quick)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    rates = ", ".join(f"{n}: {r / 1e9:.1f}" for n, r in raw["gemm_flops"].items())
    print(f"GEMM GFLOP/s by size {rates}")
    print("memory-bound GB/s " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in raw["memory_bytes_per_s"].items()))
    print("messages s " + ", ".join(f"{k} {v:.3g}" for k, v in raw["comm_s"].items()))
    for line in raw["warnings"]:
        print(line, file=sys.stderr)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
