"""Order synthesis (`schedc tune --synthesize`) against the zero-bubble references on the same inputs.

For p in {4, 8}, m in {2p, 4p}, F = I = W = 1 (F = B/2), memory limits of p and 2p activations and the
latencies given (default 0 and 0.5): the makespan of the synthesized order, of the zero-bubble repo's
heuristic scheduler (its rules re-implemented in tests/zb_heuristic.py), of ZB-H1 (limit p) or ZB-H2
(limit 2p), and the lower bound (the last device's start plus its work), all timed by the independent
timer of tests/zb_heuristic.py; ratios ours / reference (<= 1 is as good or better). Synthesis time is
CPU seconds, best of --repeat runs with the spread.

    python benchmarks/synthesize_vs_zb.py [--latency 0 --latency 0.5] [--repeat 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import zb_heuristic as ref  # noqa: E402
from schedc.synthesize.problem import make_problem  # noqa: E402
from schedc.synthesize.scheduler import synthesize  # noqa: E402

UNIT = {"F": 1.0, "I": 1.0, "W": 1.0}


def row(p: int, m: int, limit: int, latency: float, repeat: int) -> dict:
    problem = make_problem(p, m, {"F": (1,), "I": (1,), "W": (1,)}, latency, (limit,))
    times = []
    for _ in range(repeat):
        start = time.process_time()
        result = synthesize(problem)
        times.append(time.process_time() - start)
    ours, peak = ref.simulate([list(o) for o in result.orders], UNIT, latency)
    heuristic = ref.simulate(ref.heuristic(p, m, UNIT, latency, limit), UNIT, latency)[0]
    handmade = ref.zb_h1(p, m) if limit == p else ref.zb_h2(p, m)
    zb, zb_peak = ref.simulate(handmade, UNIT, latency)
    return dict(p=p, m=m, limit=limit, latency=latency, ours=ours, peak=max(peak), heuristic=heuristic,
                zb_name="ZB-H1" if limit == p else "ZB-H2", zb=zb, zb_peak=max(zb_peak),
                bound=problem.lower_bound(), cpu=min(times), spread=max(times) - min(times),
                found_by=result.found_by)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, action="append", help="message latency (repeatable)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    latencies = args.latency or [0.0, 0.5]
    print(f"{'p':>2} {'m':>3} {'limit':>5} {'lat':>4} | {'ours':>6} {'heur':>6} {'ZB-H':>11} {'bound':>6} | "
          f"{'ours/heur':>9} {'ours/ZB':>7} | {'cpu s':>6} {'spread':>6}")
    worst_heur = worst_zb = 0.0
    for latency in latencies:
        for p in (4, 8):
            for m in (2 * p, 4 * p):
                for limit in (p, 2 * p):
                    r = row(p, m, limit, latency, args.repeat)
                    a, b = r["ours"] / r["heuristic"], r["ours"] / r["zb"]
                    worst_heur, worst_zb = max(worst_heur, a), max(worst_zb, b)
                    print(f"{p:>2} {m:>3} {limit:>5} {latency:>4g} | {r['ours']:>6g} {r['heuristic']:>6g} "
                          f"{r['zb_name']:>5} {r['zb']:>5g} {r['bound']:>6g} | {a:>9.4f} {b:>7.4f} | "
                          f"{r['cpu']:>6.2f} {r['spread']:>6.2f}")
    print(f"worst ratio ours/heuristic {worst_heur:.4f}, ours/ZB-H {worst_zb:.4f}")


if __name__ == "__main__":
    main()
