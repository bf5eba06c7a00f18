"""Memory over time under the timeline: one strip per device on the timeline's time axis, a step plot
of the device's live activation units (timed.memory_over_time, the series the HTML report draws), the
device's `limit memory` as a red line, the peak beside the strip.

    device 0  [0][1][2][3]      [0]   [4]  ...
    ...
    mem 0        ┌─┐  ┌─┐
              ┌──┘ └──┘ └─┐   ── limit                  peak 4 units (limit 4)
             ─┘           └──
"""
from __future__ import annotations

from ..passes.compiled import Compiled
from .canvas import GAP, LABEL_W, NOTE_W, Canvas
from .timed import memory_view

LINE = "#3b6fb6"
LIMIT = "#d6404e"
STRIP_BACK = "#f7f7f7"


def memory_strips(canvas: Canvas, compiled: Compiled, width: float,
                  byte_deltas: dict[str, tuple[float, ...]] | None = None) -> None:
    """A strip per device under the rows drawn so far, all on one vertical scale (the highest level or
    limit of any device at the top); in GiB given each kind's bytes per stage (timed.memory_view)."""
    view = memory_view(compiled, byte_deltas)
    top = max([level for steps in view.series for _, level in steps] + list(view.limits), default=0.0) or 1.0
    geo = canvas.geo
    height = 18.0 if geo.compact else 28.0
    canvas.y += 6
    what = "activation units alive" if view.unit == "units" else "GiB of activations alive"
    canvas.text("mem_section", 0, canvas.y + 5, 300, f"memory over time ({what})", geo.font + 1, "\\l")
    canvas.y += 12
    for d, steps in enumerate(view.series):
        limit = view.limits[d] if d < len(view.limits) else None
        _strip(canvas, d, steps, limit, top, height, width, view.unit)


def _strip(canvas: Canvas, d: int, steps: list[tuple[float, float]], limit: float | None, top: float,
           height: float, width: float, unit: str) -> None:
    geo = canvas.geo
    upper, base = canvas.y + 2, canvas.y + height
    mid = (upper + base) / 2

    def y(level: float) -> float:
        return base - level / top * (base - upper)

    canvas.text(f"mem{d}_label", -LABEL_W - GAP, mid, LABEL_W, f"mem {d}", geo.font + 1, "\\r")
    canvas.box(f"mem{d}_back", 0, width, mid, base - upper, f'fillcolor="{STRIP_BACK}" penwidth=0')
    if limit is not None:
        canvas.box(f"mem{d}_limit", 0, width, y(limit), 0.8,
                   f'fillcolor="{LIMIT}" penwidth=0 class="limit" tooltip="limit memory {limit:g}"')
    peak = max(level for _, level in steps)
    shown = f"{peak:g} {'unit' if peak == 1 else 'units'}" if unit == "units" else f"{peak:.3g} GiB"
    canvas.path(f"mem{d}", step_points(steps, geo.unit, width, y),
                f'color="{LINE}" penwidth=1.2 class="memory d{d}" tooltip="device {d}: peak {shown}"')
    note = f"peak {shown}" + (f" (limit {limit:g})" if limit is not None else "")
    canvas.text(f"mem{d}_note", width + GAP, mid, NOTE_W, note, geo.font + 1, "\\l")
    canvas.y += height + 2


def step_points(steps: list[tuple[float, float]], unit: float, width: float, y) -> list[tuple[float, float]]:
    """The vertices of the step plot of (time, level from then on), from time 0 to `width` points:
    at each step a vertical move at its time, then a horizontal run to the next."""
    points, last = [(0.0, y(0.0))], 0.0
    for time, level in steps:
        x = time * unit
        points += [(x, y(last)), (x, y(level))]
        last = level
    points.append((width, y(last)))
    out = [points[0]]
    for point in points[1:]:
        if point != out[-1]:
            out.append(point)
    return out if len(out) > 1 else out * 2
