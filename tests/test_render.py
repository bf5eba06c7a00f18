"""render: every output format well-formed, deterministic (golden DOT files), the HTML report in a real
browser, the Chrome trace aligned with the runtime's, plans and measured traces as inputs.

Golden files: tests/golden/*.dot; rewrite them with `pytest tests/test_render.py --regen-golden`.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, compile_library
from schedc.cli import main
from schedc.diagnostics import SchedError
from schedc.render import render, render_file
from schedc.render.dag import dag_dot
from schedc.render.timed import memory_over_time
from schedc.render.timed import timed_ops
from schedc.render.timeline import timeline_dot

GOLDEN = Path(__file__).resolve().parent / "golden"
SVG = "{http://www.w3.org/2000/svg}"
CASES = [("1f1b", {"p": 4, "m": 8}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}),
         ("chimera", {"p": 4, "m": 8}), ("gpipe", {"p": 3, "m": 5}), ("pipefisher", {"p": 4, "m": 4})]
# Graphviz's dot and Chromium are installed by scripts/setup.sh (and so by .ci/run): these tests need them.


def defines(params: dict) -> tuple[str, ...]:
    return tuple(f"{k}={v}" for k, v in params.items())


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def op_count(compiled) -> int:
    return sum(len(row) for row in timed_ops(compiled))


def svg_shapes(data: bytes, cls: str) -> list[ET.Element]:
    root = ET.fromstring(data)
    return [g for g in root.iter(f"{SVG}g") if cls in g.get("class", "").split()]


# -- formats ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,params", CASES)
def test_svg_parses_with_one_shape_per_op(name, params):
    compiled = compile_library(name, **params)
    shapes = svg_shapes(render(compiled, "svg", "x.svg"), "op")
    assert len(shapes) == op_count(compiled)
    assert all(g.find(f".//{SVG}polygon") is not None for g in shapes)
    kinds = {g.get("class").split()[-1] for g in shapes}
    assert kinds == {t.op.kind for row in timed_ops(compiled) for t in row}


def test_png_has_header_and_a_plausible_size():
    data = render(compile_library("1f1b", p=4, m=8), "png", "x.png")
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert 800 < width < 4000 and 200 < height < 1000


@pytest.mark.parametrize("scale", [0.001, 1000.0])
def test_costs_in_other_units_draw_at_the_size_of_forward_units(tmp_path, scale):
    """Costs in milliseconds or seconds (a profile) draw as wide as the same schedule in forward units:
    the time scale is set per forward, not per cost unit."""
    widths = []
    for factor in (1.0, scale):
        costs = tmp_path / f"costs{factor}.json"
        costs.write_text(json.dumps({"F": 1.0 * factor, "B": 2.0 * factor}))
        out = tmp_path / f"timeline{factor}.png"
        render_file("1f1b", ("p=4", "m=8"), str(costs), out=str(out))
        widths.append(struct.unpack(">II", out.read_bytes()[16:24])[0])
    assert abs(widths[1] - widths[0]) <= 0.02 * widths[0]


def test_a_forward_far_cheaper_than_the_rest_keeps_the_picture_bounded(tmp_path):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"F": 0.001, "B": 1.0}))
    out = tmp_path / "timeline.svg"
    render_file("1f1b", ("p=4", "m=64"), str(costs), out=str(out))
    width = float(ET.parse(out).getroot().get("width").removesuffix("pt"))
    assert 1000 < width < 13000


def test_pdf_has_header_and_trailer():
    data = render(compile_library("chimera", p=4, m=8), "pdf", "x.pdf")
    assert data.startswith(b"%PDF-") and b"%%EOF" in data[-64:]


def test_comms_draw_one_arrow_per_message():
    compiled = compile_library("chimera", p=4, m=8)
    edges = [g for g in svg_shapes(render(compiled, "svg", "x.svg", comms=True), "edge")
             if "memory" not in g.get("class").split()]  # the memory strips' step plots are edges too
    assert len(edges) == 8 * 3 * 2  # every microbatch crosses 3 device boundaries forward and backward


@pytest.mark.parametrize("name,params", CASES)
def test_chrome_trace_has_one_event_per_op_on_its_rank(name, params):
    compiled = compile_library(name, **params)
    trace = json.loads(render(compiled, "json", "x.json"))
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == op_count(compiled)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(compiled.schedule.devices)}
    by_key = {(e["pid"], e["args"]["op"], e["args"]["stage"], e["args"]["mb"], e["args"]["step"],
               e["args"].get("part", 0)): e for e in complete}
    for rank, row in enumerate(timed_ops(compiled)):
        for t in row:
            event = by_key[(rank, t.op.kind, t.op.stage, t.op.mb, t.step, t.op.part)]
            assert event["ts"] == pytest.approx(t.start * 1000) and event["dur"] == pytest.approx(t.op.cost * 1000)


def test_trace_names_events_as_the_runtime_does():
    from schedc.plan.trace import event_name
    trace = json.loads(render(compile_library("1f1b", p=2, m=2), "json", "x.json"))
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            assert e["name"] == event_name(e["args"]["op"], e["args"]["stage"], e["args"]["mb"])


# -- determinism and golden files ------------------------------------------------------------------------

@pytest.mark.parametrize("golden,make", [
    ("timeline_1f1b_p3_m4.dot", lambda: timeline_dot(compile_library("1f1b", p=3, m=4))),
    ("timeline_chimera_p2_m2_comms.dot", lambda: timeline_dot(compile_library("chimera", p=2, m=2), comms=True)),
    ("dag_1f1b_p2_m2.dot", lambda: dag_dot(compile_library("1f1b", p=2, m=2).schedule)),
])
def test_dot_matches_golden(golden, make, regen_golden):
    text = make()
    assert text == make(), "rendering must be deterministic"
    path = GOLDEN / golden
    if regen_golden:
        path.write_text(text)
    assert path.read_text() == text, f"{golden} changed; check the drawing, then run pytest --regen-golden"


def test_html_report_is_deterministic():
    compiled = compile_library("interleaved_1f1b", p=4, v=2, m=8)
    assert render(compiled, "html", "x.html") == render(compiled, "html", "x.html")


# -- HTML report -----------------------------------------------------------------------------------------

def test_html_report_is_self_contained_with_all_parts(tmp_path):
    out = tmp_path / "report.html"
    render_file("chimera", ("p=4", "m=8"), None, 0.0, str(out))
    html = out.read_text()
    for absent in ("<script", "<link", "src=", "@import", "url("):
        assert absent not in html
    assert html.count("<svg") == 2  # the timeline and the memory chart
    assert html.count('class="device"') == 4 and html.count("<polyline") == 4
    assert "replicate down, up" in html  # the source
    assert "<td>m</td><td>8</td>" in html  # the params


def test_html_report_shows_diagnostics_and_the_memory_limit(tmp_path):
    out = tmp_path / "report.html"
    result = run("render", str(FIXTURES / "broken" / "memory.sched"), "-o", str(out))
    assert result.exit_code == 1  # drawn, but the schedule fails its checks
    html = out.read_text()
    assert 'class="diagnostics"' in html and "over the limit 2" in html
    assert html.count('class="limit"') == 2


@pytest.mark.parametrize("name,params", CASES[:4])
def test_memory_over_time_peaks_as_the_simulation(name, params):
    compiled = compile_library(name, **params)
    peaks = [max(level for _, level in steps) for steps in memory_over_time(compiled)]
    assert peaks == list(compiled.stats["peak_memory"])
    assert all(steps[-1][1] == 0 for steps in memory_over_time(compiled))


# -- in a real browser -----------------------------------------------------------------------------------

def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise AssertionError("no headless Chromium: install the Debian package chromium (scripts/setup.sh does)")


def screenshot(url: str, tmp_path: Path, size=(1200, 900)) -> tuple[bytes, str]:
    """Open url in headless Chromium; return the screenshot's bytes and the browser's log."""
    shot = tmp_path / "shot.png"
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
               f"--screenshot={shot}", f"--window-size={size[0]},{size[1]}", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert shot.exists(), done.stderr[-2000:]
    return shot.read_bytes(), done.stdout + done.stderr


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """A minimal PNG reader (8-bit RGB or RGBA, no interlace): width, height, channels, raw pixels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), width * channels
    out, prev = bytearray(), bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return width, height, channels, bytes(out)


