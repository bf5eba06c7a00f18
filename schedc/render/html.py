"""The HTML report: one self-contained file (no scripts, no network) with the timeline inline as SVG,
per-device stats, memory over time per device (an SVG drawn here), params, diagnostics and the source.

Memory over time counts activation units alive on a device, from the simulated times: F allocates its
stage's units at its start, B (W when backward is split) frees them at its end; frees at an instant
come before allocations, as on a device that runs one op at a time. A schedule with tasks or other
`memory` declarations draws schedc/memory.py's model over the whole cycle instead: activations and
gradients that tasks keep, and tasks' persistent state (held from time 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..compiled import Compiled
from .timed import memory_over_time

CHART_W, PANEL_H, PANEL_GAP, AXIS_H, LEFT = 760.0, 46.0, 8.0, 22.0, 70.0


@dataclass(frozen=True, slots=True)
class Panel:
    """One device's memory curve, in chart coordinates."""

    device: int
    top: float
    points: str      # SVG polyline points
    peak: float
    peak_y: float    # y of the device's peak level
    limit_y: float | None  # y of the device's `limit memory`, if the schedule has one


@lru_cache(maxsize=1)
def _environment():
    import jinja2
    return jinja2.Environment(loader=jinja2.PackageLoader("schedc.render", "templates"),
                              autoescape=jinja2.select_autoescape(["html", "svg", "j2"]),
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def memory_panels(compiled: Compiled) -> tuple[list[Panel], float]:
    schedule, timing = compiled.schedule, compiled.timing
    series = memory_over_time(compiled)
    limits = schedule.memory_limit or ()
    top_level = max([level for steps in series for _, level in steps] + list(limits), default=0.0) or 1.0
    xscale = CHART_W / (timing.makespan or 1.0)
    panels = []
    for d, steps in enumerate(series):
        top = d * (PANEL_H + PANEL_GAP)

        def y(level: float) -> float:
            return top + PANEL_H - level / top_level * (PANEL_H - 4)

        points, last = [], 0.0
        for time, level in steps:
            x = LEFT + time * xscale
            points.append(f"{x:.1f},{y(last):.1f} {x:.1f},{y(level):.1f}")
            last = level
        points.append(f"{LEFT + CHART_W:.1f},{y(last):.1f}")
        peak = max(level for _, level in steps)
        limit_y = y(limits[d]) if d < len(limits) else None
        panels.append(Panel(d, top, " ".join(points), peak, y(peak), limit_y))
    return panels, top_level


def device_rows(compiled: Compiled) -> list[dict]:
    """Per device: its ops, busy and idle time over the same span, the whole cycle of a filled schedule."""
    st, makespan, steps = compiled.stats, compiled.timing.makespan, compiled.schedule.steps
    return [{"device": d, "ops": sum(len(program[d]) for program in steps), "busy": st["busy"][d],
             "idle": st["idle"][d], "inside": st["idle_inside"][d],
             "utilization": st["busy"][d] / makespan if makespan else 0.0, "peak": st["peak_memory"][d]}
            for d in range(compiled.schedule.devices)]


def report_html(compiled: Compiled, timeline_svg: str) -> str:
    """The report's HTML text (deterministic for a given compiled schedule and timeline)."""
    schedule, timing = compiled.schedule, compiled.timing
    panels, top_level = memory_panels(compiled)
    env = _environment()
    chart = env.get_template("memory.svg.j2").render(
        panels=panels, top_level=top_level, width=CHART_W, left=LEFT, panel_h=PANEL_H,
        height=len(panels) * (PANEL_H + PANEL_GAP) + AXIS_H, makespan=timing.makespan,
        ticks=_ticks(timing.makespan))
    return env.get_template("report.html.j2").render(
        schedule=schedule, stats=compiled.stats, devices=[] if not compiled.ok else device_rows(compiled),
        cycle=len(schedule.steps),
        invalid=not compiled.ok, timeline=timeline_svg,
        memory=chart, diagnostics=[d.format(schedule.source) for d in compiled.diagnostics],
        source=schedule.source.text, params=schedule.params,
        cluster=_cluster(compiled), cluster_flags=_cluster_flags(compiled))


def _cluster_flags(compiled: Compiled) -> list[str]:
    """The --cluster compile's layout switches that are on, in words, as `simulate --cluster` prints them."""
    from ..layout import switches_on
    cluster = _cluster(compiled)
    return switches_on(cluster) if cluster else []


def _cluster(compiled: Compiled) -> dict | None:
    """The layout of a --cluster compile, when its stats carry the prediction (a re-simulated plan's do not)."""
    if compiled.plan is None or "iteration_s" not in compiled.stats:
        return None
    return compiled.plan.meta.get("cluster")


def _ticks(makespan: float, count: int = 8) -> list[tuple[float, str]]:
    """About `count` round time ticks as (x in the chart, label)."""
    if makespan <= 0:
        return [(LEFT, "0")]
    raw = makespan / count
    step = next(b * 10 ** e for e in range(-3, 9) for b in (1, 2, 5) if b * 10 ** e >= raw)
    n = int(makespan // step)
    return [(LEFT + k * step * CHART_W / makespan, f"{k * step:g}") for k in range(n + 1)]
