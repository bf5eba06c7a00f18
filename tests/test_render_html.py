"""render/html.py: the report's memory chart on the timeline's time axis (one time at one x in both
SVGs, as a browser shows them in their one box), its level ticks in units, overlapped pairs and stuck
ops in the report's timeline.

The x a browser gives a point of an inline SVG is (its x in the viewBox) * (width / viewBox width) from
the SVG's left edge; both SVGs are blocks in one scrolling box, so their left edges coincide.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, compile_library
from schedc.cli import main
from schedc.render import render, render_file
from schedc.render.timed import memory_over_time

SVG = "{http://www.w3.org/2000/svg}"


def svgs(html: str) -> tuple[ET.Element, ET.Element]:
    """The timeline's and the memory chart's <svg> elements, in the one scrolling box."""
    box = re.search(r'<div class="scroll timeline">(.*?)</div>', html, re.S).group(1)
    found = re.findall(r"<svg.*?</svg>", box, re.S)
    assert len(found) == 2
    return ET.fromstring(found[0]), ET.fromstring(found[1])


def scale(root: ET.Element) -> float:
    """CSS points per viewBox unit."""
    return float(root.get("width").removesuffix("pt")) / float(root.get("viewBox").split()[2])


def timeline_extent(root: ET.Element, node: str) -> tuple[float, float]:
    """Where (in points from the SVG's left edge) Graphviz draws a node's polygon, left and right."""
    shift = float(re.search(r"translate\(([-\d.]+)", root.find(f"{SVG}g").get("transform")).group(1))
    for g in root.iter(f"{SVG}g"):
        title = g.find(f"{SVG}title")
        if title is not None and title.text == node:
            xs = [float(p.split(",")[0]) for p in g.find(f".//{SVG}polygon").get("points").split()]
            return (shift + min(xs)) * scale(root), (shift + max(xs)) * scale(root)
    raise AssertionError(f"no node {node}")


def timeline_x(root: ET.Element, node: str) -> float:
    """A node's centre (exact: Graphviz draws a node's size to whole points, its position as given)."""
    left, right = timeline_extent(root, node)
    return (left + right) / 2


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 4, "m": 8}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 64})])
def test_the_memory_chart_shares_the_timelines_time_axis(name, params):
    """Tick k of the chart's time axis sits where the timeline's tick k does, with the same label, and
    device 0's curve first rises where its first forward's box starts."""
    compiled = compile_library(name, **params)
    html = render(compiled, "html", "x.html").decode()
    timeline, chart = svgs(html)
    assert scale(timeline) == pytest.approx(scale(chart))
    ticks = [line for line in chart.iter(f"{SVG}line") if line.get("class") == "tick"]
    labels = [t.text for t in chart.find(f"{SVG}g[@class='axis']").iter(f"{SVG}text")]
    assert len(ticks) >= 4
    for k, line in enumerate(ticks):
        assert float(line.get("x1")) * scale(chart) == pytest.approx(timeline_x(timeline, f"tick{k}"), abs=0.05)
        label = next(g for g in timeline.iter(f"{SVG}g") if g.find(f"{SVG}title") is not None
                     and g.find(f"{SVG}title").text == f"tick{k}_label").find(f".//{SVG}text").text
        assert labels[k] == label
    curve = chart.find(f"{SVG}g[@data-device='0']/{SVG}polyline").get("points").split()
    points = [tuple(map(float, p.split(","))) for p in curve]
    rise = next(x for (x, y), (_, y_next) in zip(points, points[1:]) if y_next < y)
    assert rise * scale(chart) == pytest.approx(timeline_extent(timeline, "d0_0")[0], abs=0.6)  # sizes: whole points


def test_the_memory_charts_levels_have_ticks_in_units():
    """1F1B p=4 m=8: device d holds at most min(p - d, m) activations; the level ticks are round
    numbers up to the top (4), the top one with its unit, and the curve's highest point on device d
    is at the y of level min(p - d, m) on those ticks."""
    p, m = 4, 8
    html = render(compile_library("1f1b", p=p, m=m), "html", "x.html").decode()
    _, chart = svgs(html)
    for d in range(p):
        panel = chart.find(f"{SVG}g[@data-device='{d}']")
        labels = [t for t in panel.iter(f"{SVG}text") if t.get("class") == "ylabel"]
        values = [float(t.text.split()[0]) for t in labels]
        assert values == [0, 2, 4] and labels[-1].text == "4 units"
        ys = [float(t.get("y")) - 3 for t in labels]  # a label sits 3 points under its tick
        per_unit = (ys[0] - ys[-1]) / 4
        points = [tuple(map(float, q.split(","))) for q in panel.find(f"{SVG}polyline").get("points").split()]
        top = min(y for _, y in points)
        assert (ys[0] - top) / per_unit == pytest.approx(min(p - d, m))
        peak = next(t for t in panel.iter(f"{SVG}text") if t.get("class") == "peak").text
        assert peak == f"peak {min(p - d, m)}"


def test_the_chart_and_the_timelines_strips_draw_one_series():
    compiled = compile_library("1f1b", p=4, m=8)
    _, chart = svgs(render(compiled, "html", "x.html").decode())
    for d, steps in enumerate(memory_over_time(compiled)):
        points = chart.find(f"{SVG}g[@data-device='{d}']/{SVG}polyline").get("points").split()
        assert len(points) == 2 * len(steps) + 2  # a start, two per step, an end


def test_the_reports_timeline_shows_pairs_and_stuck_ops(tmp_path):
    pairs = render(compile_library("dualpipev", p=4, m=8), "html", "x.html").decode()
    timeline, _ = svgs(pairs)
    assert sum("overlap" in g.get("class", "").split() for g in timeline.iter(f"{SVG}g")) == 25
    assert "F &amp; B overlapped" in pairs
    out = tmp_path / "dl.html"
    render_file(str(FIXTURES / "broken" / "deadlock.sched"), out=str(out))
    html = out.read_text()
    timeline, _ = svgs(html)
    assert [g.find(f"{SVG}title").text for g in timeline.iter(f"{SVG}g") if "stuck" in g.get("class", "").split()] \
        == ["stuck0", "stuck1"]
    assert "INVALID" in html and "this schedule fails its checks" in html


def test_under_a_cluster_the_chart_is_in_gib(tmp_path):
    """The chart's levels are the strips' (GiB of activations under --cluster): 1F1B's device d keeps
    min(p - d, m) microbatches, so its peak over device 3's is min(p - d, m)."""
    from conftest import ROOT
    out = tmp_path / "c.html"
    model = str(ROOT / "schedc" / "models" / "gpt-1.7b.toml")
    assert CliRunner().invoke(main, ["render", "1f1b", "-D", "p=4", "-D", "m=8", "--model", model,
                                     "--cluster", "dgx-a100-80gb", "-o", str(out)]).exit_code == 0
    _, chart = svgs(out.read_text())
    peaks = []
    for d in range(4):
        panel = chart.find(f"{SVG}g[@data-device='{d}']")
        labels = [t.text for t in panel.iter(f"{SVG}text") if t.get("class") == "ylabel"]
        assert labels[-1].endswith(" GiB") and labels[0] == "0"
        peaks.append(float(next(t for t in panel.iter(f"{SVG}text") if t.get("class") == "peak").text.split()[1]))
    assert [round(peak / peaks[3], 1) for peak in peaks] == [4, 3, 2, 1]
    assert "GiB of activations alive per device" in out.read_text()