def near(pixel: tuple[int, ...], colour: str, tolerance: int = 12) -> bool:
    return all(abs(p - int(colour[k:k + 2], 16)) <= tolerance for p, k in zip(pixel, (1, 3, 5)))


@pytest.mark.slow
def test_the_console_check_catches_errors(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>console.error('boom'); notDefined();</script>")
    _, log = screenshot(page.as_uri(), tmp_path, (400, 300))
    assert any("Uncaught" in line for line in console_errors(log))


@pytest.mark.slow
def test_html_report_in_headless_chromium(tmp_path):
    report = tmp_path / "report.html"
    render_file("chimera", ("p=4", "m=8"), None, 0.0, str(report))
    png, log = screenshot(report.as_uri(), tmp_path)
    assert console_errors(log) == []
    width, height, channels, pixels = decode_png(png)
    assert (width, height) == (1200, 900)
    step = channels * 7  # sample every 7th pixel
    sample = [tuple(pixels[i:i + 3]) for i in range(0, len(pixels), step)]
    assert sum(p != (255, 255, 255) for p in sample) > len(sample) // 20, "the screenshot is blank"
    from schedc.render.style import KIND_COLOURS
    assert sum(near(p, KIND_COLOURS["F"]) for p in sample) > 50, "no forward boxes on screen"
    assert sum(near(p, KIND_COLOURS["B"]) for p in sample) > 50, "no backward boxes on screen"


# -- inputs: plans, measured traces ----------------------------------------------------------------------

def test_plan_input_draws_the_same_timeline(tmp_path):
    assert run("compile", "interleaved_1f1b", "-o", str(tmp_path)).exit_code == 0
    from schedc.driver import load_input
    from_plan = timeline_dot(load_input(str(tmp_path / "plan.json"), (), None, 0.0))
    from_source = timeline_dot(compile_library("interleaved_1f1b"))
    def body(text):
        return [line for line in text.splitlines() if not line.startswith("graph [label=")]
    assert body(from_plan) == body(from_source)  # all but the title, whose params plan.json sorts


def test_measured_trace_is_drawn_above_the_simulation(tmp_path):
    trace = tmp_path / "trace.json"
    assert run("render", "1f1b", "-o", str(trace)).exit_code == 0
    data = json.loads(trace.read_text())
    for e in data["traceEvents"]:
        if e["ph"] == "X":  # "measured" at 2.5 ms per unit
            e["ts"], e["dur"] = e["ts"] * 2.5, e["dur"] * 2.5
    trace.write_text(json.dumps(data))
    out = tmp_path / "cmp.svg"
    assert run("render", "1f1b", "--measured", str(trace), "-o", str(out)).exit_code == 0
    svg = out.read_bytes()
    measured, simulated = svg_shapes(svg, "measured"), svg_shapes(svg, "op")
    assert len(measured) == len(simulated) == 64
    def top(g):
        return min(float(v.split(",")[1]) for v in g.find(f".//{SVG}polygon").get("points").split())
    assert max(map(top, measured)) < min(map(top, simulated))  # measured rows above (SVG y grows down)
    assert b"1 unit = 2.5 ms" in svg


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 2, "m": 2}), ("dualpipev", {"p": 2, "m": 4})])
def test_the_runtimes_trace_is_read_as_measured(tmp_path, name, params):
    """Every compute op of the last step is drawn, an OVERLAP_F_B's two halves each in its one event."""
    from schedc.runtime.execution import trace as runtime_trace
    compiled = compile_library(name, **params)
    events, clock = [], [0, 0]
    for step in (0, 1):  # two steps: the last one is drawn
        for rank, steps in enumerate(compiled.plan.ranks):
            for instr in steps[0]:
                length = 3_000_000 if instr.op in ("F", "B", "I", "W", "OVERLAP_F_B") else 100_000  # ns
                events.append(runtime_trace.record(rank, step, instr, clock[rank], clock[rank] + length, 50_000))
                clock[rank] += length
    trace = tmp_path / "trace.json"
    runtime_trace.write_json(trace, runtime_trace.chrome_trace(events, compiled.plan))
    out = tmp_path / "cmp.svg"
    defines = [arg for k, v in params.items() for arg in ("-D", f"{k}={v}")]
    assert run("render", name, *defines, "--measured", str(trace), "-o", str(out)).exit_code == 0
    svg = out.read_bytes()
    assert len(svg_shapes(svg, "measured")) == compiled.schedule.op_count() and b"(step 1)" in svg


