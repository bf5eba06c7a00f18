"""The per-device program interpreter's speed: elaborate of a library schedule in process, CPU seconds of
the whole elaboration and of its programs' run (frontend/order.run_programs: the queues, the programs,
the orders), median of --runs, with loops of many rounds run as generated functions (frontend/loops.py)
and, with --plain, every statement interpreted; the orders of both compared op for op.

    python benchmarks/program_speed.py                          # v_min p=64 m=2048, interleaved p=64 v=8 m=1024
    python benchmarks/program_speed.py v_half p=16 m=512 --runs 5
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import schedc.schedules
from schedc.diagnostics import Source
from schedc.driver.inputs import load_declaration
from schedc.frontend import elaborate as elaborate_module, order
from schedc.frontend.elaborate import Options, elaborate

CASES = [("v_min", {"p": "64", "m": "2048"}), ("interleaved_1f1b", {"p": "64", "v": "8", "m": "1024"})]


def timed(name: str, params: dict[str, str], compiled: bool) -> tuple[float, float, list]:
    """(elaborate's CPU s, run_programs' CPU s, the orders as text) of one elaboration."""
    path = Path(schedc.schedules.__file__).parent / f"{name}.sched"
    source = Source(str(path), path.read_text())
    decl = load_declaration(source)
    spent = [0.0]
    run_programs = order.run_programs

    def counted(*args, **kwargs):
        start = time.process_time()
        try:
            return run_programs(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - start
    elaborate_module.run_programs, order._ProgramRun.COMPILED = counted, compiled
    try:
        start = time.process_time()
        schedule = elaborate(decl, source, Options(params, max_ops=10 ** 8))
        whole = time.process_time() - start
    finally:
        elaborate_module.run_programs, order._ProgramRun.COMPILED = run_programs, True
    return whole, spent[0], [list(map(str, ops)) for ops in schedule.orders]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("schedule", nargs="?")
    parser.add_argument("params", nargs="*", help="NAME=VALUE")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plain", action="store_true", help="also time the interpreter alone, alternating")
    args = parser.parse_args()
    cases = [(args.schedule, dict(p.split("=", 1) for p in args.params))] if args.schedule else CASES
    for name, params in cases:
        ways = (True, False) if args.plain else (True,)
        runs: dict[bool, list] = {way: [] for way in ways}
        for _ in range(args.runs):
            for way in ways:
                runs[way].append(timed(name, params, way))
        if args.plain:
            assert runs[True][0][2] == runs[False][0][2], "the orders differ"
        for way in ways:
            whole, programs = ([r[k] for r in runs[way]] for k in (0, 1))
            print(f"{name} {' '.join(f'{k}={v}' for k, v in params.items())} "
                  f"{'generated loops' if way else 'interpreted'}: elaborate {statistics.median(whole):.2f} s "
                  f"({min(whole):.2f}-{max(whole):.2f}), programs {statistics.median(programs):.2f} s "
                  f"({min(programs):.2f}-{max(programs):.2f})", flush=True)


if __name__ == "__main__":
    main()
