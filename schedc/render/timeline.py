"""The timeline: one row per device, time to the right, each op a box as wide as its simulated time;
a device whose copy engine offloads and reloads activations (O, L) gets a second row for it.

We place every box ourselves (points, y downwards here, flipped for Graphviz) and emit DOT for
`dot -Kneato -n2`, which keeps the positions: a deterministic text, rendered to SVG, PNG or PDF.

    device 0  [0][1][2][3]      [0]   [4]  [1]   ...      busy 24  idle 9  peak 4
    device 1     [0][1][2]   [0]   [3]  [1]  ...
              0        10        20        30
    mem 0     _|‾‾‾‾|_|‾‾|_ ...                            peak 4 units   (memory strips)
              0        10        20        30
              F forward  B backward                     (legend)

Large schedules switch to a compact geometry (shorter rows, a smaller unit, labels only where they fit);
a picture wider than canvas.DEFAULT_WIDTH pixels is fitted to it, or to the width asked for.
An overlapped pair (F & B) is one box with its halves stacked inside; a deadlocked schedule's stuck ops
are drawn where their devices stopped, outlined in red and marked `!`.
"""
from __future__ import annotations

from ..passes.compiled import Compiled
from ..text import listed, plural
from ..ir import Op
from ..ops import COPY, OpKind
from .canvas import (GAP, IDLE, NOTE_W, Canvas, Geometry, esc, esc_keep, geometry, text_width, tick_step,
                     time_width)
from .measured import MeasuredRun
from .strips import memory_strips
from .style import Palette, op_label, palette, text_colour
from .timed import in_seconds, step_starts, stuck_ops, timed_ops

MESSAGE_COLOURS = {OpKind.F: "#1d3c6e", OpKind.B: "#1f5a27", OpKind.I: "#8a4a0c"}
COMPUTE_MESSAGES = frozenset(MESSAGE_COLOURS)
PAIR_OUTLINE, STUCK = "#111111", "#d62728"


def timeline_dot(compiled: Compiled, comms: bool = False, measured: MeasuredRun | None = None,
                 pixels: int | None = None, memory: bool = True, byte_deltas: dict | None = None) -> str:
    """DOT text of the timeline (for `dot -Kneato -n2`): measured rows above simulated ones if given,
    memory strips under them (unless not `memory`: the HTML report draws its own chart). pixels: the
    PNG's width to fit (0: the natural scale, uncapped; None: fitted to canvas.DEFAULT_WIDTH only when
    wider). byte_deltas: each kind's bytes per stage, to draw the strips in GiB (--cluster)."""
    schedule, timing = compiled.schedule, compiled.timing
    geo, span = time_scale(compiled, measured, pixels)
    stuck = _stuck(compiled)
    colours = palette(schedule)
    width = span * geo.unit
    canvas = Canvas(geo, _header(compiled, geo, width))
    if measured is not None:
        _section(canvas, f"measured (step {measured.step}): makespan {measured.makespan_ms:.2f} ms, "
                         f"1 unit = {measured.ms_per_unit:.4g} ms", "m")
        _measured_rows(canvas, measured, colours, width)
        _section(canvas, f"simulated: makespan {timing.makespan:g} units", "s")
    ids, ys = _simulated_rows(canvas, compiled, colours, width)
    _stuck_boxes(canvas, stuck, ys)
    if comms:
        _messages(canvas, compiled, ids)
    if memory:
        memory_strips(canvas, compiled, width, byte_deltas)
    _axis(canvas, width, span, "time (s)" if in_seconds(compiled) else "time (cost units)")
    _legend(canvas, _legend_cells(colours, comms, bool(schedule.fused), bool(stuck)), width)
    canvas.lines.append("}")
    return "\n".join(canvas.lines) + "\n"


def time_scale(compiled: Compiled, measured: MeasuredRun | None = None,
               pixels: int | None = None) -> tuple[Geometry, float]:
    """The timeline's geometry and the time it spans (the makespan, or more where a measured run or a
    stuck op reaches further): point x of the drawing is time x / geometry.unit."""
    span = max([compiled.timing.makespan, *(end for _, _, end in _stuck(compiled).values())])
    if measured is not None:
        span = max(span, measured.makespan_ms / measured.ms_per_unit)
    return _geometry(compiled, span, pixels), span


def _geometry(compiled: Compiled, span: float, pixels: int | None) -> Geometry:
    """The natural geometry, or the one whose time span fits the width (canvas.time_width)."""
    schedule = compiled.schedule
    busiest = max(sum(len(step[d]) for step in schedule.steps) for d in range(schedule.devices))
    forward = min(schedule.costs.get(OpKind.F, ()), default=1.0)
    geo = geometry(span, schedule.op_count(), forward, busiest)
    fit = time_width(span * geo.unit, pixels)
    return geo if fit is None else geometry(span, schedule.op_count(), forward, busiest, fit=fit)


