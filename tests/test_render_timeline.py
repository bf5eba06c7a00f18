"""render/timeline.py, strips.py, canvas.py: memory strips under the rows on the timeline's time axis,
overlapped pairs drawn as one unit (and one Chrome trace event), a deadlock's stuck ops marked, the
width of the picture (--width, the default cap).

Reference values are re-derived here: 1F1B's live activations, DualPipeV's count of overlapped pairs
from its program, a deadlock's stuck ops from a replay of the built-in dependencies written afresh.
"""
from __future__ import annotations

import json
import re
import struct
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, compile_library
from schedc.cli import main
from schedc.passes.compiled import Compiled
from schedc.ops import OpKind
from schedc.render import render
from schedc.render.canvas import DEFAULT_WIDTH, least_width

SVG = "{http://www.w3.org/2000/svg}"


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def nodes(svg: bytes) -> dict[str, ET.Element]:
    """Graphviz's node and edge groups by their DOT name (the <title>)."""
    return {g.find(f"{SVG}title").text: g for g in ET.fromstring(svg).iter(f"{SVG}g")
            if g.find(f"{SVG}title") is not None}


def with_class(svg: bytes, cls: str) -> list[ET.Element]:
    return [g for g in ET.fromstring(svg).iter(f"{SVG}g") if cls in g.get("class", "").split()]


def box(group: ET.Element) -> tuple[float, float, float, float]:
    """x0, x1, y0, y1 of a node's polygon."""
    points = [tuple(map(float, p.split(","))) for p in group.find(f".//{SVG}polygon").get("points").split()]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return min(xs), max(xs), min(ys), max(ys)


def path_vertices(groups: list[ET.Element]) -> list[tuple[float, float]]:
    """The distinct successive points of edges' paths, in order (a polyline drawn as straight cubic
    pieces, in edges that meet end to end)."""
    numbers = [float(n) for g in groups for n in re.findall(r"-?[\d.]+", g.find(f".//{SVG}path").get("d"))]
    out: list[tuple[float, float]] = []
    for point in zip(numbers[::2], numbers[1::2]):
        if not out or abs(point[0] - out[-1][0]) > 1e-6 or abs(point[1] - out[-1][1]) > 1e-6:
            out.append(point)
    return out


def time_axis(by_name: dict[str, ET.Element]) -> tuple[float, float]:
    """The x of time 0 and the points per unit, from the centres of the axis' first two ticks
    (Graphviz draws a node's size to whole points, its centre exactly) and the second one's label."""
    (a0, a1, _, _), (b0, b1, _, _) = box(by_name["tick0"]), box(by_name["tick1"])
    step = float(by_name["tick1_label"].find(f".//{SVG}text").text)
    return (a0 + a1) / 2, ((b0 + b1) - (a0 + a1)) / 2 / step


# -- memory strips ---------------------------------------------------------------------------------------

def live_activation_steps(compiled: Compiled, d: int) -> list[tuple[float, float]]:
    """Device d's live activations as step vertices (time, level), from the simulated times: a forward
    adds one at its start, its backward removes it at its end; the level changes once at an instant
    where a backward ends and a forward starts (the step plot shows the level from then on)."""
    timing, order = compiled.timing, compiled.schedule.orders[d]
    change: dict[float, int] = {}
    for op in order:
        if op.kind == OpKind.F:
            change[timing.start[op]] = change.get(timing.start[op], 0) + 1
        elif op.kind == OpKind.B:
            change[timing.end[op]] = change.get(timing.end[op], 0) - 1
    vertices, level = [(0.0, 0.0)], 0
    for time in sorted(change):
        vertices += [(time, level), (time, level + change[time])]
        level += change[time]
    vertices.append((timing.makespan, level))
    out = []
    for v in vertices:
        if not out or v != out[-1]:
            out.append(v)
    return out


