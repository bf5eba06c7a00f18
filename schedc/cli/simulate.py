"""`schedc simulate`: the stats of a schedule, a plan re-simulated, or a prediction on a cluster."""
from __future__ import annotations

import json

import click

from .group import main
from .options import schedule_options
from .common import done, fail, fail_json, compiled, given_value, refusal_json, is_plan, plan_only, replayed, on_cluster, cluster_summary, finish
from ..text import plural




@main.command("simulate")
@click.argument("file")
@schedule_options
@click.option("--json", "as_json", is_flag=True, help="Print the stats as JSON.")
def simulate_cmd(file, defines, costs, profile, microbatch_size, latency, model_file, cluster, addons, max_ops,
                 as_json):
    """Simulate FILE under its cost model and print the stats (with --cluster: a model on a cluster,
    in seconds, with iteration time, teraFLOP/s per GPU, memory per GPU and the time's breakdown).
    FILE may be a plan.json: its ranks' orders are re-simulated (under --costs if given)."""
    from .report import device_table, summary
    failing = fail_json if as_json else fail
    if is_plan(file):
        plan_only(file, defines=defines, model=model_file, cluster=cluster, addons=addons)
        on, result = None, replayed(file, costs, profile, microbatch_size, given_value("latency", latency), failing)
    else:
        on = on_cluster(file, defines, cluster, lower=False, addons=addons, fail=failing, max_ops=max_ops)
        result = on.compiled if on else compiled(file, defines, costs, profile, microbatch_size, latency,
                                                  model_file, addons, failing, max_ops)
    if not result.ok:  # a partial simulation's figures (negative bubble, utilization 6) are not stats
        errors = sum(d.severity.value == "error" for d in result.diagnostics)
        if as_json:
            click.echo(json.dumps(refusal_json(result.diagnostics, result.schedule.source), indent=1))
        click.echo(f"{result.schedule.source.path}: {plural(errors, 'error')}; no stats for a "
                   "schedule that fails its checks", err=True)
        finish(result.diagnostics)
    if as_json:
        click.echo(json.dumps(dict(result.stats), indent=1))
    else:
        click.echo(summary(result) + (cluster_summary(on) if on else ""))
        click.echo(device_table(result))
        if is_plan(file):
            cycle = len(result.plan.ranks[0]) if result.plan is not None and result.plan.ranks else 1
            step = (f"step 0 of its cycle of {cycle} steps, " if cycle > 1 else "")
            tasks = any(op.is_task for order in result.schedule.orders for op in order)
            messages = ("with the message times the plan records" if "links" in result.plan.meta
                        else f"at latency {result.timing.latency:g}")
            click.echo(f"  (re-simulated from the plan's per-rank orders, {step}{messages}, as render draws it: "
                       "a task waits only for its rank's order"
                       + ("; its tasks' memory is not in a plan, so the peaks count activations only" if tasks else "")
                       + ")")
    done(result.diagnostics)
