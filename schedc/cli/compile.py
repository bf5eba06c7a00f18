"""`schedc compile`: check, simulate and lower a schedule to a plan."""
from __future__ import annotations

import os

import click

from ..diagnostics import SchedError
from ..text import plural
from ..outputs import STDOUT, output_error, prepare_directory, reason
from .group import main
from .options import schedule_options
from .common import done, fail, compiled, is_plan, on_cluster, cluster_summary, finish, refuse_clash




@main.command("compile")
@click.argument("file")
@schedule_options
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default="out", show_default=True,
              help="Directory for plan.json and rank*.txt.")
def compile_cmd(file, defines, costs, profile, microbatch_size, latency, model_file, cluster, addons, max_ops,
                out_dir):
    """Check, simulate and lower FILE to per-rank instruction streams (with --cluster, costs in seconds
    from a model on a cluster, and the step's prediction in the plan's stats)."""
    from ..plan.write import write_plan
    from .report import summary
    if out_dir == STDOUT:
        raise click.BadParameter("compile writes a directory (plan.json and rank*.txt), not the standard output",
                                 param_hint="-o")
    if is_plan(file):
        raise click.UsageError(f"{file} is already a compiled plan: check, simulate, render and run read it; "
                               "compile the .sched file it came from")
    refuse_clash([("FILE", file), ("--costs", costs), ("--profile", profile), ("--model", model_file)],
                 [("-o", os.path.join(out_dir, "plan.json"))])
    on = on_cluster(file, defines, cluster, addons=addons, max_ops=max_ops)
    result = on.compiled if on else compiled(file, defines, costs, profile, microbatch_size, latency, model_file,
                                              addons, max_ops=max_ops)
    if not result.ok:
        finish(result.diagnostics)
    try:
        prepare_directory(out_dir)
        plan, paths = write_plan(result.plan, out_dir)
    except SchedError as exc:
        fail(exc)
    except OSError as exc:  # write_plan writes each file atomically and removes its temporary
        fail(output_error(out_dir, reason(exc)))
    click.echo(summary(result) + (cluster_summary(on) if on else ""))
    click.echo(f"wrote {paths[0]} and {plural(len(paths) - 1, 'rank stream')} (hash {plan.hash[:12]})")
    done(result.diagnostics)
