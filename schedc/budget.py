"""The one resource rule: work that grows with a number a user types (an optional pop's bound, a
squeeze's unit slots, tune's candidates, a render's pixels or nodes) is counted before it is done and
refused past a named limit, so that no input makes the tool run for minutes or fill memory. Each limit
is a Budget here; the caller says what it is about to do and raises the refusal where it can locate it.

    SQUEEZE_SLOTS.refusal(10**9 + 1, "'squeeze': device 0's program spans", items=8)
    -> "'squeeze': device 0's program spans 1,000,000,001 unit slots, past the limit of 1,088 (...)"
"""
from __future__ import annotations

from dataclasses import dataclass


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


# a squeeze passes over every unit slot of a device, for each op it moves; a program's slots are
# about one per op (V-Half: 6 per microbatch for its 6 ops), so this is far past any schedule's
SQUEEZE_SLOTS = Budget("unit slots", 1_024, "a squeeze scans a device's slots for every op it moves: 1,024 "
                       "and 8 per op of the device", per=8)
# tune simulates each candidate: 10^5 take minutes on one core
TUNE_CANDIDATES = Budget("candidates", 100_000, "narrow --schedules, --tp, --pp, --microbatch or --gpus")
# a PNG or SVG timeline's area, and a DAG's nodes (Graphviz lays out every one)
RENDER_PIXELS = Budget("pixels", 400_000_000, "render a smaller schedule, or to .json or .html")
RENDER_NODES = Budget("nodes", 20_000, "Graphviz lays out every node; render a smaller schedule")
RENDER_OPS = Budget("ops", 2_000_000, "every op is written; render a smaller schedule")
