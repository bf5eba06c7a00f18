"""The dependency graph: every op a node (coloured as on the timeline), one cluster per device,
data dependencies as solid arrows and each device's program order as dotted grey arrows; tasks left
for fill_bubbles (no place in the program yet) are drawn dashed, without program order.
Only for small schedules: dot's layout grows much faster than linearly, so large ones are refused.

    cluster device 0:  F(0,0) ..> F(0,1) ..> B(0,0)      F(0,0) -> F(1,0) -> B(1,0) -> B(0,0)
"""
from __future__ import annotations

from ..diagnostics import USAGE, SchedError, Source, error
from ..ir import Op, Schedule
from .style import palette, text_colour

MAX_DAG_OPS = 1024  # dot lays out ~1000 ops in seconds; at 2000 it can take minutes
MAX_DAG_EDGES = 1500  # and its time grows with the edges: 1,208 take 1.7 s, 2,412 (PipeFisher p=4 m=4) 16 s,
#                       9,560 (PipeFisher p=8 m=8) minutes and then "lost edge"


def dag_dot(schedule: Schedule, target: str = "", layout: bool = True) -> str:
    """DOT text (for plain `dot`) of the ops and their dependencies; SchedError beyond MAX_DAG_OPS, and
    beyond MAX_DAG_EDGES when Graphviz is to lay it out (`layout`; not for a .dot file)."""
    count = schedule.op_count() + len(schedule.unplaced)
    if count > MAX_DAG_OPS:
        raise SchedError(error(f"the dependency graph of {schedule.name} has {count} ops, too many to draw "
                               f"(limit {MAX_DAG_OPS})",
                               notes=("draw a smaller instance (e.g. -D p=4 -D m=8), or drop --dag for the "
                                      "timeline, which scales to large schedules",)),
                         Source(target, ""), kind=USAGE)
    ops = [op for order in schedule.orders for op in order] + list(schedule.unplaced)
    placed = set(ops)
    edges = sum(max(0, len(order) - 1) for order in schedule.orders) + sum(
        sum(dep in placed for dep in schedule.deps.get(op, ())) for op in ops)
    if layout and edges > MAX_DAG_EDGES:
        raise SchedError(error(f"the dependency graph of {schedule.name} has {edges:,} edges among its {count} ops, "
                               f"too many for Graphviz to lay out in reasonable time (limit {MAX_DAG_EDGES:,})",
                               notes=("draw a smaller instance (fewer devices, microbatches or task pieces), or "
                                      "drop --dag for the timeline, which scales to large schedules",)),
                         Source(target, ""), kind=USAGE)
    colours = palette(schedule)
    ids: dict[Op, str] = {}
    lines = ["digraph dependencies {",
             'graph [rankdir=LR fontname="Helvetica" fontsize=11 nodesep=0.1 ranksep=0.25 '
             'mclimit=0.1 nslimit=2 nslimit1=2];',  # bounded crossing and placement passes: fast layouts,
             'node [shape=box style="filled,rounded" fontname="Helvetica" fontsize=9 height=0.25 margin="0.04,0.02"];',
             'edge [arrowsize=0.5 penwidth=0.7];']
    for d, order in enumerate(schedule.orders):
        lines.append(f'subgraph cluster_d{d} {{ label="device {d}"; color="#999999";')
        for n, op in enumerate(order):
            ids[op] = f"d{d}_{n}"
            fill = colours.fill(op.kind, op.pipe, op.stage)
            lines.append(f'  {ids[op]} [label="{op}" fillcolor="{fill}" fontcolor="{text_colour(fill)}"];')
        for n, op in enumerate(op for op in schedule.unplaced if op.device == d):
            ids[op] = f"d{d}_u{n}"
            fill = colours.fill(op.kind, op.pipe, op.stage)
            lines.append(f'  {ids[op]} [label="{op}" fillcolor="{fill}" fontcolor="{text_colour(fill)}" '
                         'style="filled,dashed"];')
        lines.extend(f'  {ids[a]} -> {ids[b]} [style=dotted color="#999999"];' for a, b in zip(order, order[1:]))
        lines.append("}")
    for op, name in ids.items():
        lines.extend(f"{ids[dep]} -> {name};" for dep in schedule.deps.get(op, ()) if dep in ids)
    lines.append("}")
    return "\n".join(lines) + "\n"

