"""The timeline: one row per device, time to the right, each op a box as wide as its simulated time;
a device whose copy engine offloads and reloads activations (O, L) gets a second row for it.

We place every box ourselves (points, y downwards here, flipped for Graphviz) and emit DOT for
`dot -Kneato -n2`, which keeps the positions: a deterministic text, rendered to SVG, PNG or PDF.

    device 0  [0][1][2][3]      [0]   [4]  [1]   ...      busy 24  idle 9  peak 4
    device 1     [0][1][2]   [0]   [3]  [1]  ...
              0        10        20        30
              F forward  B backward                     (legend)

Large schedules switch to a compact geometry (shorter rows, a smaller unit, labels only where they fit).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import floor, inf, log10

from ..compiled import Compiled
from ..text import listed, plural
from ..ir import Op
from ..ops import COPY, OpKind
from .measured import MeasuredRun
from .style import Palette, op_label, palette, text_colour
from .timed import in_seconds, step_starts, timed_ops

COMPACT_OPS = 2000          # more ops than this: compact rows
MAX_WIDTH = 12000.0         # points; beyond it the time unit shrinks (down to MIN_UNIT)
UNIT, MIN_UNIT = 16.0, 6.0  # points per forward's duration: wanted, and the least when shrinking
LABEL_W, NOTE_W, GAP = 64.0, 210.0, 8.0
IDLE = "#f0f0f0"
MESSAGE_COLOURS = {OpKind.F: "#1d3c6e", OpKind.B: "#1f5a27", OpKind.I: "#8a4a0c"}
COMPUTE_MESSAGES = frozenset(MESSAGE_COLOURS)


@dataclass(frozen=True, slots=True)
class Geometry:
    unit: float    # points per cost unit
    row: float     # row pitch
    box: float     # box height
    font: float
    compact: bool

    def fits(self, label: str, width: float) -> bool:
        return len(label) * self.font * 0.62 + 2 <= width


def geometry(makespan: float, ops: int, forward: float = 1.0, row_ops: int = 0) -> Geometry:
    """Sizes for a timeline of `ops` ops over `makespan` cost units, where a forward takes `forward`
    units: the scale is set in forwards, so that costs in milliseconds (or any unit) draw like costs
    in forward units. A forward far cheaper than the other ops would then make the picture huge, so it
    is never wider than 2 * MIN_UNIT points per op of the busiest row (`row_ops`), or MAX_WIDTH."""
    forward = forward if 0 < forward < inf else 1.0
    span = makespan / forward  # in forwards
    per_forward = UNIT if span * UNIT <= MAX_WIDTH else max(MIN_UNIT, MAX_WIDTH / max(span, 1.0))
    unit = min(per_forward / forward, max(MAX_WIDTH, 2 * MIN_UNIT * row_ops) / max(makespan, 1e-12))
    per_forward = unit * forward
    if ops > COMPACT_OPS or per_forward < 10:
        return Geometry(unit, 13.0, 11.0, 6.0, True)
    return Geometry(unit, 22.0, 19.0, 9.0, False)


@dataclass
class _Canvas:
    """DOT lines of positioned nodes; `y` grows downwards while building."""

    geo: Geometry
    lines: list[str]
    y: float = 0.0

    def node(self, name: str, x: float, y: float, attrs: str) -> None:
        self.lines.append(f'{name} [pos="{x:.2f},{-y:.2f}" {attrs}];')

    def box(self, name: str, x0: float, x1: float, y: float, h: float, attrs: str) -> None:
        self.node(name, (x0 + x1) / 2, y, f"width={(x1 - x0) / 72:.4f} height={h / 72:.4f} {attrs}")

    def text(self, name: str, x: float, y: float, w: float, label: str, size: float, just: str) -> None:
        self.box(name, x, x + w, y, size + 4, f'shape=plaintext style="" fontsize={size:g} label="{_esc(label)}{just}"')

    def lane(self, name: str, label: str, note: str, width: float) -> float:
        """A row's label, its idle background and its note; returns the row's centre y."""
        y, g = self.y + self.geo.row / 2, self.geo
        self.text(f"{name}_label", -LABEL_W - GAP, y, LABEL_W, label, g.font + 1, "\\r")
        self.box(f"{name}_idle", 0, width, y, g.box, f'fillcolor="{IDLE}" penwidth=0')
        self.text(f"{name}_note", width + GAP, y, NOTE_W, note, g.font + 1, "\\l")
        self.y += g.row
        return y


def timeline_dot(compiled: Compiled, comms: bool = False, measured: MeasuredRun | None = None) -> str:
    """DOT text of the timeline (for `dot -Kneato -n2`): measured rows above simulated ones if given."""
    schedule, timing = compiled.schedule, compiled.timing
    busiest = max(sum(len(step[d]) for step in schedule.steps) for d in range(schedule.devices))
    geo = geometry(timing.makespan, schedule.op_count(), min(schedule.costs.get(OpKind.F, ()), default=1.0), busiest)
    colours = palette(schedule)
    width = timing.makespan * geo.unit
    if measured is not None:
        width = max(width, measured.makespan_ms / measured.ms_per_unit * geo.unit)
    canvas = _Canvas(geo, _header(compiled, geo))
    if measured is not None:
        _section(canvas, f"measured (step {measured.step}): makespan {measured.makespan_ms:.2f} ms, "
                         f"1 unit = {measured.ms_per_unit:.4g} ms", "m")
        _measured_rows(canvas, measured, colours, width)
        _section(canvas, f"simulated: makespan {timing.makespan:g} units", "s")
    ids = _simulated_rows(canvas, compiled, colours, width)
    if comms:
        _messages(canvas, compiled, ids)
    _axis(canvas, width, timing.makespan, "time (s)" if in_seconds(compiled) else "time (cost units)")
    _legend(canvas, colours, width, comms)
    canvas.lines.append("}")
    return "\n".join(canvas.lines) + "\n"


def _header(compiled: Compiled, geo: Geometry) -> list[str]:
    s, st = compiled.schedule, compiled.stats
    peak = listed([f"{m:g}" for m in st["peak_memory"]], "/")
    sizes = f"{plural(s.devices, 'device')}, {plural(st['ops'], 'op')}"
    title = (f"{s.title}: {sizes}\\l"
             f"makespan {st['makespan']:g}   bubble {st['bubble']:.4f}   utilization "
             f"{st['utilization']:.4f}   peak activations per device {peak}\\l")
    if not compiled.ok:
        errors = sum(d.severity.value == "error" for d in compiled.diagnostics)
        return _graph(f"{s.title}: {sizes}\\l"
                      f"INVALID: the schedule fails its checks ({plural(errors, 'error')}); no stats, "
                      "the timeline as far as it was simulated\\l", geo)
    if st.get("cycle_steps", 1) > 1 or "utilization_unfilled" in st:
        title += (f"bubbles filled: utilization {st.get('utilization_unfilled', 0):.4f} before, over a cycle "
                  f"of {plural(st.get('cycle_steps', 1), 'step')} of {st['makespan']:g} in all\\l")
    return _graph(title, geo)


def _graph(title: str, geo: Geometry) -> list[str]:
    return ["digraph timeline {",
            f'graph [label="{_esc_keep(title)}" labelloc=t labeljust=l fontname="Helvetica" '
            f'fontsize={11 if geo.compact else 12} bgcolor="white" splines=false outputorder=nodesfirst pad=0.15];',
            f'node [shape=box style="filled" fixedsize=true fontname="Helvetica" fontsize={geo.font:g} '
            f'penwidth={0.3 if geo.compact else 0.6} color="#333333" label=""];',
            'edge [arrowsize=0.35 penwidth=0.6];']


def _section(canvas: _Canvas, title: str, name: str) -> None:
    canvas.y += 4
    canvas.text(f"{name}_section", 0, canvas.y + 7, 600, title, canvas.geo.font + 2, "\\l")
    canvas.y += 16


def _simulated_rows(canvas: _Canvas, compiled: Compiled, colours: Palette, width: float) -> dict:
    """The devices' rows; returns the node name of every drawn op, keyed by (step, op)."""
    geo = canvas.geo
    ids: dict[tuple[int, Op], str] = {}
    rows = timed_ops(compiled)
    ys, copy_ys = _lanes(canvas, compiled, rows, width)
    for k, x in enumerate(step_starts(compiled), 1):
        top, bottom = ys[0] - geo.row / 2, ys[-1] + geo.row / 2
        canvas.box(f"step{k}", x * geo.unit - 0.4, x * geo.unit + 0.4, (top + bottom) / 2, bottom - top,
                   f'fillcolor="#888888" penwidth=0 tooltip="step {k} of the cycle"')
    halves = _overlapped(compiled.schedule)
    for d, row in enumerate(rows):
        for n, t in enumerate(row):
            op = t.op
            name = ids[(t.step, op)] = f"d{d}_{n}"
            x0, x1 = t.start * geo.unit, t.end * geo.unit
            if op in halves:  # an overlapped pair: one box, its halves in their own colours side by side
                x0, x1 = (x0, (x0 + x1) / 2) if halves[op] == 0 else ((x0 + x1) / 2, x1)
            fill = colours.fill(op.kind, op.pipe, op.stage)
            label = op_label(op)
            step = f" (step {t.step})" if t.step else ""
            attrs = (f'fillcolor="{fill}" class="op {op.kind}"'
                     + (f' label="{label}" fontcolor="{text_colour(fill)}"' if geo.fits(label, x1 - x0) else "")
                     + (f' tooltip="{op} on device {d}{step}: {t.start:g} to {t.end:g}"' if not geo.compact else ""))
            canvas.box(name, x0, x1, copy_ys[d] if op.kind in COPY else ys[d], geo.box, attrs)
    return ids


