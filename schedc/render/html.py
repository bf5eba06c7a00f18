"""The HTML report: one self-contained file (no scripts, no network) with the timeline inline as SVG,
per-device stats, memory over time per device (an SVG drawn here), params, diagnostics and the source.

The memory chart (timed.memory_over_time, the series the timeline's strips draw) sits right under the
timeline in one scrolling box, on the timeline's own time axis: the same width and viewBox width, time 0
at the x where the timeline's axis starts (read from Graphviz's SVG), the timeline's points per unit and
its tick step; each panel has y ticks in activation units and the device's peak and limit.

    timeline SVG   width 1679pt  viewBox 0 0 1679 ..  axis from x 82.8 (time 0), 16 points a unit
    memory SVG     width 1679pt  viewBox 0 0 1679 ..  x(t) = 82.8 + 16 t
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from math import floor, log10

from ..passes.compiled import Compiled
from .canvas import tick_step
from .timed import in_seconds, memory_view

PANEL_H, PANEL_GAP, AXIS_H, TOP = 46.0, 10.0, 30.0, 8.0
SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True, slots=True)
class Panel:
    """One device's memory curve, in chart coordinates."""

    device: int
    top: float
    points: str      # SVG polyline points
    peak: float
    peak_y: float    # y of the device's peak level
    limit: float | None    # the device's `limit memory`, if the schedule has one
    limit_y: float | None  # its y
    yticks: tuple[tuple[float, str], ...]  # (y, label) of the level ticks, the top one with its unit
    host_points: str = ""  # with `offload F`: the device's activations on the host, on the same scale
    host_peak: float = 0.0


@dataclass(frozen=True, slots=True)
class Frame:
    """Where the timeline's SVG draws time, in its viewBox: x0 for time 0, `unit` per cost unit up to
    `span`; `width` and `view_w` its size, which the chart takes so both show at one scale."""

    width: str
    view_w: float
    x0: float
    unit: float
    span: float

    def x(self, time: float) -> float:
        return self.x0 + time * self.unit