# the peak rule of each case, from its paper: 1F1B's device d keeps min(p - d, m) forwards in flight (its
# warm-up plus one); GPipe runs all m forwards before any backward
PEAKS = {"1f1b": lambda p, m, d: min(p - d, m), "gpipe": lambda p, m, d: m}


@pytest.mark.parametrize("name,p,m", [("1f1b", 4, 8), ("gpipe", 2, 128)])  # 128: strips of several pieces
def test_memory_strips_step_with_the_simulators_events_on_the_timelines_axis(name, p, m):
    """Device d's live activations rise one per forward to the case's peak and fall back to 0; the
    strip's vertices are exactly these steps at the simulated times, on the x scale of the rows above
    (F(0,0)'s box starts where device 0's strip first rises), on one vertical scale for all devices."""
    compiled = compile_library(name, p=p, m=m)
    svg = render(compiled, "svg", "x.svg")
    by_name = nodes(svg)
    ax0, per_unit = time_axis(by_name)
    strips: dict[int, list[ET.Element]] = {}
    for g in with_class(svg, "memory"):
        strips.setdefault(int(re.search(r"\bd(\d+)\b", g.get("class")).group(1)), []).append(g)
    assert sorted(strips) == list(range(p))
    scales = []
    for d in range(p):
        vertices = path_vertices(strips[d])
        base, peak = vertices[0][1], PEAKS[name](p, m, d)
        scales.append((base - min(y for _, y in vertices)) / peak)  # points per unit on this strip
        drawn = [((x - ax0) / per_unit, (base - y) / scales[-1]) for x, y in vertices]
        expected = live_activation_steps(compiled, d)
        assert max(level for _, level in expected) == peak  # the paper's rule, against the simulation
        assert len(drawn) == len(expected)
        close = 0.02 + 0.011 / scales[-1], 0.02 + 0.011 / per_unit  # coordinates are written to 0.01 points
        for (t, level), (t_ref, level_ref) in zip(drawn, expected):
            assert t == pytest.approx(t_ref, abs=close[1]) and level == pytest.approx(level_ref, abs=close[0])
        assert "peak " + str(peak) in by_name[f"mem{d}_note"].find(f".//{SVG}text").text
        assert (len(strips[d]) > 1) == (len(expected) > 200)  # a long strip is drawn in pieces
    assert max(scales) == pytest.approx(min(scales), rel=1e-3)
    first_forward = box(by_name["d0_0"])[0]
    vertices = path_vertices(strips[0])
    rise = next(x for (x, y), (_, y_next) in zip(vertices, vertices[1:]) if y_next < y)
    assert rise == pytest.approx(first_forward, abs=0.6)  # Graphviz draws a node's size to whole points


def test_memory_strips_draw_the_declared_limit(tmp_path):
    out = tmp_path / "m.svg"
    assert run("render", str(FIXTURES / "broken" / "memory.sched"), "-o", str(out)).exit_code == 1
    svg = out.read_bytes()
    limits, strips = with_class(svg, "limit"), [[g] for g in with_class(svg, "memory")]
    assert len(limits) == len(strips) == 2
    by_name = nodes(svg)
    for d in range(2):
        text = by_name[f"mem{d}_note"].find(f".//{SVG}text").text
        assert re.fullmatch(r"peak \d+ units \(limit 2\)", text), text
        vertices = path_vertices(strips[d])
        base, top = vertices[0][1], min(y for _, y in vertices)
        peak = int(text.split()[1])
        _, _, y0, y1 = box(limits[d])
        assert (y0 + y1) / 2 == pytest.approx(base - (base - top) * 2 / peak, abs=0.3)  # at level 2


