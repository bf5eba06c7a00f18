"""Time and peak memory of `schedc check` and `schedc compile` at the sizes the limits allow.

    python benchmarks/limits.py [--runs 3] [--bound-gib 4] [--quick]

Cases: 1F1B at the expansion limit (p=8, m=125,000: 2,000,000 ops, the most a schedule may expand to),
a schedule one op past it (refused at once), GPipe on 5,000 devices with one microbatch each (10,000 ops,
5,000 ranks: what grows with the device count), and a torch CSV of 5,000 ranks. Each command runs in its
own process; its wall time and peak resident memory (the kernel's ru_maxrss of that process) are
printed per run, with the median and the spread, and each peak is held to --bound-gib (the statement
this benchmark checks: every pass stays within that bound at these sizes). --quick: one run each, and
the 2,000,000-op cases at a tenth of their size.
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
    m = 12_500 if quick else 125_000
    csv = workdir / "ranks5000.csv"
    csv.write_text("".join(f"{r}F0,{r}B0\n" for r in range(5000)))
    return [
        (f"check 1f1b p=8 m={m:,} ({16 * m:,} ops)", ["check", "1f1b", "-D", "p=8", "-D", f"m={m}"], 0),
        (f"compile 1f1b p=8 m={m:,}", ["compile", "1f1b", "-D", "p=8", "-D", f"m={m}", "-o", str(workdir / "out")], 0),
        ("check 1f1b p=8 m=125,001 (past the limit)", ["check", "1f1b", "-D", "p=8", "-D", "m=125001"], 1),
        ("check gpipe p=5,000 m=1", ["check", "gpipe", "-D", "p=5000", "-D", "m=1"], 0),
        ("compile gpipe p=5,000 m=1", ["compile", "gpipe", "-D", "p=5000", "-D", "m=1", "-o", str(workdir / "g")], 0),
        ("check a torch CSV of 5,000 ranks", ["check", str(csv)], 1),
    ]


def measure(argv: list[str]) -> tuple[int, float, float]:
    """(exit code, wall seconds, peak resident MiB) of one schedc process."""
    begin = time.monotonic()
    child = subprocess.Popen([*SCHEDC, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    child.stderr.close()
    return child.returncode, time.monotonic() - begin, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bound-gib", type=float, default=4.0, help="peak memory each case must stay under")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this text")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv, want in cases(args.quick, Path(tmp)):
            if args.only and args.only not in name:
                continue
            got = [measure(argv) for _ in range(runs)]
            codes = {code for code, _, _ in got}
            walls, peaks = [w for _, w, _ in got], [p for _, _, p in got]
            ok = codes == {want} and max(peaks) <= args.bound_gib * 1024
            failed += not ok
            print(f"{name:<44} exit {'/'.join(map(str, sorted(codes)))}  "
                  f"wall {statistics.median(walls):7.2f} s ({min(walls):.2f}-{max(walls):.2f})  "
                  f"peak {statistics.median(peaks):7.0f} MiB ({min(peaks):.0f}-{max(peaks):.0f})  "
                  f"{'ok' if ok else 'FAIL'}", flush=True)
    print(f"bound: {args.bound_gib:g} GiB per process; {failed} case(s) outside it or with the wrong exit code")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
