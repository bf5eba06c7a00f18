"""`schedc run`: a plan under torchrun, its options checked before any process starts."""
from __future__ import annotations

from pathlib import Path

import click

from .common import end, finish, is_plan, plan_diagnostics, report
from .group import main


class _RunCommand(click.Command):
    """`schedc run --help` lists every option of the runtime as well: they are `python -m schedc.runtime`'s
    own (one table, its argparse parser), read here only for the help."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        from ..runtime.process.options import build_parser  # torch: only for this help
        text = build_parser().format_help()
        groups = text[text.index("\nmodel:") + 1:] if "\nmodel:" in text else text
        formatter.write("\nRuntime options (after PLAN; the same as `python -m schedc.runtime`):\n\n")
        formatter.write(groups)


@main.command("run", cls=_RunCommand, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--nproc", type=int, default=None, help="Processes per node (default: the plan's devices x dp).")
@click.pass_context
def run_cmd(ctx, plan, nproc):
    """Run PLAN (plan.json) under torchrun; options after PLAN go to the runtime, after `--` to torchrun.

    Example: schedc run out/plan.json --nproc 4 --steps 3 --trace-out trace.json
    """
    from ..diagnostics import Source, has_errors
    from ..runtime.process.launch import launch_from_cli
    from ..driver.inputs import TORCH_CSV, kind_of
    if kind_of(plan) == TORCH_CSV or Path(plan).suffix == ".sched":
        raise click.UsageError(f"{plan} is a schedule, not a compiled plan: compile it first (schedc compile "
                               f"{plan} -o DIR), then run DIR/plan.json")
    if Path(plan).exists() and (is_plan(plan) or not Path(plan).is_file()):  # else the launcher says what it is
        # read through schedc.inputs: a FIFO or a device is refused by name, never opened
        _, diagnostics = plan_diagnostics(plan)
        if has_errors(diagnostics):  # refused before a process starts, as `schedc check` refuses it
            report(diagnostics, Source(plan, ""))
            finish(diagnostics)
    end(launch_from_cli(plan, nproc, list(ctx.args)))