@pytest.mark.parametrize("top", [1e-9, 0.5, 1, 4, 6.6, 11, 1e15, 3e30, 1e300])
def test_level_ticks_are_round_and_two_to_four_at_any_magnitude(top):
    from schedc.render.html import _level_step
    step = _level_step(top)
    mantissa = f"{step:e}".split("e")[0]
    assert float(mantissa) in (1, 2, 5) and 1 <= top / step <= 3 + 1e-9


@pytest.mark.slow
def test_in_headless_chromium_time_0_is_one_column_in_both_charts(tmp_path):
    """The browser's pixels: the leftmost blue of device 0's row (F(0,0), from time 0) and of the last
    device's memory panel (its curve, from time 0 at level 0) are the same column (a pixel apart at
    most); the report loads without console errors."""
    from test_render import console_errors, decode_png, near, screenshot
    report = tmp_path / "report.html"
    render_file("1f1b", ("p=4", "m=8"), out=str(report))
    png, log = screenshot(report.as_uri(), tmp_path, (1400, 1400))
    assert console_errors(log) == []
    width, height, channels, pixels = decode_png(png)

    def blue_columns(y: int) -> list[int]:
        return [x for x in range(width)
                if near(tuple(pixels[(y * width + x) * channels:(y * width + x) * channels + 3]), "#3b6fb6", 30)]

    rows = [y for y in range(height) if blue_columns(y)]
    assert rows and rows[-1] - rows[0] > 300  # the timeline's rows above, the chart's panels below
    first_row = [y for y in rows if y - rows[0] < 10]
    last_panel = [y for y in rows if rows[-1] - y < 3]
    timeline_left = min(min(blue_columns(y)) for y in first_row)
    chart_left = min(min(blue_columns(y)) for y in last_panel)
    assert abs(timeline_left - chart_left) <= 1


def test_the_memory_chart_draws_offloaded_activations_on_the_host():
    """offload_1f1b (p = 4, m = 8): a 1F1B device d keeps p - d forwards in flight and, offloading all but
    the one its next backward reloads, holds up to p - 1 - d on the host; the last device offloads
    nothing. Each offloading device's panel has a host curve whose top is that level; 1F1B has none."""
    p = 4
    html = render(compile_library("offload_1f1b", p=p, m=8), "html", "x.html").decode()
    _, chart = svgs(html)
    for panel in chart.iter(f"{SVG}g"):
        if panel.get("class") != "device":
            continue
        d = int(panel.get("data-device"))
        host = [line for line in panel.iter(f"{SVG}polyline") if line.get("class") == "host"]
        device_curve = [line for line in panel.iter(f"{SVG}polyline") if line.get("class") != "host"][0]
        if d == p - 1:
            assert host == []
            continue
        ys = [float(point.split(",")[1]) for point in host[0].get("points").split()]
        device_ys = [float(point.split(",")[1]) for point in device_curve.get("points").split()]
        assert min(ys) < max(ys) == device_ys[0]  # from the panel's zero up to its peak
        label = [t.text for t in panel.iter(f"{SVG}text") if t.get("class") == "host-peak"]
        assert label == [f"host peak {p - 1 - d}"]
    assert "offloaded to host memory" in html
    _, plain = svgs(render(compile_library("1f1b", p=p, m=8), "html", "x.html").decode())
    assert not [line for line in plain.iter(f"{SVG}polyline") if line.get("class") == "host"]
