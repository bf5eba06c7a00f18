"""What the commands share: printing diagnostics, ending a command with its exit code (finish, fail), compiling
or re-simulating FILE for a command, the plan.json checks, progress on a terminal."""
from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

import click

from ..diagnostics import SchedError, exit_code
from ..text import agree, plural
from .options import profile_choice, option_given




def report(diagnostics, source) -> None:
    from ..diagnostics import capped
    for diag in capped(diagnostics):
        click.echo(diag.format(source), err=True)


def end(code: int, at_once: bool = False) -> NoReturn:
    """End the command with exit status `code`: the one place a command exits (finish and fail decide
    the code from diagnostics and errors; the launcher's and the demo's runs bring theirs). at_once, for
    a command whose output is all written: in the command line's own process the process ends there
    (os._exit, the streams flushed), as mypy's hard exit does, instead of tearing the compiled schedule
    and plan down object by object (10^6 ops: about a second). A caller of `main(args)` (tests, the
    demo) and a process under a profiler or tracer (which write their results at exit: cProfile,
    coverage) get the SystemExit all the same."""
    root = click.get_current_context(silent=True)
    if (at_once and root is not None and getattr(root.find_root().command, "whole_process", False)
            and sys.getprofile() is None and sys.gettrace() is None):
        sys.stdout.flush()  # a reader that has gone shows here: group._closed_pipe_ends_quietly ends it
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def done(diagnostics) -> NoReturn:
    """finish, at once (end's at_once): compile's and simulate's last call, their output written."""
    end(exit_code(diagnostics), at_once=True)


def finish(diagnostics) -> NoReturn:
    """End the command with its diagnostics' exit code (diagnostics.exit_code), as fail's is decided by
    the error's kind."""
    end(exit_code(diagnostics))


def fail(exc: SchedError) -> NoReturn:
    click.echo(exc.render(), err=True)
    end(exc.exit_code)


def refuse_clash(inputs, outputs) -> None:
    """End the command (a usage error, exit 2) before any work when an output would land on an input of
    the same command or on another output (schedc.plan.paths.clash)."""
    from ..diagnostics import usage
    from ..plan.paths import clash
    problem = clash(inputs, outputs)
    if problem:
        fail(usage(problem))


def compiled(file: str, defines, costs, profile, microbatch_size, latency: float, model: str | None = None,
              addons: tuple[str, ...] = (), fail=fail, max_ops: int | None = None):
    """compile_file for a command: a schedule that cannot be compiled ends the process (exit 1 or 2,
    the error printed by `fail`); the diagnostics of one that can are printed, and it is returned."""
    from ..driver import compile_file
    row = profile_choice(costs, profile, microbatch_size)
    try:
        result = compile_file(file, defines, costs, latency, row, model, addons, max_ops)
    except SchedError as exc:
        fail(exc)
    report(result.diagnostics, result.schedule.source)
    if model is not None and not result.schedule.tasks:
        click.echo(f"schedc: note: --model without --cluster only gives a schedule's tasks the model's layers; "
                   f"{result.schedule.name} has none (add --cluster for a prediction)", err=True)
    return result


def given_value(name: str, value):
    """An option's value if the user gave it, else None (a plan's re-simulation then uses its own)."""
    return value if option_given(name) else None


def refusal_json(diagnostics, source) -> dict:
    """`simulate --json` for a schedule without stats: valid false, the error count and the diagnostics
    (capped as the text is) with their places."""
    from ..diagnostics import capped
    return {"valid": False, "errors": sum(d.severity.value == "error" for d in diagnostics),
            "diagnostics": [d.to_json(source) for d in capped(diagnostics)]}


def fail_json(exc: SchedError) -> None:
    """fail, with the refusal as JSON on stdout too (a syntax or usage error: exit 2)."""
    click.echo(json.dumps(refusal_json(exc.diagnostics, exc.source), indent=1))
    fail(exc)


def is_plan(file: str) -> bool:
    """Whether FILE is a compiled plan, as the driver decides every input's kind (driver.kind_of)."""
    from ..driver.inputs import PLAN, kind_of
    return kind_of(file) == PLAN


def plan_only(file: str, **given) -> None:
    """Options that change how a schedule is compiled have no meaning for a compiled plan: refused."""
    names = {"defines": "-D", "costs": "--costs", "profile": "--profile", "model": "--model", "cluster": "--cluster",
             "memory_limit": "--memory-limit", "addons": "--with", "placement": "--placement"}
    used = [names[k] for k, v in given.items() if v]
    if used:
        raise click.UsageError(f"{file} is a compiled plan: {', '.join(used)} {agree(len(used), 'changes', 'change')} how a "
                               "schedule is compiled; give the .sched file instead")


def replayed(file: str, costs, profile, microbatch_size, latency: float | None, fail=fail):
    """A plan.json re-simulated from its ranks' step-0 orders, as render draws it."""
    from ..driver import load_input
    try:
        result = load_input(file, (), costs, latency, profile_choice(costs, profile, microbatch_size))
    except SchedError as exc:
        fail(exc)
    report(result.diagnostics, result.schedule.source)  # its orders' checks, as a compile's are printed
    return result


def check_plan(file: str) -> None:
    """`schedc check plan.json`: the plan's fields (as the runtime reads them), its orders (as a .sched
    file's: every op once, on its rank, completing) and its channels."""
    from ..diagnostics import Source
    plan, diagnostics = plan_diagnostics(file)
    report(diagnostics, Source(file, ""))
    if exit_code(diagnostics):
        finish(diagnostics)
    click.echo(f"{file}: ok (plan of {plan.meta.get('schedule')}, {plural(plan.devices, 'rank')}, "
               f"{plural(sum(len(step) for steps in plan.ranks for step in steps), 'instruction')}: fields valid, "
               "orders complete, channels match)")


def plan_diagnostics(file: str):
    """A plan.json loaded (a field error ends the process, exit 2) and checked (driver.replay.check_plan);
    (plan, diagnostics)."""
    from ..driver.replay import check_plan, read_plan
    try:
        plan = read_plan(file)
    except SchedError as exc:
        fail(exc)
    return plan, check_plan(plan, file)


def on_cluster(file: str, defines, cluster, lower: bool = True, addons: tuple[str, ...] = (), fail=fail,
               max_ops: int | None = None):
    """With --cluster, FILE (and its --with add-ons) compiled for the cluster (errors end the process,
    exit 2 or 1, the error printed by `fail`); else None."""
    if cluster is None:
        return None
    from ..driver import parse_defines
    from ..driver.cluster import compile_on_cluster
    try:
        on = compile_on_cluster(file, parse_defines(defines), cluster, lower, addons, max_ops)
    except SchedError as exc:
        fail(exc)
    report(on.compiled.diagnostics, on.compiled.schedule.source)
    return on


def cluster_summary(on) -> str:
    from .predict import summary
    return "\n" + summary(on)


def progress_line(what: str, done: int, total: int) -> None:
    """Progress on a terminal: `what n/N` rewritten in place on stderr (the caller clears it)."""
    click.echo(f"\r{what} {done}/{total}", err=True, nl=False)