def _header(compiled: Compiled, geo: Geometry, width: float) -> list[str]:
    s, st = compiled.schedule, compiled.stats
    sizes = f"{plural(s.devices, 'device')}, {plural(st['ops'], 'op')}"
    if not compiled.ok:
        errors = sum(d.severity.value == "error" for d in compiled.diagnostics)
        return _graph([f"{s.title}: {sizes}", f"INVALID: the schedule fails its checks ({plural(errors, 'error')});",
                       "no stats, the timeline as far as it was simulated"], geo, width)
    peak = listed([f"{m:g}" for m in st["peak_memory"]], "/")
    lines = [f"{s.title}: {sizes}", f"makespan {st['makespan']:g}", f"bubble {st['bubble']:.4f}",
             f"utilization {st['utilization']:.4f}", f"peak activations per device {peak}"]
    if st.get("cycle_steps", 1) > 1 or "utilization_unfilled" in st:
        lines.append(f"bubbles filled: utilization {st.get('utilization_unfilled', 0):.4f} before, over a cycle "
                     f"of {plural(st.get('cycle_steps', 1), 'step')} of {st['makespan']:g} in all")
    return _graph(lines, geo, width)


def _graph(parts: list[str], geo: Geometry, width: float) -> list[str]:
    """The graph's attributes, its title the first part on a line, the others joined as wide as the drawing."""
    font = 11 if geo.compact else 12
    room = max(width + 2 * GAP + NOTE_W + 64, 300.0)
    lines = [parts[0]]
    for k, part in enumerate(parts[1:]):
        if k and text_width(lines[-1] + "   " + part, font) <= room:
            lines[-1] += "   " + part
        else:
            lines.append(part)
    title = "".join(f"{line}\\l" for line in lines)
    return ["digraph timeline {",
            f'graph [label="{esc_keep(title)}" labelloc=t labeljust=l fontname="Helvetica" '
            f'fontsize={font} bgcolor="white" splines=false outputorder=nodesfirst pad=0.15];',
            f'node [shape=box style="filled" fixedsize=true fontname="Helvetica" fontsize={geo.font:g} '
            f'penwidth={0.3 if geo.compact else 0.6} color="#333333" label=""];',
            'edge [arrowsize=0.35 penwidth=0.6];']


def _section(canvas: Canvas, title: str, name: str) -> None:
    canvas.y += 4
    canvas.text(f"{name}_section", 0, canvas.y + 7, 600, title, canvas.geo.font + 2, "\\l")
    canvas.y += 16


def _simulated_rows(canvas: Canvas, compiled: Compiled, colours: Palette, width: float) -> tuple[dict, list[float]]:
    """The devices' rows; returns the node name of every drawn op, keyed by (step, op), and the rows' y."""
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
            name = ids[(t.step, t.op)] = f"d{d}_{n}"
            if t.op in halves:
                _half(canvas, name, t, d, ys[d], colours, halves[t.op])
                if halves[t.op] == 1:
                    _pair_outline(canvas, name, row[n - 1], t, d, ys[d])
                continue
            fill = colours.fill(t.op.kind, t.op.pipe, t.op.stage)
            label = op_label(t.op)
            x0, x1 = t.start * geo.unit, t.end * geo.unit
            step = f" (step {t.step})" if t.step else ""
            attrs = (f'fillcolor="{fill}" class="op {t.op.kind}"'
                     + (f' label="{label}" fontcolor="{text_colour(fill)}"' if geo.fits(label, x1 - x0) else "")
                     + (f' tooltip="{t.op} on device {d}{step}: {t.start:g} to {t.end:g}"' if not geo.compact else ""))
            canvas.box(name, x0, x1, copy_ys[d] if t.op.kind in COPY else ys[d], geo.box, attrs)
    return ids, ys


def _lanes(canvas: Canvas, compiled: Compiled, rows, width: float) -> tuple[list[float], dict[int, float]]:
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


def _half(canvas: Canvas, name: str, t, d: int, y: float, colours: Palette, k: int) -> None:
    """One half of an overlapped pair: the top (first) or bottom (second) half of the pair's box."""
    op = t.op
    _stacked(canvas, name, t.start * canvas.geo.unit, t.end * canvas.geo.unit, y, k,
             colours.fill(op.kind, op.pipe, op.stage), f"{op.kind}{op_label(op)}", f"op {op.kind} half")


