"""PipeFisher's headline, simulated: K-FAC in the bubbles of Chimera (8 stages, 8 microbatches) with the
V100 profiles of BERT-Base and BERT-Large that PipeFisher measured (tests/data/*_time_memory_v100.csv),
at every micro-batch size in the files, with schedc/schedules/pipefisher.sched's defaults.

For each row: utilization without fills -> with fills (busy time over devices x the cycle's time,
the per-piece overhead of `split auto` cuts counted as busy), the useful utilization (that overhead
not counted), the cycle K and the pieces chosen per unit. The paper (Osawa et al., MLSys'23) reports
59.8 % -> 97.6 % GPU utilization measured for BERT-Large, micro-batch 32, on 8 V100s.

    python benchmarks/pipefisher_paper.py [--profiles DIR]

The simulation is deterministic: one run gives the figures.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from schedc.driver import compile_source, read_source
from schedc.diagnostics import SchedError
from schedc.frontend.elaborate import Options
from schedc.interop.profiles import read_profile, read_profile_memory

ROOT = Path(__file__).resolve().parent.parent
PAPER = "paper (BERT-Large, micro-batch 32, measured): 59.8 % -> 97.6 %"


def sizes(path: Path) -> list[int]:
    return [int(row["bs"]) for row in csv.DictReader(path.read_text().splitlines())]


def simulate(path: Path, size: int) -> dict:
    options = Options({"p": "8", "m": "8"}, read_profile(str(path), size),
                      memory=read_profile_memory(str(path), size))
    result = compile_source(read_source(ROOT / "schedc" / "schedules" / "pipefisher.sched"), options)
    return {**result.stats, "ok": result.ok}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT / "tests" / "data")
    args = parser.parse_args()
    print(f"{'model':<11}{'micro-batch':>11}  {'unfilled':>8} -> {'filled':>6}  {'useful':>6}  {'K':>3}  "
          "pieces per unit (curvature A, B, inversion)")
    for model in ("bert-base", "bert-large"):
        path = args.profiles / f"{model}_time_memory_v100.csv"
        for size in sizes(path):
            try:
                stats = simulate(path, size)
            except SchedError as exc:
                print(f"{model:<11}{size:>11}  error: {exc.render().splitlines()[0]}")
                continue
            pieces = stats["pieces"]
            print(f"{model:<11}{size:>11}  {stats['utilization_unfilled']:>8.1%} -> {stats['utilization']:>6.1%}  "
                  f"{stats.get('utilization_useful', stats['utilization']):>6.1%}  {stats['cycle_steps']:>3}  "
                  f"{pieces['curvature_A']}, {pieces['curvature_B']}, {pieces['inversion']}")
    print(PAPER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
