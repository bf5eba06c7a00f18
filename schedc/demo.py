"""The main job on an embedded default: compile, simulate, render and run a library schedule on CPU ranks.

    schedc demo  ->  out/demo/{plan.json, rank*.txt, timeline.svg, report.html, simulated.json,
                     measured.json, measured-report.json, comparison.svg}
"""
from __future__ import annotations

from pathlib import Path

import click

from .diagnostics import SchedError

DEFAULT = ("1f1b", ("p=2", "m=4"))


def run_demo(out: Path, schedule: str, defines: tuple[str, ...], steps: int, extra: list[str]) -> int:
    from .driver import compile_file
    from .plan.write import write_plan
    from .report import summary
    from .render import render_file
    from .runtime.launch import launch

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