def _lanes(canvas: _Canvas, compiled: Compiled, rows, width: float) -> tuple[list[float], dict[int, float]]:
    """Each device's row, and below it a row for its copy engine when it runs O and L (`offload F`):
    the rows' centres, and the copy rows' by device."""
    ys, copy_ys = [], {}
    host = compiled.stats.get("peak_host_memory") if compiled.ok else None
    for d, row in enumerate(rows):
        ys.append(canvas.lane(f"d{d}", f"device {d}", _row_note(compiled, d), width))
        if any(t.op.kind in COPY for t in row):
            note = f"host peak {host[d]:g}" if host else ""
            copy_ys[d] = canvas.lane(f"c{d}", f"copy {d}", note, width)
    return ys, copy_ys


def _row_note(compiled: Compiled, d: int) -> str:
    """Device d's busy, idle and peak beside its row; none for a schedule that fails its checks (a
    deadlocked one's 'idle' is negative: its figures are not a schedule's)."""
    if not compiled.ok:
        return ""
    stats = compiled.stats
    return f"busy {stats['busy'][d]:g}   idle {stats['idle'][d]:g}   peak act. {stats['peak_memory'][d]:g}"


def _overlapped(schedule) -> dict[Op, int]:
    """The halves of overlapped pairs: 0 for the first, 1 for the second."""
    return {op: k for pair in schedule.fused for k, op in enumerate(pair)}


