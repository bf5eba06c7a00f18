"""Compile speed: schedc against torch.distributed.pipelining on the same schedule.

schedc: `schedc compile interleaved_1f1b -D p=32 -D v=4 -D m=256` as a whole process (parse, elaborate,
check, simulate, lower, check channels, write plan.json and 32 rank streams).
torch, in one process, two figures (torch's import is not counted):
- constructor: `ScheduleInterleaved1F1B(...)` with mock stages and no process group. It builds the
  per-rank order and already lowers it (`_add_send_recv` runs inside the constructor, giving
  `pipeline_order_with_comms`): what a torch user pays before the first step.
- constructor + dry run: the same, then `_simulate_comms_compute` over the lowered order (the
  actions it knows: compute, sends and receives; the constructor's UNSHARD/RESHARD/REDUCE_GRAD are left
  out), torch's check that the lowered streams complete.

Prints each side (best of --repeat runs, the sides alternating) as wall-clock and as CPU time (user +
system of the process; steadier on a busy machine), both ratios side by side, and `ratio X` = schedc
compile / torch constructor + dry run, in CPU time, as its last line.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


class _Stage:
    """The attributes ScheduleInterleaved1F1B reads from its stages."""

    def __init__(self, index: int, stages: int, rank: int, ranks: int):
        self.stage_index, self.num_stages = index, stages
        self.group_rank, self.group_size = rank, ranks
        self.is_first, self.is_last = index == 0, index == stages - 1
        self.stage_index_to_group_rank: dict[int, int] = {}
        self.has_backward = True


def time_torch(p: int, v: int, m: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(wall, cpu) of the constructor alone, and of the constructor followed by the dry run."""
    from torch.distributed.pipelining import schedules as S
    start, cpu = time.perf_counter(), time.process_time()
    sched = S.ScheduleInterleaved1F1B([_Stage(c * p, p * v, 0, p) for c in range(v)], m)
    built = time.perf_counter() - start, time.process_time() - cpu
    known = {S.FORWARD, S.FULL_BACKWARD, S.BACKWARD_INPUT, S.BACKWARD_WEIGHT, S.SEND_F, S.RECV_F, S.SEND_B,
             S.RECV_B}
    lowered = {rank: [a for a in actions if a is not None and a.computation_type in known]
               for rank, actions in sched.pipeline_order_with_comms.items()}
    S._simulate_comms_compute(lowered, stage_to_rank=lambda s: s % p, num_stages=p * v)
    return built, (time.perf_counter() - start, time.process_time() - cpu)


def time_schedc(p: int, v: int, m: int, check: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "schedc.cli", "check" if check else "compile", "interleaved_1f1b", "-D", f"p={p}", "-D", f"v={v}",
                   "-D", f"m={m}"] + ([] if check else ["-o", out])
        before, start = os.times(), time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        after = os.times()
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        return time.perf_counter() - start, cpu


def byte_compile() -> None:
    """Make sure the package's bytecode is there, as an installed package's is (pip compiles it;
    scripts/setup.sh does it for the editable install): the timed process should not compile the
    package first, when PYTHONDONTWRITEBYTECODE keeps Python from caching what it compiles."""
    import compileall
    import schedc
    compileall.compile_dir(os.path.dirname(schedc.__file__), quiet=1)


def time_passes(p: int, v: int, m: int) -> dict[str, float]:
    """CPU seconds of each pass in one process: parse + elaborate, then compiler.PASSES one by one, then
    writing the plan."""
    from schedc import compiler
    from schedc.frontend.elaborate import Options
    from schedc.frontend.library import resolve
    from schedc.plan.write import write_plan
    source = compiler.read_source(resolve("interleaved_1f1b"))
    times: dict[str, float] = {}
    with compiler.collector_paused(), tempfile.TemporaryDirectory() as out:
        start = time.process_time()
        schedule = compiler.build_schedule(source, Options({"p": str(p), "v": str(v), "m": str(m)}))
        times["parse + elaborate"] = time.process_time() - start
        unit = compiler.Unit(schedule)
        for run in compiler.PASSES:
            start = time.process_time()
            unit = run(unit)
            times[run.__name__.lstrip("_")] = time.process_time() - start
        start = time.process_time()
        write_plan(unit.plan, out)
        times["write plan"] = time.process_time() - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", type=int, default=32)
    parser.add_argument("-v", type=int, default=4)
    parser.add_argument("-m", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-passes", dest="passes", action="store_false",
                        help="Leave out the per-pass breakdown (one more compile in this process).")
    args = parser.parse_args()
    import torch.distributed.pipelining  # noqa: F401 - import outside the timed region
    byte_compile()

    runs: dict[str, list[tuple[float, float]]] = {"compile": [], "check": [], "torch": [], "torch+dry": []}
    for _ in range(args.repeat):
        runs["compile"].append(time_schedc(args.p, args.v, args.m, False))
        runs["check"].append(time_schedc(args.p, args.v, args.m, True))
        built, dry = time_torch(args.p, args.v, args.m)
        runs["torch"].append(built)
        runs["torch+dry"].append(dry)
    wall = {k: min(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: min(c for _, c in v) for k, v in runs.items()}
    ops = 2 * args.p * args.v * args.m
    print(f"interleaved 1F1B p={args.p} v={args.v} m={args.m} ({ops:,} compute ops), best of {args.repeat}")
    print(f"{'':52} {'wall s':>8} {'cpu s':>8}")
    print(f"{'schedc compile (whole process, plan written)':52} {wall['compile']:8.3f} {cpu['compile']:8.3f}")
    print(f"{'schedc check (whole process)':52} {wall['check']:8.3f} {cpu['check']:8.3f}")
    print(f"{'torch constructor (builds and lowers the order)':52} {wall['torch']:8.3f} {cpu['torch']:8.3f}")
    print(f"{'torch constructor + _simulate_comms_compute':52} {wall['torch+dry']:8.3f} {cpu['torch+dry']:8.3f}")
    print(f"compile / torch constructor:          cpu {cpu['compile'] / cpu['torch']:.3f}"
          f"   wall {wall['compile'] / wall['torch']:.3f}")
    print(f"compile / torch constructor + dry run: cpu {cpu['compile'] / cpu['torch+dry']:.3f}"
          f"   wall {wall['compile'] / wall['torch+dry']:.3f}")
    if args.passes:
        passes = time_passes(args.p, args.v, args.m)
        checks = sum(t for name, t in passes.items() if name.startswith("check") or name == "census")
        print("passes in one process (cpu s): " + ", ".join(f"{name} {t:.3f}" for name, t in passes.items()))
        print(f"the four checks: {checks:.3f} s of {sum(passes.values()):.3f} s")
    print(f"ratio-constructor {cpu['compile'] / cpu['torch']:.3f}")
    print(f"ratio {cpu['compile'] / cpu['torch+dry']:.3f}")

if __name__ == "__main__":
    main()