def _stacked(canvas: Canvas, name: str, x0: float, x1: float, y: float, k: int, fill: str, label: str,
             cls: str) -> None:
    """Half k of a pair's box over [x0, x1], inside its outline, labelled with its kind and microbatch."""
    geo = canvas.geo
    h, font = (geo.box - 3) / 2, max(geo.font - 2, 5)  # a point between the halves
    attrs = (f'fillcolor="{fill}" penwidth=0 class="{cls}"'
             + (f' label="{esc(label)}" fontsize={font:g} fontcolor="{text_colour(fill)}"'
                if geo.fits(label, x1 - x0 - 2, font) and h >= font else ""))
    canvas.box(name, x0 + 1, x1 - 1, y - h / 2 - 0.5 if k == 0 else y + h / 2 + 0.5, h, attrs)


def _pair_outline(canvas: Canvas, name: str, first, second, d: int, y: float) -> None:
    """The one box of an overlapped pair, drawn over its halves."""
    unit = canvas.geo.unit
    tip = f"{first.op} & {second.op} on device {d}, overlapped: {first.start:g} to {second.end:g}"
    _outline(canvas, name, min(first.start, second.start) * unit, max(first.end, second.end) * unit, y, tip)


def _outline(canvas: Canvas, name: str, x0: float, x1: float, y: float, tip: str = "") -> None:
    """A pair's outline over [x0, x1]: no fill, thick and dark."""
    geo = canvas.geo
    canvas.box(f"{name}_pair", x0, x1, y, geo.box,
               f'style="solid" color="{PAIR_OUTLINE}" penwidth={1.0 if geo.compact else 1.6} class="overlap"'
               + (f' tooltip="{esc(tip)}"' if tip and not geo.compact else ""))


def _stuck(compiled: Compiled) -> dict[int, tuple[Op, float, float]]:
    """Per device that a deadlock stopped: its stuck op and where it is drawn, from the device's last
    timed op's end for the op's cost (at least a forward's)."""
    rows, orders = timed_ops(compiled), compiled.schedule.orders
    forward = min(compiled.schedule.costs.get(OpKind.F, ()), default=1.0)
    out = {}
    for (d, n), role in sorted(stuck_ops(compiled).items()):
        if role == "stuck" and n < len(orders[d]):
            start = rows[d][-1].end if rows[d] else 0.0
            out[d] = (orders[d][n], start, start + max(orders[d][n].cost, forward))
    return out


def _stuck_boxes(canvas: Canvas, stuck: dict[int, tuple[Op, float, float]], ys: list[float]) -> None:
    geo = canvas.geo
    for d, (op, start, end) in stuck.items():
        wide = (end - start) * geo.unit
        full = f"!{op.kind}{op_label(op)}"
        label, font = next(((text, size) for text, size in ((full, geo.font), (full, geo.font - 2), ("!", geo.font))
                            if geo.fits(text, wide, size)), ("", geo.font))
        canvas.box(f"stuck{d}", start * geo.unit, end * geo.unit, ys[d], geo.box,
                   f'fillcolor="#ffffff" color="{STUCK}" penwidth=2 class="stuck {op.kind}" fontcolor="{STUCK}"'
                   + (f' label="{label}" fontsize={font:g}' if label else "")
                   + f' tooltip="{op} on device {d}: stuck here, the deadlock check stops the device at it"')


def _row_note(compiled: Compiled, d: int) -> str:
    """Device d's busy and idle time (seconds under --cluster, else cost units) and its peak of
    activations beside its row, 4 significant digits; none for a schedule that fails its checks (a
    deadlocked one's 'idle' is negative: its figures are not a schedule's)."""
    if not compiled.ok:
        return ""
    stats, unit = compiled.stats, " s" if in_seconds(compiled) else " units"
    return (f"busy {stats['busy'][d]:.4g}{unit}   idle {stats['idle'][d]:.4g}{unit}   peak "
            f"{stats['peak_memory'][d]:.4g} act.")


def _overlapped(schedule) -> dict[Op, int]:
    """The halves of overlapped pairs: 0 for the first, 1 for the second."""
    return {op: k for pair in schedule.fused for k, op in enumerate(pair)}


