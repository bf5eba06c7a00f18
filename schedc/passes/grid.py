"""Describing ops in diagnostics: labels, source locations, microbatch ranges, and the rank x step grid
that scheduling errors show (after torch's `_format_pipeline_order(error_step_number=...)`).

    format_grid(orders, marks={(0, 4): "stuck"})  ->
              step 0  1       2       3       4
      rank 0  F(0,0)  F(0,1)  F(0,2)  F(0,3)  [B(0,3)]
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..diagnostics import Source, Span
from ..ir import Op, Schedule

MARKS = {"stuck": "[{}]", "awaited": "<{}>", "fault": "!{}"}
LEGEND = "[op] = where a rank is stuck, <op> = the op it waits for, !op = a faulty op"
GRID_COLUMNS = 12   # steps shown around the marked ones
GRID_ROWS = 24      # ranks shown (marked ranks first)


def label(schedule: Schedule, op: Op) -> str:
    """`F(0,3)`, with the pipeline's name when a schedule has several: `F(0,3).up`."""
    if len(schedule.pipelines) > 1 and 0 <= op.pipe < len(schedule.pipelines):
        return f"{op}.{schedule.pipelines[op.pipe].name}"
    return str(op)


def location(source: Source, span: Span | None) -> str:
    """`1f1b.sched:12`, the short form used inside messages (the full path leads the diagnostic); a
    span taken from another file (`extends`, `use`) names that file."""
    if span is None:
        return Path(source.path).name
    return f"{Path((span.source or source).path).name}:{span.line}"


def elide(items: Sequence, limit: int, noun: str = "in all", text=str, sep: str = ", ") -> str:
    """The first `limit` items as text, then how many there are: `F(0,1), F(0,2), ... (9 in all)`."""
    shown = sep.join(text(item) for item in items[:limit])
    return shown + (f"{sep}... ({len(items)} {noun})" if len(items) > limit else "")


def ranges(values: Sequence[int]) -> str:
    """Compress sorted integers: [0, 1, 2, 5, 7, 8] -> '0..2, 5, 7..8'."""
    parts, start, prev = [], None, None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            parts.append(f"{start}..{prev}" if prev > start else f"{start}")
            start = prev = v
    if start is not None:
        parts.append(f"{start}..{prev}" if prev > start else f"{start}")
    return ", ".join(parts)


def _window(positions: list[int], length: int) -> tuple[int, int]:
    if not positions:
        return 0, min(length, GRID_COLUMNS)
    lo, hi = min(positions), max(positions)
    pad = max(1, (GRID_COLUMNS - (hi - lo + 1)) // 2)
    return max(0, lo - pad), min(length, max(hi + pad + 1, lo + GRID_COLUMNS))


def format_grid(cells: Sequence[Sequence[object]], marks: dict[tuple[int, int], str], text=str,
                title: str = "rank") -> str:
    """A rank x step table (text(cell) per cell); marks[(rank, step)] names a style in MARKS. Shows a
    window of steps around the marked cells, and the marked ranks first when there are too many."""
    length = max((len(row) for row in cells), default=0)
    lo, hi = _window(sorted({step for _, step in marks}), length)
    marked = sorted({rank for rank, _ in marks})
    seen = set(marked)
    rows = marked + [r for r in range(len(cells)) if r not in seen]
    rows = sorted(rows[:GRID_ROWS])
    table = [[f"{title} {r}"] + [MARKS[marks[(r, k)]].format(text(cells[r][k])) if (r, k) in marks
                                 else text(cells[r][k]) for k in range(lo, min(hi, len(cells[r])))]
             for r in rows]
    header = ["step"] + [str(k) for k in range(lo, hi)]
    widths = [max(len(row[c]) for row in [header] + table if c < len(row)) for c in range(len(header))]
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    for row in table:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    hidden = len(cells) - len(rows)
    notes = [f"  (steps {lo}..{hi - 1} of {length})" if (lo, hi) != (0, length) else "",
             f"  ({hidden} more ranks not shown)" if hidden > 0 else "", "  " + LEGEND]
    return "\n".join(lines + [n for n in notes if n])


def schedule_grid(schedule: Schedule, marks: dict[tuple[int, int], str]) -> str:
    """The grid of a schedule's device orders (op labels), with marks."""
    return format_grid(schedule.orders, marks, lambda op: label(schedule, op))
