"""`schedc demo`, the main job on an embedded default: compile, simulate, render and run a library schedule
on CPU ranks.

    schedc demo  ->  out/demo/{plan.json, rank*.txt, timeline.svg, report.html, simulated.json,
                     measured.json, measured-report.json, comparison.svg}
"""
from __future__ import annotations

from pathlib import Path

import click

from ..diagnostics import SchedError
from .group import main
from .options import define_option
from .common import end, fail

DEFAULT = ("1f1b", ("p=2", "m=4"))


def run_demo(out: Path, schedule: str, defines: tuple[str, ...], steps: int, extra: list[str]) -> int:
    from ..driver import compile_file
    from ..plan.write import write_plan
    from ..render import render_file
    from .report import summary
    from ..runtime.process.launch import launch

    click.echo(f"== compile {schedule} {' '.join(defines)}")
    result = compile_file(schedule, defines, None, 0.0)
    if not result.ok:
        raise SchedError(result.diagnostics, result.schedule.source)
    plan, _ = write_plan(result.plan, out)
    click.echo(summary(result))
    click.echo("== render")
    for name in ("timeline.svg", "report.html", "simulated.json"):
        render_file(schedule, defines, None, 0.0, str(out / name))
        click.echo(f"  wrote {out / name}")
    click.echo(f"== run on {plan.devices} CPU ranks (gloo), {steps} steps")
    options = ["--steps", str(steps), "--trace-out", str(out / "measured.json"),
               "--report-out", str(out / "measured-report.json"), *extra]
    status = launch(out / "plan.json", plan.devices, options)
    if status != 0:
        return status
    render_file(schedule, defines, None, 0.0, str(out / "comparison.svg"), measured=str(out / "measured.json"))
    click.echo(f"  wrote {out / 'measured.json'}, {out / 'measured-report.json'} and {out / 'comparison.svg'}")
    return 0


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
    if schedule == DEFAULT[0] and not defines:
        defines = DEFAULT[1]
    try:
        end(run_demo(Path(out), schedule, defines, steps, list(ctx.args)))
    except SchedError as exc:
        fail(exc)