def _measured_rows(canvas: Canvas, run: MeasuredRun, colours: Palette, width: float) -> None:
    geo = canvas.geo
    scale = geo.unit / run.ms_per_unit
    for rank, ops in zip(run.ranks, run.ops):
        busy = sum(o.busy for o in ops)
        y = canvas.lane(f"m{rank}", f"rank {rank}", f"busy {busy:.2f} ms", width)
        for n, op in enumerate(ops):
            x0, x1 = op.start * scale, op.end * scale
            fill = colours.fill(op.kind, op.pipe, op.stage or 0)
            label = str(op.mb) if op.mb is not None else op.kind[:3]
            if op.half is not None:  # an OVERLAP_F_B's halves, stacked in one outlined box
                _stacked(canvas, f"m{rank}_{n}", x0, x1, y, op.half, fill, f"{op.kind}{label}",
                         f"measured {esc(op.kind)} half")
                if op.half == 1:
                    _outline(canvas, f"m{rank}_{n}", x0, x1, y)
                continue
            attrs = (f'fillcolor="{fill}" class="measured {esc(op.kind)}"'
                     + (f' label="{label}" fontcolor="{text_colour(fill)}"' if geo.fits(label, x1 - x0) else "")
                     + f' tooltip="{esc(op.kind)}({op.stage},{op.mb}) rank {rank}: {op.start:.3f} to {op.end:.3f} ms"')
            canvas.box(f"m{rank}_{n}", x0, x1, y, geo.box, attrs)


def _messages(canvas: Canvas, compiled: Compiled, ids: dict) -> None:
    """An arrow from the end of each producer to the start of its consumer on another device."""
    deps = compiled.schedule.deps
    for (k, op), name in ids.items():
        if op.kind not in COMPUTE_MESSAGES:
            continue
        for dep in deps.get(op, ()):
            source = ids.get((k, dep))
            if source is not None and dep.device != op.device and dep.kind in COMPUTE_MESSAGES:
                canvas.lines.append(f'{source}:e -> {name}:w [color="{MESSAGE_COLOURS[dep.kind]}"];')


def _axis(canvas: Canvas, width: float, makespan: float, label: str) -> None:
    geo = canvas.geo
    y = canvas.y + 3
    canvas.box("axis", 0, width, y, 0.6, 'fillcolor="#555555" penwidth=0')
    step = tick_step(geo.unit)
    k = 0
    while k * step <= makespan + 1e-9:
        x = k * step * geo.unit
        canvas.box(f"tick{k}", x - 0.3, x + 0.3, y + 2, 4, 'fillcolor="#555555" penwidth=0')
        canvas.text(f"tick{k}_label", x - 20, y + 10, 40, f"{k * step:g}", geo.font + 1, "")
        k += 1
    canvas.text("axis_label", width + GAP, y + 10, NOTE_W, label, geo.font + 1, "\\l")
    canvas.y = y + 20


def _legend_cells(colours: Palette, comms: bool, pairs: bool, stuck: bool) -> list[tuple[str, str, str]]:
    """(fill, outline, text) per legend entry; an empty fill is a line of text alone."""
    cells = [(fill, "", text) for fill, text in colours.legend()] + [(IDLE, "", "idle (bubble)")]
    if pairs:
        cells.append(("#ffffff", PAIR_OUTLINE, "F & B overlapped: one op, first half above"))
    if stuck:
        cells.append(("#ffffff", STUCK, "! stuck: where the deadlock stops a device"))
    if comms:
        cells.append(("", "", "arrows: messages between devices"))
    return cells


def _legend(canvas: Canvas, cells: list[tuple[str, str, str]], width: float) -> None:
    """The legend's entries in rows as wide as the drawing, from its left edge (a wide timeline's
    legend then shows in a window's first view)."""
    font = canvas.geo.font + 1
    room = max(width + GAP + NOTE_W, 300.0)
    rows: list[list[str]] = [[]]
    used = widest = 0.0
    for fill, outline, text in cells:
        wide = (24 if fill else 0) + text_width(text, font) + 8
        if rows[-1] and used + wide > room:
            rows.append([])
            used = 0.0
        rows[-1].append(_legend_cell(fill, outline, text))
        used += wide
        widest = max(widest, used)
    table = "".join(f"<TR><TD ALIGN=\"LEFT\"><TABLE BORDER=\"0\" CELLSPACING=\"3\" CELLPADDING=\"1\"><TR>{''.join(row)}</TR>"
                    "</TABLE></TD></TR>" for row in rows)
    label = f'<<TABLE BORDER="0" CELLSPACING="0" CELLPADDING="0">{table}</TABLE>>'
    canvas.node("legend", widest / 2, canvas.y + 8 * len(rows) + 2,
                f'shape=plaintext style="" fixedsize=false fontsize={font:g} label={label}')


def _legend_cell(fill: str, outline: str, text: str) -> str:
    if not fill:
        return f"<TD>{esc(text)}</TD>"
    border = f' BORDER="2" COLOR="{outline}"' if outline else ""
    return f'<TD BGCOLOR="{fill}"{border} WIDTH="14" HEIGHT="10" FIXEDSIZE="TRUE"></TD><TD>{esc(text)}</TD>'