@lru_cache(maxsize=1)
def _environment():
    import jinja2
    return jinja2.Environment(loader=jinja2.PackageLoader("schedc.render", "templates"),
                              autoescape=jinja2.select_autoescape(["html", "svg", "j2"]),
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def timeline_frame(svg: str, unit: float, span: float) -> Frame:
    """The Frame of Graphviz's SVG of a timeline: its axis node spans the time from 0, centred at
    span / 2 (node coordinates are the graph's, shifted by the translate of its top group; Graphviz
    draws a node's size to whole points, its centre exactly)."""
    root = ET.fromstring(svg)
    view_w = float(root.get("viewBox", "0 0 0 0").split()[2])
    group = root.find(f"{SVG}g")
    found = re.search(r"translate\(([-\d.]+)", group.get("transform", "") if group is not None else "")
    shift = float(found.group(1)) if found else 0.0
    x0 = 0.0
    for node in root.iter(f"{SVG}g"):
        title, shape = node.find(f"{SVG}title"), node.find(f"{SVG}polygon")
        if title is not None and title.text == "axis" and shape is not None:
            xs = [float(point.split(",")[0]) for point in shape.get("points").split()]
            x0 = (min(xs) + max(xs)) / 2 - span * unit / 2
    return Frame(root.get("width", f"{view_w:g}pt"), view_w, shift + x0, unit, span)


def memory_panels(compiled: Compiled, frame: Frame, byte_deltas: dict | None = None) -> tuple[list[Panel], str]:
    """A panel per device, levels on one scale (the highest level or limit of any device at the top),
    and their unit (timed.memory_view)."""
    view = memory_view(compiled, byte_deltas)
    series, limits = view.series, view.limits
    top_level = max([level for steps in (*series, *view.host) for _, level in steps] + list(limits),
                    default=0.0) or 1.0
    step = _level_step(top_level)
    panels = []
    for d, steps in enumerate(series):
        top = TOP + d * (PANEL_H + PANEL_GAP)

        def y(level: float) -> float:
            return top + PANEL_H - level / top_level * (PANEL_H - 4)

        levels = [k * step for k in range(int(top_level / step + 1e-9) + 1)]
        ticks = tuple((y(v), f"{v:g}" + (f" {view.unit}" if k == len(levels) - 1 else "")) for k, v in enumerate(levels))
        peak, limit = max(level for _, level in steps), limits[d] if d < len(limits) else None
        host = view.host[d] if d < len(view.host) else []
        host_peak = max((level for _, level in host), default=0.0)
        panels.append(Panel(d, top, _polyline(steps, frame, y), peak, y(peak), limit,
                            None if limit is None else y(limit), ticks,
                            _polyline(host, frame, y) if host_peak else "", host_peak))
    return panels, view.unit


def _polyline(steps: list[tuple[float, float]], frame: Frame, y: Callable[[float], float]) -> str:
    """SVG polyline points of a (time, level) step curve from time 0 to the frame's span."""
    points, last = [f"{frame.x(0):.2f},{y(0):.2f}"], 0.0
    for time, level in steps:
        points.append(f"{frame.x(time):.2f},{y(last):.2f} {frame.x(time):.2f},{y(level):.2f}")
        last = level
    points.append(f"{frame.x(frame.span):.2f},{y(last):.2f}")
    return " ".join(points)


def _level_step(top: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving 2 to 4 level ticks up to `top` (the power
    found from `top`, which may be 10^-9 or 10^30 units)."""
    exponent = floor(log10(top / 3)) if top > 0 else 0
    for power in (exponent, exponent + 1):
        for base in (1, 2, 5):
            if top / float(f"{base}e{power}") <= 3:
                return float(f"{base}e{power}")
    return float(f"1e{exponent + 2}")


def device_rows(compiled: Compiled) -> list[dict]:
    """Per device: its ops, busy and idle time over the same span, the whole cycle of a filled schedule."""
    st, makespan, steps = compiled.stats, compiled.timing.makespan, compiled.schedule.steps
    return [{"device": d, "ops": sum(len(program[d]) for program in steps), "busy": st["busy"][d],
             "idle": st["idle"][d], "inside": st["idle_inside"][d],
             "utilization": st["busy"][d] / makespan if makespan else 0.0, "peak": st["peak_memory"][d]}
            for d in range(compiled.schedule.devices)]


def report_html(compiled: Compiled, timeline_svg: str, unit: float, span: float,
                byte_deltas: dict | None = None) -> str:
    """The report's HTML text (deterministic for a given compiled schedule and timeline); `unit` and
    `span` are the timeline's points per cost unit and the time it spans (timeline.time_scale);
    byte_deltas: each kind's bytes per stage, to chart GiB (--cluster)."""
    schedule = compiled.schedule
    frame = timeline_frame(timeline_svg, unit, span)
    panels, memory_unit = memory_panels(compiled, frame, byte_deltas)
    env = _environment()
    base = TOP + len(panels) * (PANEL_H + PANEL_GAP)
    chart = env.get_template("memory.svg.j2").render(
        panels=panels, frame=frame, panel_h=PANEL_H, base=base, height=base + AXIS_H, ticks=_ticks(frame),
        time_label="time (s)" if in_seconds(compiled) else "time (cost units)")
    return env.get_template("report.html.j2").render(
        schedule=schedule, stats=compiled.stats, devices=[] if not compiled.ok else device_rows(compiled),
        cycle=len(schedule.steps),
        invalid=not compiled.ok, timeline=timeline_svg,
        memory=chart, diagnostics=[d.format(schedule.source) for d in compiled.diagnostics],
        source=schedule.source.text, params=schedule.params,
        cluster=_cluster(compiled), cluster_flags=_cluster_flags(compiled), seconds=in_seconds(compiled),
        memory_unit=memory_unit)


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


def _ticks(frame: Frame) -> list[tuple[float, str]]:
    """The timeline's time ticks (its step, canvas.tick_step) as (x in the chart, label)."""
    step = tick_step(frame.unit)
    count = int(frame.span / step + 1e-9)
    return [(frame.x(k * step), f"{k * step:g}") for k in range(count + 1)]
