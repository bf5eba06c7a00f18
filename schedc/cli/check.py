"""`schedc check`: a schedule's or a plan's proofs (deadlock freedom, channels, memory), nothing written."""
from __future__ import annotations


import click

from ..diagnostics import SchedError, exit_code
from ..text import plural
from .group import main
from .options import define_option, costs_option, max_ops_option, profile_choice, seq_option, with_option
from .common import fail, report, is_plan, plan_only, check_plan, finish




@main.command("check")
@click.argument("file")
@define_option
@costs_option
@click.option("--model", "model_file", type=click.Path(dir_okay=False), default=None,
              help="Model description (a TOML file: layers, hidden, heads, seq, vocab; a Hugging Face config.json; or "
                   "a library name; the "
                   "--model of simulate --cluster) for "
                   "memory in bytes as simulate --cluster counts them (t=1, no recomputation); the "
                   "microbatch size from --microbatch-size or the file's microbatch_size.")
@seq_option
@click.option("--memory-limit", default=None, help="Per-device memory limit in bytes, e.g. 80GiB (with --model).")
@click.option("--placement", type=click.Choice(["loop", "v", "single"]), default=None,
              help="Refuse stages off this placement (a torch CSV: at each cell): single, stage s on rank s; loop, "
                   "s on rank s % p; v, rank r holds r and 2p-1-r (what torchtitan builds for the schedule it names).")
@with_option
@max_ops_option
def check_cmd(file, defines, costs, profile, microbatch_size, model_file, seq, memory_limit, placement, addons,
              max_ops):
    """Prove FILE free of deadlock, with matching channels and within its memory bound (FILE may be
    a plan.json: its fields and its channels are checked)."""
    from ..driver import Checks, compile_file
    # with --model and no --profile, --microbatch-size is the microbatch size of the bytes check
    row = profile_choice(costs, profile, None if model_file and not profile else microbatch_size)
    if is_plan(file):
        plan_only(file, defines=defines, costs=costs, profile=profile, model=model_file,
                   memory_limit=memory_limit, addons=addons, placement=placement)
        return check_plan(file)
    checks = Checks(model_file, memory_limit, microbatch_size, placement, seq)  # passes of PASSES, selected here
    try:
        result = compile_file(file, defines, costs, 0.0, row, addons=addons, max_ops=max_ops, checks=checks)
    except SchedError as exc:
        fail(exc)
    diagnostics = result.diagnostics
    report(diagnostics, result.schedule.source)
    if exit_code(diagnostics):
        count = sum(d.severity.value == "error" for d in diagnostics)
        click.echo(f"{result.schedule.source.path}: {plural(count, 'error')}", err=True)
        finish(diagnostics)
    click.echo(f"{result.schedule.source.path}: ok ({plural(result.stats['ops'], 'op')} on "
               f"{plural(result.schedule.devices, 'device')}: no deadlock, channels match, memory peak "
               f"{max(result.stats['peak_memory']):g} activation{'s' * (max(result.stats['peak_memory']) != 1)})")