def test_under_a_cluster_the_strips_are_in_gib_of_activations(tmp_path):
    """gpt-1.7b (24 layers, hidden 2304, sequence 2048) under full recomputation keeps each layer's
    16-bit input, 2·s·b·h bytes, per microbatch in flight (Korthikanti et al. 2022); 1F1B's device d
    has min(p - d, m) in flight, each of its 24 / p layers."""
    from conftest import ROOT
    p, m, layers, hidden, seq, b = 4, 8, 24, 2304, 2048, 1
    out = tmp_path / "c.svg"
    assert run("render", "1f1b", "-D", f"p={p}", "-D", f"m={m}", "--model", str(ROOT / "schedc" / "models" / "gpt-1.7b.toml"),
               "--cluster", "dgx-a100-80gb", "--recompute", "full", "--microbatch-size", str(b), "-o", str(out)).exit_code == 0
    by_name = nodes(out.read_bytes())
    for d in range(p):
        note = by_name[f"mem{d}_note"].find(f".//{SVG}text").text
        shown = float(re.fullmatch(r"peak ([\d.]+) GiB", note).group(1))
        assert shown == pytest.approx(min(p - d, m) * layers // p * 2 * seq * b * hidden / 2**30, rel=5e-3)
    assert "memory over time (GiB of activations alive)" in out.read_text()


# -- overlapped pairs ------------------------------------------------------------------------------------

def dualpipev_pairs(p: int, m: int) -> list[int]:
    """Overlapped F & B ops per device in DualPipeV's program (schedules/dualpipev.sched): one F[0] & B[1]
    before the steady state except on the last device, one F[1] & B[0], two per steady round
    (m - 2p + d rounds), one in each of the p - d - 1 rounds after it."""
    return [(0 if d == p - 1 else 1) + 1 + 2 * (m - 2 * p + d) + (p - d - 1) for d in range(p)]


def test_overlapped_pairs_are_one_box_with_the_forward_above_the_backward():
    p, m = 4, 8
    compiled = compile_library("dualpipev", p=p, m=m)
    svg = render(compiled, "svg", "x.svg")
    outlines = with_class(svg, "overlap")
    per_device = [0] * p
    halves = [(box(g), next(c for c in g.get("class").split() if c in ("F", "B", "I")), g)
              for g in with_class(svg, "half")]
    assert len(halves) == 2 * len(outlines) == 2 * sum(dualpipev_pairs(p, m))
    for outline in outlines:
        x0, x1, y0, y1 = box(outline)
        inside = [(b, kind, g) for b, kind, g in halves
                  if b[0] >= x0 - 0.01 and b[1] <= x1 + 0.01 and b[2] >= y0 - 0.01 and b[3] <= y1 + 0.01]
        assert [kind for _, kind, _ in sorted(inside, key=lambda h: h[0][2])] == ["F", "B"]
        top, bottom = sorted(inside, key=lambda h: h[0][2])
        assert top[0][3] <= bottom[0][2] + 0.01  # stacked, not side by side
        assert top[0][1] - top[0][0] > 0.8 * (x1 - x0)  # each half spans the pair's time
        labels = [g.find(f".//{SVG}text").text for _, _, g in (top, bottom)]
        assert labels[0].startswith("F") and labels[1].startswith("B")
        stroke = outline.find(f".//{SVG}polygon")
        assert stroke.get("fill") == "none" and float(stroke.get("stroke-width")) > 1
        per_device[int(outline.find(f"{SVG}title").text.split("_")[0][1:])] += 1
    assert per_device == dualpipev_pairs(p, m)
    assert svg == render(compiled, "svg", "x.svg")  # deterministic
    assert "F &amp; B overlapped" in svg.decode() or "F & B overlapped" in svg.decode()


def test_a_pair_is_one_event_of_the_chrome_trace_naming_both_halves():
    p, m = 4, 8
    compiled = compile_library("dualpipev", p=p, m=m)
    events = [e for e in json.loads(render(compiled, "json", "x.json"))["traceEvents"] if e["ph"] == "X"]
    pairs = [e for e in events if e["args"]["op"] == "OVERLAP_F_B"]
    assert len(events) == compiled.schedule.op_count() - len(pairs)
    assert [sum(e["pid"] == d for e in pairs) for d in range(p)] == dualpipev_pairs(p, m)
    timing = compiled.timing
    for first, second in compiled.schedule.fused:
        name = f"{first.kind}{first.stage}.{first.mb} & {second.kind}{second.stage}.{second.mb}"
        event = next(e for e in pairs if e["name"] == name and e["pid"] == first.device)
        assert event["args"]["halves"] == [{"op": h.kind, "stage": h.stage, "mb": h.mb} for h in (first, second)]
        assert event["ts"] == pytest.approx(timing.start[first] * 1000)
        assert event["dur"] == pytest.approx((timing.end[second] - timing.start[first]) * 1000)


@pytest.mark.parametrize("old_names", [False, True])  # older traces name the halves `F0.3`
def test_a_measured_traces_pairs_are_drawn_as_one_box_too(tmp_path, old_names):
    p, m = 4, 8
    compiled = compile_library("dualpipev", p=p, m=m)
    trace = json.loads(render(compiled, "json", "x.json"))
    for event in trace["traceEvents"]:
        halves = event.get("args", {}).get("halves")
        if halves and old_names:
            event["args"]["halves"] = [f"{h['op']}{h['stage']}.{h['mb']}" for h in halves]
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    out = tmp_path / "m.svg"
    result = run("render", "dualpipev", "-D", f"p={p}", "-D", f"m={m}", "--measured", str(tmp_path / "trace.json"),
                 "-o", str(out))
    assert result.exit_code == 0, result.output
    svg = out.read_bytes()
    measured = [g for g in with_class(svg, "half") if "measured" in g.get("class").split()]
    pairs = sum(dualpipev_pairs(p, m))
    assert len(measured) == 2 * pairs and len(with_class(svg, "overlap")) == 2 * pairs  # measured and simulated
    assert sorted({next(c for c in g.get("class").split() if c in ("F", "B")) for g in measured}) == ["B", "F"]
    assert "busy 48.00 ms" in svg.decode()  # a pair's time counted once: the simulated busy 48 at 1 ms a unit


# -- a deadlock's stuck ops ------------------------------------------------------------------------------

def stuck_heads(schedule) -> dict[int, tuple[str, int, int]]:
    """Replay the device orders under the built-in dependencies (F(s,i) after F(s-1,i); B(s,i) after
    B(s+1,i) and F(s,i)), each device as far as it can: the (kind, stage, mb) where each device stops."""
    orders = [[(op.kind, op.stage, op.mb) for op in order] for order in schedule.orders]
    last = schedule.stages - 1
    done, position = set(), [0] * len(orders)

    def ready(kind, s, i):
        if kind == "F":
            return s == 0 or ("F", s - 1, i) in done
        return ("F", s, i) in done and (s == last or ("B", s + 1, i) in done)

    moved = True
    while moved:
        moved = False
        for d, order in enumerate(orders):
            while position[d] < len(order) and ready(*order[position[d]]):
                done.add(order[position[d]])
                position[d] += 1
                moved = True
    return {d: order[position[d]] for d, order in enumerate(orders) if position[d] < len(order)}


@pytest.mark.parametrize("fixture", ["deadlock.sched", "deadlock_sized.sched"])
def test_stuck_ops_are_outlined_in_red_where_their_devices_stop(tmp_path, fixture):
    out = tmp_path / "dl.svg"
    result = run("render", str(FIXTURES / "broken" / fixture), "-o", str(out))
    assert result.exit_code == 1 and "deadlock" in result.output
    svg = out.read_bytes()
    from schedc.driver import compile_file
    compiled = compile_file(str(FIXTURES / "broken" / fixture))
    expected = stuck_heads(compiled.schedule)
    assert expected  # the fixture deadlocks
    stuck = with_class(svg, "stuck")
    by_name = nodes(svg)
    drawn = {}
    for g in stuck:
        d = int(g.find(f"{SVG}title").text.removeprefix("stuck"))
        polygon = g.find(f".//{SVG}polygon")
        assert polygon.get("stroke") == "#d62728" and float(polygon.get("stroke-width")) >= 2
        label = g.find(f".//{SVG}text").text
        assert label.startswith("!")
        drawn[d] = label
        timed = [name for name in by_name if re.fullmatch(rf"d{d}_\d+", name)]
        start = max((box(by_name[n])[1] for n in timed), default=box(by_name["axis"])[0])
        assert box(g)[0] == pytest.approx(start, abs=0.05)  # right after the device's last op that ran
    assert drawn == {d: f"!{kind}{mb}" for d, (kind, _, mb) in expected.items()}
    text = svg.decode()
    assert "INVALID" in text and "stuck: where the deadlock stops a device" in text


def test_a_deadlocks_diagnostic_carries_the_stuck_and_awaited_ops():
    from schedc.driver import compile_file
    compiled = compile_file(str(FIXTURES / "broken" / "deadlock_sized.sched"))
    ops = {(d, n): role for diag in compiled.diagnostics for d, n, role in diag.ops}
    orders = compiled.schedule.orders
    named = {(str(orders[d][n]), role) for (d, n), role in ops.items()}
    assert named == {("B(0,0)", "stuck"), ("F(1,1)", "stuck"), ("F(0,1)", "awaited"), ("B(1,0)", "awaited")}


# -- width -----------------------------------------------------------------------------------------------

def png_width(data: bytes) -> int:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])[0]