def test_torch_csv_input(tmp_path):
    csv = tmp_path / "order.csv"
    assert run("export", "interleaved_1f1b", "-o", str(csv)).exit_code == 0
    assert run("render", str(csv), "-o", str(tmp_path / "t.json")).exit_code == 0
    trace = json.loads((tmp_path / "t.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 128


# -- errors ----------------------------------------------------------------------------------------------

def test_dag_of_a_large_schedule_is_refused_with_a_hint(tmp_path):
    result = CliRunner().invoke(main, ["render", "1f1b", "-D", "p=16", "-D", "m=64", "--dag",
                                       "-o", str(tmp_path / "g.svg")])
    assert result.exit_code == 2
    assert "too many to draw" in result.output and "-D p=4" in result.output


@pytest.mark.parametrize("ext", [".svg", ".html", ".png"])
def test_a_timeline_past_the_graphviz_limit_is_refused_before_graphviz_runs(tmp_path, monkeypatch, ext):
    """At the limit (200,000 ops) an SVG is 44 MB and takes 10-12 s of CPU; here the limit is lowered to 100
    and 1F1B p=4, m=16 has 128 ops. The .json trace and the .dot text are still written."""
    import schedc.render
    monkeypatch.setattr(schedc.render, "MAX_TIMELINE_OPS", 100)
    monkeypatch.setattr(shutil, "which", lambda name: pytest.fail("Graphviz started"))
    out = tmp_path / ("t" + ext)
    result = CliRunner().invoke(main, ["render", "1f1b", "-D", "p=4", "-D", "m=16", "-o", str(out)])
    assert result.exit_code == 2 and not out.exists(), result.output
    assert f"{out}: error: the timeline of one_f_one_b has 128 ops, too many to draw as {ext} (limit 100)" \
        in result.output and "-o OUT.json" in result.output
    for ok in ("t.json", "t.dot"):
        result = CliRunner().invoke(main, ["render", "1f1b", "-D", "p=4", "-D", "m=16", "-o", str(tmp_path / ok)])
        assert result.exit_code == 0 and (tmp_path / ok).exists(), result.output


def test_unknown_extension_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["render", "1f1b", "-o", str(tmp_path / "x.txt")])
    assert result.exit_code == 2 and ".svg" in result.output and "Traceback" not in result.output


def test_missing_dot_names_the_package(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SchedError) as info:
        render(compile_library("1f1b", p=2, m=2), "svg", "x.svg")
    assert info.value.exit_code == 2 and "apt-get install graphviz" in info.value.render()


def test_missing_dot_still_writes_dot_text(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    result = CliRunner().invoke(main, ["render", "1f1b", "-o", str(tmp_path / "t.dot")])
    assert result.exit_code == 0 and (tmp_path / "t.dot").read_text().startswith("digraph timeline {")


@pytest.mark.parametrize("name,params", [("pipefisher", {"p": 8, "m": 8}), ("pipefisher_1f1b", {})])
def test_memory_over_time_of_a_filled_cycle_counts_kept_gradients_and_factors(name, params):
    """Over the cycle, the chart reaches the stats' peak; factors stay held at the end (persistent)."""
    compiled = compile_library(name, **params)
    series = memory_over_time(compiled)
    assert [max(level for _, level in steps) for steps in series] == pytest.approx(compiled.stats["peak_memory"])
    assert all(steps[-1][1] > 0 for steps in series)


@pytest.mark.slow
def test_a_dag_with_too_many_edges_is_refused_before_graphviz_runs(tmp_path):
    from click.testing import CliRunner
    from schedc.cli import main
    result = CliRunner().invoke(main, ["render", "pipefisher", "-D", "p=4", "-D", "m=16", "--dag", "-o",
                                       str(tmp_path / "x.svg")])
    assert result.exit_code == 2 and "has 2,036 edges among its 552 ops" in result.output, result.output
    assert "limit 1,500" in result.output and not (tmp_path / "x.svg").exists()
    text = CliRunner().invoke(main, ["render", "pipefisher", "-D", "p=4", "-D", "m=16", "--dag", "-o",
                                     str(tmp_path / "x.dot")])  # no layout: the DOT text is written
    assert text.exit_code == 0 and (tmp_path / "x.dot").read_text().startswith("digraph dependencies {")


def test_measured_costs_for_a_plan_give_every_kind_it_runs(tmp_path):
    """A plan re-simulated under measured costs: a costs file for ZB-H1's plan that gives B, not I and
    W, is refused at its keys (the plan's own unit costs are not mixed with milliseconds), exit 2."""
    out = tmp_path / "zb"
    assert CliRunner().invoke(main, ["compile", "zb_h1", "-D", "p=2", "-D", "m=4", "-o", str(out)]).exit_code == 0
    costs = tmp_path / "costs.json"
    costs.write_text('{"F": 1, "B": 2}')
    result = CliRunner().invoke(main, ["render", str(out / "plan.json"), "--costs", str(costs), "-o",
                                       str(tmp_path / "x.svg")])
    assert result.exit_code == 2, result.output
    assert f"{costs}:1:10: error: measured cost of 'B': this schedule splits its backward" in result.output
    assert f"{costs}:1:1: error: no measured cost for I and W" in result.output and not (tmp_path / "x.svg").exists()
    costs.write_text('{"F": 1, "I": 1, "W": 1}')
    assert CliRunner().invoke(main, ["render", str(out / "plan.json"), "--costs", str(costs), "-o",
                                     str(tmp_path / "x.svg")]).exit_code == 0


def test_a_schedule_that_fails_its_checks_is_drawn_without_per_device_stats(tmp_path):
    """A deadlock's 'idle' is negative and its makespan no schedule's: the rows carry no busy, idle or
    peak, and the Chrome trace marks it invalid and carries no stats."""
    broken = str(FIXTURES / "broken" / "deadlock.sched")
    result = CliRunner().invoke(main, ["render", broken, "-o", str(tmp_path / "dl.dot")])
    assert result.exit_code == 1 and "deadlock" in result.output
    dot = (tmp_path / "dl.dot").read_text()
    assert "INVALID: the schedule fails its checks" in dot
    assert not re.search(r'label="[^"]*(busy|idle|peak act)', dot)
    assert re.search(r'label="busy 6 units +idle 3 units +peak 2 act', timeline_dot(compile_library("1f1b", p=2, m=2)))
    assert CliRunner().invoke(main, ["render", broken, "-o", str(tmp_path / "dl.json")]).exit_code == 1
    other = json.loads((tmp_path / "dl.json").read_text())["otherData"]
    assert other["valid"] is False and other["stats"] is None
    good = json.loads(render(compile_library("1f1b", p=2, m=2), "json", "x.json"))["otherData"]
    assert good["valid"] is True and good["stats"]["makespan"] == 9


def test_under_a_cluster_the_trace_and_the_axis_are_in_seconds(tmp_path):
    """Costs from --cluster are seconds: the trace's µs are 10^6 per second (not 10^3, which drew a
    1.04 s step as 1.04 ms) and the timeline's axis says so."""
    from conftest import ROOT
    cluster = ["--model", str(ROOT / "schedc" / "models" / "gpt-1.7b.toml"), "--cluster", "dgx-a100-80gb"]
    assert run("render", "1f1b", "-D", "p=2", *cluster, "-o", str(tmp_path / "c.json")).exit_code == 0
    trace = json.loads((tmp_path / "c.json").read_text())
    end = max(e["ts"] + e["dur"] for e in trace["traceEvents"] if e["ph"] == "X")
    stats = trace["otherData"]["stats"]
    assert 0.5 < stats["makespan"] < 5 and end == pytest.approx(stats["makespan"] * 1e6)
    assert trace["otherData"]["time_scale"] == "costs in seconds (--cluster)"
    assert run("render", "1f1b", "-D", "p=2", *cluster, "-o", str(tmp_path / "c.dot")).exit_code == 0
    assert "time (s)" in (tmp_path / "c.dot").read_text()
    # each row's note: seconds with their unit, 4 significant digits, as the stats give them
    notes = re.findall(r'label="busy (\S+) s +idle (\S+) s +peak (\S+) act', (tmp_path / "c.dot").read_text())
    assert [(float(b), float(i)) for b, i, _ in notes] == [(float(f"{b:.4g}"), float(f"{i:.4g}"))
                                                          for b, i in zip(stats["busy"], stats["idle"])]
    assert all(len(x.replace(".", "").lstrip("0")) <= 4 for b, i, _ in notes for x in (b, i))
    assert "time (cost units)" in timeline_dot(compile_library("1f1b", p=2, m=2))
    # the plan compiled so says its unit: its trace and axis are in seconds too
    assert run("compile", "1f1b", "-D", "p=2", *cluster, "-o", str(tmp_path / "plan")).exit_code == 0
    plan = str(tmp_path / "plan" / "plan.json")
    assert run("render", plan, "-o", str(tmp_path / "p.json")).exit_code == 0
    assert json.loads((tmp_path / "p.json").read_text())["otherData"]["time_scale"] == "costs in seconds (--cluster)"
    assert run("render", plan, "-o", str(tmp_path / "p.dot")).exit_code == 0
    assert "time (s)" in (tmp_path / "p.dot").read_text()


def test_back_to_back_ops_of_a_trace_touch_and_never_overlap(tmp_path):
    """ts and dur rounded apart made an op's end land 1 ns past the next one's start (302 of 1,280
    PipeFisher events with profiled costs); dur is the rounded end minus the rounded start."""
    from conftest import ROOT
    profile = ROOT / "tests" / "data" / "bert-large_time_memory_v100.csv"
    assert run("render", "pipefisher", "-D", "p=4", "-D", "m=4", "--profile", str(profile), "--microbatch-size", "32",
               "-o", str(tmp_path / "pf.json")).exit_code == 0
    tracks: dict = {}
    for e in json.loads((tmp_path / "pf.json").read_text())["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    touching = 0
    for events in tracks.values():
        events.sort()
        for (_, end), (start, _) in zip(events, events[1:]):
            assert end <= start
            touching += end == start
    assert touching > 0  # the case that overlapped


def test_a_measured_trace_of_another_shape_is_refused_naming_both(tmp_path):
    trace = tmp_path / "p2.json"
    assert run("render", "1f1b", "-D", "p=2", "-D", "m=4", "-o", str(trace)).exit_code == 0
    for args, seen in ((["-D", "p=4"], "4 devices, 4 stages and 8 microbatches"),
                       (["-D", "p=2", "-D", "m=8"], "2 devices, 2 stages and 8 microbatches")):
        result = CliRunner().invoke(main, ["render", "1f1b", *args, "--measured", str(trace),
                                           "-o", str(tmp_path / "mm.svg")])
        assert result.exit_code == 2, result.output
        assert (f"{trace}: error: the measured trace does not fit one_f_one_b" in result.output
                and "it has 2 ranks, stages 0-1 and microbatches 0-3, the schedule " + seen in result.output
                and "(measured on schedule 'one_f_one_b')" in result.output), result.output
        assert not (tmp_path / "mm.svg").exists() and "Traceback" not in result.output


def test_a_measured_trace_of_another_schedule_or_plan_of_the_same_shape_is_drawn_with_a_warning(tmp_path):
    from schedc.runtime.execution import trace as runtime_trace
    trace = tmp_path / "p2.json"
    assert run("render", "1f1b", "-D", "p=2", "-D", "m=4", "-o", str(trace)).exit_code == 0
    other = CliRunner().invoke(main, ["render", "gpipe", "-D", "p=2", "-D", "m=4", "--measured", str(trace),
                                      "-o", str(tmp_path / "g.svg")])
    assert other.exit_code == 0 and (tmp_path / "g.svg").exists()
    assert f"warning: the measured trace {trace} is of schedule 'one_f_one_b', drawn above 'gpipe'" in other.output
    assert run("compile", "1f1b", "-D", "p=2", "-D", "m=4", "-o", str(tmp_path / "plan")).exit_code == 0
    compiled = compile_library("1f1b", p=2, m=4)
    events = [runtime_trace.record(rank, 0, instr, 10 * k, 10 * k + 5, 0)
              for rank, steps in enumerate(compiled.plan.ranks) for k, instr in enumerate(steps[0])]
    runtime_trace.write_json(trace, runtime_trace.chrome_trace(events, replace(compiled.plan, hash="ab" * 32)))
    plan = str(tmp_path / "plan" / "plan.json")
    stale = CliRunner().invoke(main, ["render", plan, "--measured", str(trace), "-o", str(tmp_path / "p.svg")])
    assert stale.exit_code == 0 and f"the measured trace {trace} is of plan abababababab, drawn above plan" in stale.output
    own = json.loads(Path(plan).read_text())["hash"]
    runtime_trace.write_json(trace, runtime_trace.chrome_trace(events, replace(compiled.plan, hash=own)))
    same = CliRunner().invoke(main, ["render", plan, "--measured", str(trace), "-o", str(tmp_path / "p.svg")])
    assert same.exit_code == 0 and "warning" not in same.output, same.output


@pytest.mark.parametrize("name,params", [("interleaved_1f1b", dict(p=2, v=3, m=4)), ("chimera", dict(p=4, m=4)),
                                         ("1f1b", dict(p=2, m=2))])
def test_the_legend_gives_each_shade_the_colour_of_its_first_stage(name, params):
    """The plain form: for each shade, the first (pipeline, stage) in sorted order drawn in it, found by
    scanning every one (the palette finds them in one pass: a CSV of 100,000 stages on one rank took
    minutes in this scan)."""
    from schedc.render.style import palette
    colours = palette(compile_library(name, **params).schedule)
    expected = []
    for kind in colours.kinds:
        shades = sorted(set(colours.variant.values())) if len(colours.variant_names) > 1 else [0]
        for shade in shades:
            first = next((ps for ps, v in sorted(colours.variant.items()) if v == shade), (0, 0))
            expected.append(colours.fill(kind, *first))
    assert [fill for fill, _ in colours.legend()] == expected
    assert len(set(expected)) == len(expected) > 1


@pytest.mark.parametrize("unit", [1e-13, 1e-6, 0.4, 25.0, 40.0, 3.3e7])
def test_the_axis_ticks_are_40_to_200_points_apart_at_any_scale(unit):
    """A forward of 1e15 units (an edited plan) made the axis count ticks from a step of at most 5e6:
    10^8 of them, a render that never ended (found by the fuzzer)."""
    from schedc.render.canvas import tick_step as _tick_step
    assert 40 <= _tick_step(unit) * unit < 200


def test_html_report_gives_the_steady_state_bubble_per_device(tmp_path):
    """1F1B with F = 1, B = 2: device d idles (p - 1 - d)(F + B) between its first and last op (the
    warm-up and cool-down wait of the closed form), the report's `inside` column and its headline."""
    out = tmp_path / "report.html"
    render_file("1f1b", ("p=4", "m=8"), None, 0.0, str(out))
    html = out.read_text()
    rows = re.findall(r"<tr><td>(\d+)</td><td>\d+</td><td>[\d.]+</td><td>[\d.]+</td><td>([\d.]+)</td>", html)
    assert [(int(d), float(inside)) for d, inside in rows] == [(d, (4 - 1 - d) * 3.0) for d in range(4)]
    assert "steady-state bubble: at most <b>9</b> idle between" in html


@pytest.mark.parametrize("args,message", [
    (["--comms", "-o", "{d}/t.json"], "--comms draws on the timeline; a Chrome trace (.json) has no place for it"),
    (["--comms", "--dag", "-o", "{d}/g.dot"], "--comms draws on the timeline; the dependency graph has no place"),
])
def test_an_option_the_output_cannot_show_is_refused(tmp_path, args, message):
    """--comms (and --measured) would be silently dropped from a Chrome trace or the dependency graph."""
    result = CliRunner().invoke(main, ["render", "1f1b", *[a.replace("{d}", str(tmp_path)) for a in args]])
    assert result.exit_code == 2 and message in result.output
    assert not list(tmp_path.iterdir())


def test_html_report_of_a_cluster_render_carries_the_prediction(tmp_path):
    """--cluster: the report gives the layout, the iteration time, TFLOP/s, GiB and the breakdown that
    simulate prints, and its memory chart's time is in seconds."""
    model = str(Path(__file__).resolve().parent.parent / "schedc" / "models" / "gpt-1.7b.toml")
    args = ["1f1b", "-D", "p=2", "--model", model, "--cluster", "dgx-a100-80gb", "--dp", "4", "--global-batch", "64"]
    out = tmp_path / "cl.html"
    assert CliRunner().invoke(main, ["render", *args, "-o", str(out)]).exit_code == 0
    predicted = json.loads(CliRunner().invoke(main, ["simulate", *args, "--json"]).output)
    html = out.read_text()
    assert "<h2>Prediction</h2>" in html and "t=1, p=2, d=4" in html and "time in seconds" in html
    assert f"iteration <b>{predicted['iteration_s']:.4f} s</b>" in html
    assert f"memory <b>{predicted['memory_gib_per_gpu']:.2f} GiB</b>" in html
    assert all(f"<td>{v:.4f}</td>" in html for v in predicted["breakdown"].values())
