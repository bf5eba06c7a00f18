"""`schedc demo`: compile, simulate, render and run a library schedule on CPU ranks."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from ..diagnostics import SchedError
from .group import main
from .options import define_option
from .common import fail




@main.command("demo", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--schedule", default="1f1b", show_default=True, help="Library schedule or .sched file.")
@define_option
@click.option("-o", "--out", "out", type=click.Path(file_okay=False), default="out/demo", show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=3, show_default=True, help="Training steps to run.")
@click.pass_context
def demo_cmd(ctx, schedule, defines, out, steps):
    """Compile, simulate, render and run a library schedule on CPU ranks (default: 1F1B, p=2, m=4).

    Options after these go to the runtime (see `python -m schedc.runtime --help`).
    """
    from ..demo import DEFAULT, run_demo
    if schedule == DEFAULT[0] and not defines:
        defines = DEFAULT[1]
    try:
        sys.exit(run_demo(Path(out), schedule, defines, steps, list(ctx.args)))
    except SchedError as exc:
        fail(exc)
