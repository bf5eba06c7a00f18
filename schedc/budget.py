"""The one resource rule: work that grows with a number a user types (an optional pop's bound, a
squeeze's unit slots, tune's candidates, a render's pixels or nodes) is counted before it is done and
refused past a named limit, so that no input makes the tool run for minutes or fill memory. Each limit
is a Budget here; the caller says what it is about to do and raises the refusal where it can locate it,
as a usage error (REFUSED: exit 2), whichever stage meets it: the numbers given ask for more work than
the tool does, as an option out of range does.

    SQUEEZE_SLOTS.refusal(10**9 + 1, "'squeeze': device 0's program spans", items=8)
    -> "'squeeze': device 0's program spans 1,000,000,001 unit slots, past the limit of 1,088 (...)"
"""
from __future__ import annotations

from dataclasses import dataclass

from .diagnostics import USAGE

REFUSED = USAGE  # the kind of every refusal of a budget (diagnostics.EXIT_CODES: 2)


@dataclass(frozen=True, slots=True)
class Budget:
    """A limit on one kind of work: `limit` of `unit`, plus `per` for each of the items it is for (a
    squeeze's slots grow with its ops), and why the limit is where it is."""

    unit: str
    limit: int
    why: str = ""
    per: int = 0

    def allowed(self, items: int = 0) -> int:
        return self.limit + self.per * items

    def refusal(self, count: int, what: str, items: int = 0) -> str | None:
        """None when `count` is within the limit (for `items`), else the message naming the limit."""
        allowed = self.allowed(items)
        if count <= allowed:
            return None
        return f"{what} {count:,} {self.unit}, past the limit of {allowed:,}" + (f" ({self.why})" if self.why else "")


# the statements the programs of all devices may run, shared (so a runaway loop stops once): some
# seconds of interpretation (V-Half runs about 6 per op; p = 4, m = 3,400 is near the limit)
PROGRAM_STATEMENTS = Budget("statements", 500_000, ", the limit of the programs' interpreter (seconds of work): "
                            "give smaller params")
# a squeeze passes over every unit slot of a device, for each op it moves; a program's slots are
# about one per op (V-Half: 6 per microbatch for its 6 ops), so this is far past any schedule's
SQUEEZE_SLOTS = Budget("unit slots", 1_024, "a squeeze scans a device's slots for every op it moves: 1,024 "
                       "and 8 per op of the device", per=8)
# tune's candidates, counted before the space is built: each is bounded (its shape, state and cost
# vector) before any is simulated, some 0.1 ms each; the whole library for GPT-3 175B on 1,024 GPUs is
# 38,460 of them, the library's largest model on a million GPUs about 100,000
TUNE_CANDIDATES = Budget("candidates", 150_000, "each is bounded before any is simulated, some 15 s at the "
                         "limit: narrow the search with --tp, --pp, --microbatch-size, --schedules, --cp or --zero")
# tune --synthesize's order: its greedy variants and local search time the whole order hundreds of
# times, and the .sched written is compiled back (p = 32, m = 64: 4,096 ops, 7 s; m = 1,000: 35 s)
SYNTHESIS_OPS = Budget("ops", 10_000, "the synthesis times the whole order hundreds of times, some 10 s at "
                       "the limit: give a smaller p or m")
# tune's walk over the bounded candidates: the ops of the orders it builds (and of their starts) and of
# the simulations it runs, each weighted by about what it costs against a simulated op (search/searcher.py
# _BUILT: 2 for an op the programs place, 6 where a squeeze then passes over it). Past the limit the walk
# stops and says which of its rows are certain (no candidate left could pass them): Megatron's 1T row
# walks 4.6 million, GPT-3 175B's whole library on 1,024 GPUs 2.7 million, the 1T model's whole library on
# 512 GPUs with the ZeRO levels searched (docs/hardening.md, case 6697) 60 million, some
# 200 s of CPU: the limit bounds a search of the largest sizes to minutes, a smaller one stops where asked
TUNE_WALK = Budget("ops", 64_000_000, "ops built and simulated, weighted: --walk-ops N raises it, 0 lifts it")
# tune compiles a schedule with `fill bubbles` whole for each candidate, its fill searched: about 1.5 s
# of CPU each (PipeFisher, 8 GPUs: 180 candidates, minutes)
TUNE_FILLS = Budget("candidates", 8, "each is compiled whole with its fill searched, a second or two: narrow "
                    "the search with --tp, --pp, --microbatch, --recompute or --zero")
# tune compiles a schedule with placed R, O, L ops, tasks or a greedy order whole for each candidate,
# in time that grows with the candidates and with their stages x microbatches: GPT 1.7B on 8 GPUs, 468
# candidates of 12,303 stage-microbatches in all, 5 s of CPU; GPT-3 175B on 1,024 GPUs at t = 8, p = 8
# or 16, 104 candidates of 40,576, 7.5 s; the whole space there (6,360 candidates), 132 s. At both
# limits some 10 s
TUNE_WHOLE = Budget("candidates", 600, "each is compiled whole: narrow the search with --tp, --pp, "
                    "--microbatch-size, --recompute or --zero")
TUNE_WHOLE_UNITS = Budget("stage-microbatches", 60_000, "each candidate's stages x microbatches, compiled "
                          "whole: narrow the search with --tp, --pp, --microbatch-size, --recompute or --zero")
# a PNG's pixels: Graphviz takes about 1 s per 10^7 (p = 512 at 144 dpi is 1.7 x 10^8: 16 s); a
# larger timeline is drawn at a lower resolution, down to MIN_PNG_DPI, and refused past that
RENDER_PIXELS = Budget("pixels", 40_000_000, "a PNG this large takes Graphviz minutes: write .svg, .pdf or .json")
# a timeline's width asked for with --width: the natural scale's widest (12,000 points, 2 pixels a
# point); far wider ones (10^9 pixels) kept Graphviz busy for minutes
RENDER_WIDTH = Budget("pixels", 24_000, "the widest a timeline is drawn at its natural scale; give less, or 0 "
                      "for the natural scale")
# the ops a schedule may expand to, every front end and task included (--max-ops): a compile holds
# about 0.9 KiB per op at its peak and takes some 15 us of CPU per op (interleaved 1F1B at
# 1,048,576 ops: under 1 GiB, benchmarks/compile_vs_torch.py); render has its own, lower limit
COMPILE_OPS = Budget("ops", 1_048_576, "--max-ops N raises the limit: memory and time grow with the ops")
# the statements above grow with the ops the programs place: a schedule of more than 62,500 ops may
# run this many per op (V-Half runs about 6), so a program's length, not its size, is what is capped
STATEMENTS_PER_OP = 8
# a render draws every op: a Chrome trace of 200,000 ops takes 5 s and 26 MB, a Graphviz timeline
# 25 s and 48 MB (render/__init__.py); a larger schedule is summarized, not drawn
RENDER_OPS = Budget("ops", 200_000, "render draws every op: render fewer microbatches (-D m=), whose "
                    "timeline repeats, or run `schedc simulate` for the summary per device")
