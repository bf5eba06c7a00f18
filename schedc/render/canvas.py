"""The timeline's canvas: its sizes (Geometry, chosen from the schedule's length and the width asked
for) and positioned DOT nodes, in points with y growing downwards (flipped for Graphviz).

    geometry(makespan 40, 64 ops)               16 points per forward, full rows
    geometry(makespan 4000, 8192 ops)           compact rows, 6 points per forward
    geometry(makespan 400, 1024 ops, fit=900)   the 400 units fitted into 900 points: 2.25 per unit

A width in pixels is the PNG's (PNG_DPI: 2 pixels a point); the SVG and PDF are the same drawing.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import floor, inf, log10

from .dot import PNG_DPI

COMPACT_OPS = 2000          # more ops than this: compact rows
MAX_WIDTH = 12000.0         # points; beyond it the time unit shrinks (down to MIN_UNIT)
UNIT, MIN_UNIT = 16.0, 6.0  # points per forward's duration: wanted, and the least when shrinking
LABEL_W, NOTE_W, GAP = 64.0, 210.0, 8.0
PAD = 0.15 * 72             # Graphviz's pad around the drawing, each side
# the drawing's width besides the time span: pads, row labels, notes (and a point of rounding)
FIXED_W = 2 * PAD + LABEL_W + 2 * GAP + NOTE_W + 2
DEFAULT_WIDTH = 2400        # pixels: a wider timeline is scaled to this unless --width says otherwise
MIN_TIME_W = 120.0          # points the time span keeps at the least under --width


@dataclass(frozen=True, slots=True)
class Geometry:
    unit: float    # points per cost unit
    row: float     # row pitch
    box: float     # box height
    font: float
    compact: bool

    def fits(self, label: str, width: float, font: float | None = None) -> bool:
        return len(label) * (font or self.font) * 0.62 + 2 <= width


def geometry(makespan: float, ops: int, forward: float = 1.0, row_ops: int = 0,
             fit: float | None = None) -> Geometry:
    """Sizes for a timeline of `ops` ops over `makespan` cost units, where a forward takes `forward`
    units: the scale is set in forwards, so that costs in milliseconds (or any unit) draw like costs
    in forward units. A forward far cheaper than the other ops would then make the picture huge, so it
    is never wider than 2 * MIN_UNIT points per op of the busiest row (`row_ops`), or MAX_WIDTH.
    fit: the points the time span takes instead (a width asked for, or the default cap)."""
    forward = forward if 0 < forward < inf else 1.0
    span = makespan / forward  # in forwards
    per_forward = UNIT if span * UNIT <= MAX_WIDTH else max(MIN_UNIT, MAX_WIDTH / max(span, 1.0))
    unit = min(per_forward / forward, max(MAX_WIDTH, 2 * MIN_UNIT * row_ops) / max(makespan, 1e-12))
    if fit is not None:
        unit = fit / max(makespan, 1e-12)
    per_forward = unit * forward
    if ops > COMPACT_OPS or per_forward < 10:
        return Geometry(unit, 13.0, 11.0, 6.0, True)
    return Geometry(unit, 22.0, 19.0, 9.0, False)


def time_width(natural: float, pixels: int | None) -> float | None:
    """The points the time span is fitted into: `pixels` wide in all (0: the natural width, uncapped),
    or, without it, DEFAULT_WIDTH when the natural span (in points) would make the picture wider."""
    if pixels == 0:
        return None
    if pixels is None:
        cap = DEFAULT_WIDTH * 72 / PNG_DPI - FIXED_W
        return cap if natural > cap else None
    return pixels * 72 / PNG_DPI - FIXED_W


def least_width() -> int:
    """The narrowest --width in pixels: the labels and notes, and MIN_TIME_W for the time span."""
    return int((FIXED_W + MIN_TIME_W) * PNG_DPI / 72) + 1


def text_width(text: str, font: float) -> float:
    """About how many points Helvetica at `font` points takes for `text` (for wrapping titles, legends)."""
    return len(text) * font * 0.56


@dataclass
class Canvas:
    """DOT lines of positioned nodes; `y` grows downwards while building."""

    geo: Geometry
    lines: list[str]
    y: float = 0.0

    def node(self, name: str, x: float, y: float, attrs: str) -> None:
        self.lines.append(f'{name} [pos="{x:.2f},{-y:.2f}" {attrs}];')

    def box(self, name: str, x0: float, x1: float, y: float, h: float, attrs: str) -> None:
        self.node(name, (x0 + x1) / 2, y, f"width={(x1 - x0) / 72:.4f} height={h / 72:.4f} {attrs}")

    def text(self, name: str, x: float, y: float, w: float, label: str, size: float, just: str) -> None:
        self.box(name, x, x + w, y, size + 4, f'shape=plaintext style="" fontsize={size:g} label="{esc(label)}{just}"')

    def lane(self, name: str, label: str, note: str, width: float) -> float:
        """A row's label, its idle background and its note; returns the row's centre y."""
        y, g = self.y + self.geo.row / 2, self.geo
        self.text(f"{name}_label", -LABEL_W - GAP, y, LABEL_W, label, g.font + 1, "\\r")
        self.box(f"{name}_idle", 0, width, y, g.box, f'fillcolor="{IDLE}" penwidth=0')
        self.text(f"{name}_note", width + GAP, y, NOTE_W, note, g.font + 1, "\\l")
        self.y += g.row
        return y

    def path(self, name: str, points: list[tuple[float, float]], attrs: str) -> None:
        """A polyline through `points` (x, y downwards): edges between invisible nodes, each with a
        spline (kept by `neato -n2`) that runs straight from point to point, PATH_POINTS points a piece
        (Graphviz refuses a longer attribute), the pieces `name_0`, `name_1`, ... meeting end to end."""
        dot = 'shape=point style=invis width=0.01 height=0.01'
        for k in range(0, max(len(points) - 1, 1), PATH_POINTS - 1):
            piece = points[k:k + PATH_POINTS]
            (x0, y0), (x1, y1) = piece[0], piece[-1]
            self.node(f"{name}_{k}_a", x0, y0, dot)
            self.node(f"{name}_{k}_b", x1, y1, dot)
            spline = [piece[0]]
            for a, b in zip(piece, piece[1:]):
                spline += [a, b, b]
            pos = " ".join(f"{x:.2f},{-y:.2f}" for x, y in spline)
            self.lines.append(f'{name}_{k}_a -> {name}_{k}_b [pos="{pos}" arrowhead=none {attrs}];')


PATH_POINTS = 200
IDLE = "#f0f0f0"


def tick_step(unit: float, spacing: float = 40.0) -> float:
    """The axis' tick step in cost units: the least 1, 2 or 5 times a power of ten at least `spacing`
    points apart (costs may be in seconds, forwards, microseconds or, in an edited plan, 1e15 a
    forward: the power is found from the scale, so the axis has at most width / spacing ticks)."""
    exponent = floor(log10(spacing / unit)) if unit > 0 else 0
    for power in (exponent, exponent + 1):
        for base in (1, 2, 5):
            step = float(f"{base}e{power}")
            if step * unit >= spacing:
                return step
    return float(f"1e{exponent + 2}")


def esc(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\\", "\\\\").replace('"', '\\"'))


def esc_keep(text: str) -> str:
    """Escape quotes only, keeping the `\\l` line ends of a label."""
    return text.replace('"', '\\"')
