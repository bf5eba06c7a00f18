"""Compile speed: schedc against torch.distributed.pipelining on the same schedule, at two sizes.

schedc: `schedc compile interleaved_1f1b -D p=P -D v=V -D m=M` as a whole process (parse, elaborate,
check, simulate, lower, check channels, write plan.json and the rank streams), its CPU seconds read
from resource.getrusage(RUSAGE_CHILDREN) (user + system; the machine is shared, so not wall time).
torch, in this process (its import not counted), CPU seconds (time.process_time):
- constructor: `ScheduleInterleaved1F1B(...)` with mock stages and no process group. It builds the
  per-rank order and already lowers it (`_add_send_recv` runs inside the constructor, giving
  `pipeline_order_with_comms`): what a torch user pays before the first step.
- constructor + dry run (--dry-run): the same, then `_simulate_comms_compute` over the lowered order
  (the actions it knows: compute, sends and receives), torch's check that the lowered streams complete.

The package is byte-compiled once first (byte_compile), as an install has its bytecode. Each size runs
--repeat times, the sides alternating; printed: the median and the spread (min-max) of
each, and `ratio P.V.M X` = the median of schedc compile / the median of torch's constructor.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
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


def time_torch(p: int, v: int, m: int, dry: bool) -> tuple[float, float | None]:
    """CPU seconds of the constructor alone, and (with `dry`) of the constructor followed by the dry run."""
    from torch.distributed.pipelining import schedules as S
    cpu = time.process_time()
    sched = S.ScheduleInterleaved1F1B([_Stage(c * p, p * v, 0, p) for c in range(v)], m)
    built = time.process_time() - cpu
    if not dry:
        return built, None
    known = {S.FORWARD, S.FULL_BACKWARD, S.BACKWARD_INPUT, S.BACKWARD_WEIGHT, S.SEND_F, S.RECV_F, S.SEND_B,
             S.RECV_B}
    lowered = {rank: [a for a in actions if a is not None and a.computation_type in known]
               for rank, actions in sched.pipeline_order_with_comms.items()}
    S._simulate_comms_compute(lowered, stage_to_rank=lambda s: s % p, num_stages=p * v)
    return built, time.process_time() - cpu


def time_schedc(p: int, v: int, m: int) -> float:
    """CPU seconds (user + system) of one `schedc compile` process, its plan written to a scratch folder."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "schedc.cli", "compile", "interleaved_1f1b", "-D", f"p={p}", "-D", f"v={v}",
                   "-D", f"m={m}", "-o", out]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def byte_compile() -> None:
    """Make sure the package's bytecode is there, as an installed package's is (pip compiles it;
    scripts/setup.sh does it for the editable install): the timed process should not compile the
    package first, when PYTHONDONTWRITEBYTECODE keeps Python from caching what it compiles."""
    import compileall
    import schedc
    compileall.compile_dir(os.path.dirname(schedc.__file__), quiet=1)


def time_passes(p: int, v: int, m: int) -> dict[str, float]:
    """CPU seconds of each pass in one process: parse + elaborate, then the driver's PASSES one by one,
    then writing the plan."""
    from schedc.driver import build_schedule, read_source
    from schedc.driver.passes import PASSES, Unit, collector_paused
    from schedc.frontend.elaborate import Options
    from schedc.frontend.library import resolve
    from schedc.plan.write import write_plan
    source = read_source(resolve("interleaved_1f1b"))
    times: dict[str, float] = {}
    with collector_paused(), tempfile.TemporaryDirectory() as out:
        start = time.process_time()
        schedule = build_schedule(source, Options({"p": str(p), "v": str(v), "m": str(m)}))
        times["parse + elaborate"] = time.process_time() - start
        unit = Unit(schedule)
        for run in PASSES:
            start = time.process_time()
            unit = run(unit)
            times[run.__name__.lstrip("_")] = time.process_time() - start
        start = time.process_time()
        write_plan(unit.plan, out)
        times["write plan"] = time.process_time() - start
    return times


def spread(values: list[float]) -> str:
    """The median and the spread: 1.234 (1.100-1.400)."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32.4.256,64.8.1024", metavar="P.V.M,...",
                        help="The schedules to time: p.v.m each (65,536 and 1,048,576 compute ops).")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="Time torch's constructor + dry run too.")
    parser.add_argument("--passes", action="store_true", help="Print a per-pass breakdown (one more compile "
                        "in this process) for each size.")
    args = parser.parse_args()
    import torch.distributed.pipelining  # noqa: F401 - import outside the timed region
    byte_compile()
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1, 5, 15 min)")
    for size in args.sizes.split(","):
        p, v, m = map(int, size.split("."))
        runs: dict[str, list[float]] = {"compile": [], "torch": [], "torch+dry": []}
        for _ in range(args.repeat):
            runs["compile"].append(time_schedc(p, v, m))
            built, dry = time_torch(p, v, m, args.dry_run)
            runs["torch"].append(built)
            if dry is not None:
                runs["torch+dry"].append(dry)
        ratios = [c / t for c, t in zip(runs["compile"], runs["torch"])]
        print(f"interleaved 1F1B p={p} v={v} m={m} ({2 * p * v * m:,} compute ops), CPU s, median (min-max) "
              f"of {args.repeat}")
        print(f"  schedc compile (whole process, plan written)   {spread(runs['compile'])}")
        print(f"  torch constructor (builds and lowers the order) {spread(runs['torch'])}")
        if runs["torch+dry"]:
            print(f"  torch constructor + _simulate_comms_compute    {spread(runs['torch+dry'])}")
        print(f"  compile / constructor, run by run              {spread(ratios)}")
        if args.passes:
            passes = time_passes(p, v, m)
            print("  passes in one process (cpu s): " + ", ".join(f"{name} {t:.2f}" for name, t in passes.items()))
        median = statistics.median(runs["compile"]) / statistics.median(runs["torch"])
        print(f"ratio {p}.{v}.{m} {median:.3f}")


if __name__ == "__main__":
    main()
