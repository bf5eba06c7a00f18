"""Time and peak memory of `schedc check`, `compile` and `render` at the sizes the limits allow.

    python benchmarks/limits.py [--runs 3] [--bound-gib 4] [--bound-cpu 20] [--quick]

Cases: 1F1B at the expansion limit (p=8, m=31,250: 500,000 ops, the most a schedule may expand to)
checked, compiled and rendered to a Chrome trace (the slowest command at that size), ZB-V at the limit
(a split backward: three ops per stage and microbatch), an SVG timeline at the Graphviz limit (200,000
ops), a schedule one op past the limit (refused at once), GPipe on 5,000 devices with one microbatch
each (10,000 ops, 5,000 ranks: what grows with the device count), and a torch CSV of 5,000 ranks. Each
command runs in its own process; its CPU time (user + system, with the processes it waits for:
Graphviz), wall time and peak resident memory (the kernel's ru_maxrss) are printed per run, with the
median and the spread. The statements this benchmark checks: every case's peak stays under --bound-gib
and its CPU time under --bound-cpu (the 20 s every command is held to; wall time, on a shared machine,
is printed but not held to it). --quick: one run each, and the limit cases at a tenth of their size.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEDC = [sys.executable, "-m", "schedc.cli"]


def cases(quick: bool, workdir: Path) -> list[tuple[str, list[str], int]]:
    """(name, schedc argv, the exit code it must give)."""
    m = 3_125 if quick else 31_250      # 1F1B, p=8: 16 m ops
    zbv = 2_083 if quick else 20_833    # ZB-V, p=4: 8 stages x 3 kinds = 24 m ops
    svg = 1_250 if quick else 12_500    # the Graphviz limit, 200,000 ops
    csv = workdir / "ranks5000.csv"
    csv.write_text("".join(f"{r}F0,{r}B0\n" for r in range(5000)))
    return [
        (f"check 1f1b p=8 m={m:,} ({16 * m:,} ops)", ["check", "1f1b", "-D", "p=8", "-D", f"m={m}"], 0),
        (f"compile 1f1b p=8 m={m:,}", ["compile", "1f1b", "-D", "p=8", "-D", f"m={m}", "-o", str(workdir / "out")], 0),
        (f"render 1f1b p=8 m={m:,} -o .json", ["render", "1f1b", "-D", "p=8", "-D", f"m={m}", "-o",
                                              str(workdir / "t.json")], 0),
        (f"check zbv p=4 m={zbv:,} ({24 * zbv:,} ops)", ["check", "zbv", "-D", f"m={zbv}"], 0),
        (f"render 1f1b p=8 m={svg:,} -o .svg ({16 * svg:,} ops)", ["render", "1f1b", "-D", "p=8", "-D", f"m={svg}",
                                                                   "-o", str(workdir / "t.svg")], 0),
        ("check 1f1b p=8 m=31,251 (past the limit)", ["check", "1f1b", "-D", "p=8", "-D", "m=31251"], 1),
        ("check gpipe p=5,000 m=1", ["check", "gpipe", "-D", "p=5000", "-D", "m=1"], 0),
        ("compile gpipe p=5,000 m=1", ["compile", "gpipe", "-D", "p=5000", "-D", "m=1", "-o", str(workdir / "g")], 0),
        ("check a torch CSV of 5,000 ranks", ["check", str(csv)], 0),
    ]


def measure(argv: list[str]) -> tuple[int, float, float, float]:
    """(exit code, CPU seconds, wall seconds, peak resident MiB) of one schedc process."""
    begin = time.monotonic()
    child = subprocess.Popen([*SCHEDC, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    return (os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, time.monotonic() - begin,
            usage.ru_maxrss / 1024)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bound-gib", type=float, default=4.0, help="peak memory each case must stay under")
    parser.add_argument("--bound-cpu", type=float, default=20.0, help="CPU seconds each case must stay under")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this text")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    failed = 0
    print("load average %.1f %.1f %.1f at the start" % os.getloadavg(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv, want in cases(args.quick, Path(tmp)):
            if args.only and args.only not in name:
                continue
            got = [measure(argv) for _ in range(runs)]
            codes = {code for code, *_ in got}
            cpus, walls, peaks = ([g[k] for g in got] for k in (1, 2, 3))
            ok = codes == {want} and max(peaks) <= args.bound_gib * 1024 and max(cpus) <= args.bound_cpu
            failed += not ok
            print(f"{name:<48} exit {'/'.join(map(str, sorted(codes)))}  "
                  f"cpu {statistics.median(cpus):6.2f} s ({min(cpus):.2f}-{max(cpus):.2f})  "
                  f"wall {statistics.median(walls):6.2f} s ({min(walls):.2f}-{max(walls):.2f})  "
                  f"peak {statistics.median(peaks):6.0f} MiB ({min(peaks):.0f}-{max(peaks):.0f})  "
                  f"{'ok' if ok else 'FAIL'}", flush=True)
    print("load average %.1f %.1f %.1f at the end" % os.getloadavg())
    print(f"bounds: {args.bound_gib:g} GiB and {args.bound_cpu:g} s of CPU per process; {failed} case(s) outside "
          "them or with the wrong exit code")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
