"""`schedc calibrate`: a cluster description of this machine, or one fitted to a profile."""
from __future__ import annotations


import click

from ..diagnostics import SchedError
from .group import main
from .common import fail
from .options import layout_from, layout_option

MAX_RANKS = 64     # local processes: each holds torch (some 250 MB) and a gloo connection to every other
MAX_THREADS = 1024


@main.command("calibrate")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="The cluster TOML to write.")
@click.option("--ranks", type=click.IntRange(2, MAX_RANKS), default=2, show_default=True,
              help="Local processes for the message timings (a ping-pong needs two).")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=1, show_default=True,
              help="torch threads per process.")
@click.option("--quick", is_flag=True, help="Fewer sizes and repeats.")
@click.option("--cluster", "cluster_name", default=None, metavar="NAME|FILE",
              help="Start from this cluster file instead of measuring (with --costs).")
@click.option("--costs", type=click.Path(dir_okay=False), multiple=True,
              help="A measured profile (schedc run --profile-out) to scale the compute rates to; again for "
                   "profiles at other sizes, which fit the overhead per layer of each op too.")
@click.option("--model", "model_file", type=click.Path(dir_okay=False), multiple=True,
              help="The model description (a TOML file or a library name, as for simulate --cluster and the runtime's --model) the "
                   "profile ran (with --costs): once for all, or once per --costs, in order.")
@layout_option("microbatch_size", "the profile's; default: the one the profile records, which a different value "
               "contradicts", "calibrate", type=click.IntRange(min=1))
@layout_option("tp", "the profile's", "calibrate", type=click.IntRange(min=1))
@layout_option("recompute", "the profile's: the runtime recomputes nothing by default", "calibrate")
def calibrate_cmd(out, ranks, threads, quick, cluster_name, costs, model_file, microbatch_size, tp, recompute):
    """Write a cluster description of this machine: GEMM rate by size, memory-bound kernel bandwidth and
    messages between local processes on the runtime's backend (gloo on CPU); with --costs and --model,
    the compute rates scaled so that the model's F and B match a measured profile."""
    from ..costmodel.fit import calibrate_file
    try:
        layout = layout_from({"tp": tp, "recompute": recompute}, "calibrate")
        click.echo(calibrate_file(out, ranks, threads, quick, cluster_name, costs, model_file, microbatch_size,
                                  layout.tp, layout.recompute))
    except SchedError as exc:
        fail(exc)