def _measured_rows(canvas: _Canvas, run: MeasuredRun, colours: Palette, width: float) -> None:
    geo = canvas.geo
    scale = geo.unit / run.ms_per_unit
    for rank, ops in zip(run.ranks, run.ops):
        busy = sum(o.end - o.start for o in ops)
        y = canvas.lane(f"m{rank}", f"rank {rank}", f"busy {busy:.2f} ms", width)
        for n, op in enumerate(ops):
            x0, x1 = op.start * scale, op.end * scale
            fill = colours.fill(op.kind, op.pipe, op.stage or 0)
            label = str(op.mb) if op.mb is not None else op.kind[:3]
            attrs = (f'fillcolor="{fill}" class="measured {_esc(op.kind)}"'
                     + (f' label="{label}" fontcolor="{text_colour(fill)}"' if geo.fits(label, x1 - x0) else "")
                     + f' tooltip="{_esc(op.kind)}({op.stage},{op.mb}) rank {rank}: {op.start:.3f} to {op.end:.3f} ms"')
            canvas.box(f"m{rank}_{n}", x0, x1, y, geo.box, attrs)


def _messages(canvas: _Canvas, compiled: Compiled, ids: dict) -> None:
    """An arrow from the end of each producer to the start of its consumer on another device."""
    deps = compiled.schedule.deps
    for (k, op), name in ids.items():
        if op.kind not in COMPUTE_MESSAGES:
            continue
        for dep in deps.get(op, ()):
            source = ids.get((k, dep))
            if source is not None and dep.device != op.device and dep.kind in COMPUTE_MESSAGES:
                canvas.lines.append(f'{source}:e -> {name}:w [color="{MESSAGE_COLOURS[dep.kind]}"];')


def _axis(canvas: _Canvas, width: float, makespan: float, label: str) -> None:
    geo = canvas.geo
    y = canvas.y + 3
    canvas.box("axis", 0, width, y, 0.6, 'fillcolor="#555555" penwidth=0')
    step = _tick_step(geo.unit)
    k = 0
    while k * step <= makespan + 1e-9:
        x = k * step * geo.unit
        canvas.box(f"tick{k}", x - 0.3, x + 0.3, y + 2, 4, 'fillcolor="#555555" penwidth=0')
        canvas.text(f"tick{k}_label", x - 20, y + 10, 40, f"{k * step:g}", geo.font + 1, "")
        k += 1
    canvas.text("axis_label", width + GAP, y + 10, NOTE_W, label, geo.font + 1, "\\l")
    canvas.y = y + 20


def _tick_step(unit: float, spacing: float = 40.0) -> float:
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


def _legend(canvas: _Canvas, colours: Palette, width: float, comms: bool) -> None:
    cells = [(fill, text) for fill, text in colours.legend()] + [(IDLE, "idle (bubble)")]
    row = "".join(f'<TD BGCOLOR="{fill}" WIDTH="14" HEIGHT="10" FIXEDSIZE="TRUE"></TD><TD>{_esc(text)}</TD>'
                  for fill, text in cells)
    if comms:
        row += "<TD>arrows: messages between devices</TD>"
    label = f'<<TABLE BORDER="0" CELLSPACING="3" CELLPADDING="1"><TR>{row}</TR></TABLE>>'
    font = canvas.geo.font + 1  # a wide timeline's legend starts at its left edge, in a window's first view
    wide = sum(14 + 10 + 0.6 * font * len(text) for _, text in cells) + (0.6 * font * 36 if comms else 0)
    canvas.node("legend", min(width, wide) / 2, canvas.y + 10,
                f'shape=plaintext style="" fixedsize=false fontsize={font:g} label={label}')


def _esc(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\\", "\\\\").replace('"', '\\"'))


def _esc_keep(text: str) -> str:
    """Escape quotes only, keeping the `\\l` line ends of a label."""
    return text.replace('"', '\\"')