def test_a_long_schedule_is_scaled_to_the_default_cap_or_to_the_width_asked(tmp_path):
    args = ("render", "interleaved_1f1b", "-D", "p=4", "-D", "v=2", "-D", "m=64")
    widths = {}
    for option in ((), ("--width", "1000"), ("--width", "0")):
        out = tmp_path / f"t{len(widths)}.png"
        assert run(*args, *option, "-o", str(out)).exit_code == 0
        widths[option] = png_width(out.read_bytes())
    assert DEFAULT_WIDTH - 100 < widths[()] <= DEFAULT_WIDTH
    assert 900 < widths[("--width", "1000")] <= 1000
    assert widths[("--width", "0")] > 4000  # the natural scale: 16 points per forward
    assert "wider than 2400 pixels is scaled down to 2400" in " ".join(run("render", "--help").output.split())
    again = tmp_path / "again.png"
    assert run(*args, "-o", str(again)).exit_code == 0
    assert again.read_bytes() == (tmp_path / "t0.png").read_bytes()


def test_a_short_schedule_keeps_its_natural_width_and_stretches_to_a_width_asked(tmp_path):
    compiled = compile_library("1f1b", p=4, m=8)
    natural = png_width(render(compiled, "png", "x.png"))
    assert natural < DEFAULT_WIDTH and natural == png_width(render(compiled, "png", "x.png", width=0))
    assert 2000 < png_width(render(compiled, "png", "x.png", width=2200)) <= 2200


@pytest.mark.parametrize("args,message", [
    (("--width", "500"), f"--width 500 is too narrow for a timeline: give at least {least_width()} pixels"),
    (("--width", "-3"), "--width -3 is too narrow"),
    (("--width", "900", "--dag"), "--width draws on the timeline"),
    (("--width", "1000000000"), "--width asks for 1,000,000,000 pixels, past the limit of 24,000"),
    (("--width", "99999999999999999999999"), "past the limit of 24,000"),
])
def test_a_width_that_cannot_be_drawn_is_refused(tmp_path, args, message):
    out = tmp_path / "x.svg"
    result = run("render", "1f1b", *args, "-o", str(out))
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not out.exists()
    result = run("render", "1f1b", "--width", "900", "-o", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "--width draws on the timeline; a Chrome trace (.json)" in result.output
