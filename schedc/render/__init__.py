"""Drawing schedules: `schedc render FILE -o OUT`, the format chosen by OUT's extension.

    .svg .png .pdf   timeline (or, with --dag, the dependency graph) through Graphviz
    .dot             the DOT text of the same, without running Graphviz
    .html            a self-contained report: timeline, per-device stats, memory over time, source
    .json            a Chrome trace (chrome://tracing, Perfetto): 1 cost unit = 1 ms (seconds under --cluster)

Every renderer is a deterministic function from the compiled schedule to text; only `dot` runs outside.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..budget import RENDER_OPS
from ..passes.compiled import Compiled
from ..diagnostics import USAGE, SchedError, Source, error, warning
from ..outputs import STDOUT, prepare_directory, write_output
from .dot import FORMATS, run_dot
from ..text import agree, listed

if TYPE_CHECKING:
    from .measured import MeasuredRun

EXTENSIONS = (*FORMATS, "dot", "html", "json")
# Timelines drawn through Graphviz (.svg .png .pdf, and the .html report's): at 196,608 ops the SVG is
# 48 MB and the command takes about 25 s of CPU on a shared core; past this, .json or .dot text only.
MAX_TIMELINE_OPS = 200_000
# Any render: a Chrome trace of 200,000 ops takes 5 s and 26 MB; a schedule to render is refused past
# this when it is elaborated, before the work grows (budget.RENDER_OPS; a compile's own limit is
# budget.COMPILE_OPS, --max-ops).
MAX_RENDER_OPS = RENDER_OPS.limit


def render_file(file: str, defines=(), costs: str | None = None, latency: float | None = None, out: str = "out.svg",
                dag: bool = False, comms: bool = False, measured: str | None = None,
                profile: tuple[str, int | None] | None = None, cluster=None, addons: tuple[str, ...] = (),
                width: int | None = None) -> Compiled:
    """Compile (or load) FILE and write OUT; returns what was drawn, with the compiler's diagnostics
    (a schedule that fails its checks is drawn anyway, as far as it was simulated). profile: (CSV,
    microbatch size) of a PipeFisher profile row to take the costs from, instead of `costs`. cluster: a
    predict.ClusterRequest: costs (seconds) and message times from a model on a cluster. addons: the
    `--with` add-ons, as compile_file takes them. width: the timeline's width in PNG pixels (0: its
    natural scale; None: fitted to canvas.DEFAULT_WIDTH when wider)."""
    fmt = Path(out).suffix.lower().lstrip(".")
    if out == STDOUT:
        raise _usage("render picks its format by OUT's extension: give -o a file such as x.svg or x.json, not -",
                     out)
    if fmt not in EXTENSIONS:
        raise _usage(f"cannot tell the format from {out!r}: use one of "
                     + ", ".join("." + e for e in EXTENSIONS), out)
    if dag and fmt not in (*FORMATS, "dot"):
        raise _usage(f"--dag draws through Graphviz: write .svg, .png, .pdf or .dot, not .{fmt}", out)
    ignored = [flag for flag, given in (("--comms", comms), ("--measured", measured is not None),
                                        ("--width", width is not None)) if given]
    if ignored and (dag or fmt == "json"):
        what = "the dependency graph" if dag else "a Chrome trace (.json)"
        raise _usage(f"{listed(ignored, ' and ')} {agree(len(ignored), 'draws', 'draw')} on the timeline; {what} has no place "
                     f"for {'it' if len(ignored) == 1 else 'them'}", out)
    _check_width(width, out)
    prepare_directory(Path(out).parent)  # before the compile and Graphviz, not after them
    from ..driver import load_input
    if cluster is not None:
        from ..driver import parse_defines
        from ..driver.cluster import compile_on_cluster
        on = compile_on_cluster(file, parse_defines(defines), cluster, addons=addons)
        compiled, byte_deltas = on.compiled, _byte_deltas(on)
    else:
        compiled = load_input(file, defines, costs, latency, profile, addons, max_ops=MAX_RENDER_OPS,
                              max_ops_why=RENDER_OPS.why)
        byte_deltas = None
    run = None
    if measured is not None:
        from .measured import load_measured
        run = load_measured(measured, compiled.schedule, compiled.plan.hash if compiled.plan else "")
        compiled = replace(compiled, diagnostics=[*compiled.diagnostics, *map(warning, run.warnings)])
    data = render(compiled, fmt, out, dag=dag, comms=comms, measured=run, width=width, byte_deltas=byte_deltas)
    write_output(out, data)
    return compiled


def render(compiled: Compiled, fmt: str, out: str, dag: bool = False, comms: bool = False,
           measured: MeasuredRun | None = None, width: int | None = None,
           byte_deltas: dict[str, tuple[float, ...]] | None = None) -> bytes:
    """The bytes of OUT in format `fmt` for a compiled schedule (a measured run drawn above it; the
    timeline `width` PNG pixels wide, as render_file takes it; memory in GiB given byte_deltas, what
    each kind allocates or frees per stage in bytes)."""
    run = measured
    if fmt == "json":
        import json
        from .trace import chrome_trace
        return (json.dumps(chrome_trace(compiled), separators=(",", ":")) + "\n").encode()
    if dag:
        from .dag import dag_dot
        text = dag_dot(compiled.schedule, out, layout=fmt != "dot")
        return text.encode() if fmt == "dot" else run_dot(text, fmt, out)
    if fmt != "dot":
        _drawable(compiled, fmt, out)
    from .timeline import time_scale, timeline_dot
    text = timeline_dot(compiled, comms=comms, measured=run, pixels=width, memory=fmt != "html",
                        byte_deltas=byte_deltas)
    if fmt == "dot":
        return text.encode()
    if fmt == "html":
        from .html import report_html
        geo, span = time_scale(compiled, run, width)
        svg = timeline_svg(run_dot(text, "svg", out, fixed_positions=True))
        return report_html(compiled, svg, geo.unit, span, byte_deltas).encode()
    return run_dot(text, fmt, out, fixed_positions=True)


def timeline_svg(svg: bytes) -> str:
    """Graphviz's SVG without its XML prologue, ready to inline in HTML."""
    text = svg.decode()
    return text[text.index("<svg"):]


