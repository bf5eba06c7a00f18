"""`schedc render`: timeline, dependency DAG, HTML report or Chrome trace."""
from __future__ import annotations


import click

from ..diagnostics import SchedError
from .group import main
from .options import define_option, costs_option, profile_choice, with_option, latency_option, cluster_options
from .common import fail, report, given_value, finish, refuse_clash




@main.command("render")
@click.argument("file")
@define_option
@costs_option
@latency_option
@click.option("-o", "--out", "out", required=True, help="Output: .svg .png .pdf (timeline), .html, .json, .dot")
@click.option("--dag", is_flag=True, help="Draw the dependency graph instead of the timeline.")
@click.option("--comms", is_flag=True, help="Show sends and receives on the timeline.")
@click.option("--measured", type=click.Path(dir_okay=False), default=None,
              help="A measured Chrome trace to draw above the simulated timeline.")
@click.option("--width", "width", type=int, default=None, metavar="PIXELS",
              help="Fit the timeline's time axis to PIXELS (the PNG's width; SVG and PDF are the same drawing, "
                   "2 pixels a point). Without it a timeline wider than 2400 pixels is scaled down to 2400; "
                   "0 keeps the natural scale, however wide.")
@cluster_options
@with_option
def render_cmd(file, defines, costs, profile, microbatch_size, latency, out, dag, comms, measured, width,
               model_file, cluster, addons):
    """Draw FILE: timeline, dependency DAG, HTML report or Chrome trace (by OUT's extension)."""
    from ..render import render_file
    described = [] if cluster is None else [("--model", cluster.model), ("--cluster", cluster.cluster)]
    refuse_clash([("FILE", file), ("--costs", costs), ("--profile", profile), ("--measured", measured),
                  ("--model", model_file), *described], [("-o", out)])
    row = profile_choice(costs, profile, microbatch_size)
    try:
        result = render_file(file, defines, costs, given_value("latency", latency), out, dag=dag, comms=comms,
                             measured=measured, profile=row, cluster=cluster, addons=addons,
                             width=width)
    except SchedError as exc:
        fail(exc)
    report(result.diagnostics, result.schedule.source)
    click.echo(f"wrote {out}")
    finish(result.diagnostics)
