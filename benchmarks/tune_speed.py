"""tune's speed: the whole library for GPT-3 175B on 1,024 A100s, the fast search (bounds, the cache,
candidates of one order and layout merged into one row) against the exhaustive one (no bound, no cache,
no merging), and whether both give the same top K.

    python benchmarks/tune_speed.py [--runs 3] [--exhaustive-runs 1] [--quick | --row 1t]

is `schedc tune --model gpt-175b --cluster dgx-a100-80gb --gpus 1024 --global-batch 1536` (--quick: the
1.7B model on 32 GPUs, batch 128; --row 1t: Megatron-LM's 1T row, gpt-1008b on 3,072 GPUs, batch 3,072,
over 1f1b, interleaved_1f1b and zb_h1), with --cp 1 --zero 0 (--sharding: cp and the ZeRO level searched too, as
the command does without them). --exhaustive-runs 0 times the fast search alone (nothing
compared: the line says so, and the exit status is 0). Each search runs in this process on a fresh Searcher (no cache
kept between runs); times are CPU seconds of this process (time.process_time, so a busy machine's
other work does not count) and wall seconds. The top K compared: every schedule named in a fast row,
listed as its own (ties broken by candidate, as the exhaustive walk breaks them), against the
exhaustive ranking: the same schedules, layouts (t, p, d, v, b, m, recompute) and iteration times.

The fast ranking is printed with the line `tune X.XX s (fast, median CPU)` before the exhaustive search.
The package is byte-compiled once before timing (compile_vs_torch.byte_compile), as an install has its
bytecode: the search's lazily imported modules are then not compiled from source inside a timed run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


ROWS = {  # (model, GPUs, global batch, schedules: () the whole library)
    "175b": ("gpt-175b", 1024, 1536, ()),
    "quick": ("gpt-1.7b", 32, 128, ()),
    "1t": ("gpt-1008b", 3072, 3072, ("1f1b", "interleaved_1f1b", "zb_h1")),
}


def timed(request):
    from schedc.search import Searcher
    cpu, wall = time.process_time(), time.perf_counter()
    outcome = Searcher(request).run()
    return outcome, time.process_time() - cpu, time.perf_counter() - wall


def expanded(ranked, top: int) -> list[tuple]:
    rows = sorted((r.iteration_s, c) for r in ranked for c in (r.candidate, *r.same))
    return [(c, round(t, 12)) for t, c in rows][:top]


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.2f} s, min {min(values):.2f}, max {max(values):.2f} "
            f"(spread {max(values) - min(values):.2f} s over {len(values)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="fast searches (default 3)")
    parser.add_argument("--exhaustive-runs", type=int, default=1, help="exhaustive searches (default 1)")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="the 1.7B model on 32 GPUs, batch 128")
    parser.add_argument("--sharding", action="store_true",
                        help="search cp and the ZeRO level too, as `schedc tune` does without --cp or --zero")
    parser.add_argument("--row", choices=("1t",), default=None,
                        help="1t: Megatron-LM's 1T row (3,072 GPUs) over 1f1b, interleaved_1f1b, zb_h1")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compile_vs_torch import byte_compile
    byte_compile()
    from dataclasses import replace

    from schedc.search import Request
    model, gpus, batch, names = ROWS["quick" if args.quick else args.row or "175b"]
    searched = {"cp": (), "zero": ()} if args.sharding else {"cp": None, "zero": None}
    fast_request = Request(model, "dgx-a100-80gb", gpus, batch, schedules=names, top=args.top, **searched)
    only = f" --schedules {','.join(names)}" if names else ""
    only += "" if args.sharding else " --cp 1 --zero 0"
    print(f"schedc tune --model {model} --cluster dgx-a100-80gb --gpus {gpus} --global-batch {batch}{only} --top {args.top}")
    fast = [timed(fast_request) for _ in range(args.runs)]
    outcome = fast[0][0]
    print(f"fast: {outcome.counts['candidates']:,} candidates, {outcome.counts['started']} orders started "
          f"(their memory bounded until the first backward, or the first W), {outcome.counts['structures']} compiled whole, "
          f"{outcome.counts['simulated']} simulations, {outcome.counts['bounded']:,} bounded out, "
          f"{outcome.counts['merged']} merged; CPU {spread([f[1] for f in fast])}; wall {spread([f[2] for f in fast])}")
    if outcome.stopped is not None:
        print(f"the walk stopped at its budget ({outcome.stopped.limit:,} ops): {outcome.stopped.left} candidates left")
    for r in outcome.ranked:
        print(f"  {r.label():<24} {r.candidate.describe():<52} {r.iteration_s:.4f} s")
    print(f"tune {statistics.median(f[1] for f in fast):.2f} s (fast, median CPU)")
    if args.exhaustive_runs < 1:
        print("top K: not compared (--exhaustive-runs 0)")
        return
    exhaustive = [timed(replace(fast_request, exhaustive=True, walk_ops=0)) for _ in range(args.exhaustive_runs)]
    reference = exhaustive[0][0]
    print(f"exhaustive: {reference.counts['structures']} orders compiled, {reference.counts['simulated']} simulations; "
          f"CPU {spread([e[1] for e in exhaustive])}; wall {spread([e[2] for e in exhaustive])}")
    want = [(r.candidate, round(r.iteration_s, 12)) for r in reference.ranked]
    same = all(expanded(f[0].ranked, len(want)) == want for f in fast)
    print(f"top {len(want)}: {'identical' if same else 'DIFFERENT'} (schedules, layouts, iteration times)")
    print(f"speed-up {statistics.median(e[1] for e in exhaustive) / statistics.median(f[1] for f in fast):.1f}x (CPU)")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