def _drawable(compiled: Compiled, fmt: str, out: str) -> None:
    """A timeline Graphviz is to draw has at most MAX_TIMELINE_OPS ops."""
    count = compiled.schedule.op_count() + len(compiled.schedule.unplaced)
    if count > MAX_TIMELINE_OPS:
        raise SchedError(error(f"the timeline of {compiled.schedule.name} has {count:,} ops, too many to draw as "
                               f".{fmt} (limit {MAX_TIMELINE_OPS:,})",
                               notes=("write a Chrome trace (-o OUT.json, for Perfetto) or the DOT text (.dot), "
                                      "or draw a smaller instance",)), Source(out, ""), kind=USAGE)


def _byte_deltas(on) -> dict[str, tuple[float, ...]]:
    """What each kind allocates (+) or frees (-) per stage, in bytes, for a compile on a cluster: the
    cost model's activations and deferred weight-gradient inputs (costmodel.bytes.activation_deltas)."""
    from ..costmodel.bytes import activation_deltas
    deltas = activation_deltas(on.setting.model, on.setting.layout, on.compiled.schedule)
    return {kind: tuple(forward + deferred for forward, deferred in stages) for kind, stages in deltas.items()}


def _check_width(width: int | None, out: str) -> None:
    """A --width leaves room for the time span beside the row labels and notes (0: no fitting), and is
    within budget.RENDER_WIDTH."""
    from ..budget import RENDER_WIDTH
    from .canvas import least_width
    if width is not None and (width < 0 or 0 < width < least_width()):
        raise _usage(f"--width {width} is too narrow for a timeline: give at least {least_width()} pixels "
                     "(or 0 for the natural scale)", out)
    refused = RENDER_WIDTH.refusal(width or 0, "--width asks for")
    if refused:
        raise _usage(refused, out)


def _usage(message: str, out: str) -> SchedError:
    return SchedError(error(message), Source(out, ""), kind=USAGE)
