"""The command line: schedc compile | check | simulate | tune | render | run | list | export | demo | calibrate.

Click only: each command parses its options and calls the library (compiler.compile_file, render,
demo, the runtime's launcher); heavy modules are imported inside the commands so that `schedc --help`
answers at once. Exit codes (diagnostics.exit_code, SchedError.exit_code): 0 ok, 1 a schedule that
fails its checks, 2 usage or syntax errors.
"""
from __future__ import annotations

import json
import signal
import sys
from functools import partial
from pathlib import Path

import click
from click.utils import PacifyFlushWrapper

from .diagnostics import SchedError, exit_code, plural
from .outputs import STDOUT, is_stdout, output_error, prepare_directory, reason, write_output
from .predict import cluster_options, option_given
from .tune import tune_options

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _check_defines(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """-D values must read NAME=VALUE (compiler.parse_defines); a bad one is click's usage error."""
    from .compiler import parse_defines
    try:
        parse_defines(values)
    except SchedError as exc:
        raise click.BadParameter(exc.diagnostics[0].message, param_hint="-D") from None
    return values


def _report(diagnostics, source) -> None:
    from .diagnostics import capped
    for diag in capped(diagnostics):
        click.echo(diag.format(source), err=True)


def _fail(exc: SchedError) -> None:
    click.echo(exc.render(), err=True)
    sys.exit(exc.exit_code)


define_option = click.option("-D", "defines", multiple=True, metavar="NAME=VALUE", callback=_check_defines,
                             help="Override a param of the schedule (repeatable).")
_COST_OPTIONS = (
    click.option("--costs", type=click.Path(dir_okay=False), default=None,
                 help="Measured costs: JSON from `schedc run --profile-out` (or written by hand)."),
    click.option("--profile", type=click.Path(dir_okay=False), default=None,
                 help="Measured costs from a PipeFisher profile CSV (bs,time_f,time_b,...); with --microbatch-size."),
    click.option("--microbatch-size", type=int, default=None,
                 help="The row of the --profile CSV to use; with --cluster (or check --model), the microbatch "
                      "size b."),
)


def costs_option(command):
    """--costs FILE.json, or --profile FILE.csv --microbatch-size B; the command gets `costs`,
    `profile` and `microbatch_size`, which _profile_choice checks and folds together."""
    for option in reversed(_COST_OPTIONS):
        command = option(command)
    return command


def _profile_choice(costs: str | None, profile: str | None,
                    microbatch_size: int | None) -> tuple[str, int | None] | None:
    """The profile row to read, or None; refuses --costs with --profile, and --microbatch-size alone."""
    if costs and profile:
        raise click.UsageError("give measured costs as --costs or as --profile, not both")
    if microbatch_size is not None and not profile:
        raise click.UsageError("--microbatch-size picks a row of a --profile CSV; give --profile too")
    return (profile, microbatch_size) if profile else None
with_option = click.option("--with", "addons", multiple=True, metavar="ADDON",
                           help="Apply an add-on (schedc/schedules/addons/ or next to FILE), as `use ADDON` would.")
def _latency(ctx, param, value: float) -> float:
    """--latency: a finite number of cost units >= 0 (NaN, inf and negative latencies were taken, and a
    correct plan then blamed or an infinite makespan printed)."""
    from .ops import cost_range, in_cost_range
    if not in_cost_range(value):
        raise click.BadParameter(f"must be {cost_range()}, got {value}")
    return value


latency_option = click.option("--latency", type=float, default=0.0, show_default=True, callback=_latency,
                              help="Simulated latency of every message between devices (>= 0).")


def _compiled(file: str, defines, costs, profile, microbatch_size, latency: float, model: str | None = None,
              addons: tuple[str, ...] = (), fail=_fail):
    """compile_file for a command: a schedule that cannot be compiled ends the process (exit 1 or 2,
    the error printed by `fail`); the diagnostics of one that can are printed, and it is returned."""
    from .compiler import compile_file
    row = _profile_choice(costs, profile, microbatch_size)
    try:
        result = compile_file(file, defines, costs, latency, row, model, addons)
    except SchedError as exc:
        fail(exc)
    _report(result.diagnostics, result.schedule.source)
    if model is not None and not result.schedule.tasks:
        click.echo(f"schedc: note: --model without --cluster only gives a schedule's tasks the model's layers; "
                   f"{result.schedule.name} has none (add --cluster for a prediction)", err=True)
    return result


class _Commands(click.Group):
    """The command group. A reader that stops early (`schedc simulate X | head -1`, `schedc --help |
    head -1`) ends the command quietly with 128 + SIGPIPE, as a shell tool the signal kills does, not
    with a failed check's 1 (click's own exit on a closed pipe, after it wraps the streams)."""

    def invoke(self, ctx: click.Context):
        out = super().invoke(ctx)
        sys.stdout.flush()  # a closed pipe shows here, inside click, not at the interpreter's exit
        return out

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, **kwargs)
        except SystemExit as exc:
            if exc.code == 1 and isinstance(sys.stdout, PacifyFlushWrapper):  # click met EPIPE
                sys.exit(128 + signal.SIGPIPE)
            raise


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(package_name="schedc")
def main() -> None:
    """schedc: declare, check, simulate, draw and run pipeline-parallel training schedules.

    FILE may be a path or the name of a library schedule (see `schedc list`).
    """


@main.command("compile")
@click.argument("file")
@define_option
@costs_option
@latency_option
@cluster_options
@with_option
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default="out", show_default=True,
              help="Directory for plan.json and rank*.txt.")
def compile_cmd(file, defines, costs, profile, microbatch_size, latency, model_file, cluster, addons, out_dir):
    """Check, simulate and lower FILE to per-rank instruction streams (with --cluster, costs in seconds
    from a model on a cluster, and the step's prediction in the plan's stats)."""
    from .plan.write import write_plan
    from .report import summary
    if out_dir == STDOUT:
        raise click.BadParameter("compile writes a directory (plan.json and rank*.txt), not the standard output",
                                 param_hint="-o")
    if _is_plan(file):
        raise click.UsageError(f"{file} is already a compiled plan: check, simulate, render and run read it; "
                               "compile the .sched file it came from")
    on = _on_cluster(file, defines, cluster, addons=addons)
    result = on.compiled if on else _compiled(file, defines, costs, profile, microbatch_size, latency, model_file,
                                              addons)
    if not result.ok:
        sys.exit(exit_code(result.diagnostics))
    try:
        prepare_directory(out_dir)
        plan, paths = write_plan(result.plan, out_dir)
    except SchedError as exc:
        _fail(exc)
    except OSError as exc:  # write_plan writes each file atomically and removes its temporary
        _fail(output_error(out_dir, reason(exc)))
    click.echo(summary(result) + (_cluster_summary(on) if on else ""))
    click.echo(f"wrote {paths[0]} and {plural(len(paths) - 1, 'rank stream')} (hash {plan.hash[:12]})")


@main.command("check")
@click.argument("file")
@define_option
@costs_option
@click.option("--model", "model_file", type=click.Path(dir_okay=False), default=None,
              help="Model description (TOML: layers, hidden, heads, seq, vocab; the file of --cluster) for "
                   "memory in bytes as simulate --cluster counts them (t=1, no recomputation); the "
                   "microbatch size from --microbatch-size or the file's microbatch_size.")
@click.option("--memory-limit", default=None, help="Per-device memory limit in bytes, e.g. 80GiB (with --model).")
@click.option("--placement", type=click.Choice(["loop", "v", "single"]), default=None,
              help="Refuse stages off this placement (a torch CSV: at each cell): single, stage s on rank s; loop, "
                   "s on rank s % p; v, rank r holds r and 2p-1-r (what torchtitan builds for the schedule it names).")
@with_option
def check_cmd(file, defines, costs, profile, microbatch_size, model_file, memory_limit, placement, addons):
    """Prove FILE free of deadlock, with matching channels and within its memory bound (FILE may be
    a plan.json: its fields and its channels are checked)."""
    from .compiler import compile_file
    # with --model and no --profile, --microbatch-size is the microbatch size of the bytes check
    row = _profile_choice(costs, profile, None if model_file and not profile else microbatch_size)
    if _is_plan(file):
        _plan_only(file, defines=defines, costs=costs, profile=profile, model=model_file,
                   memory_limit=memory_limit, addons=addons, placement=placement)
        return _check_plan(file)
    try:
        result = compile_file(file, defines, costs, 0.0, row, addons=addons)  # --model: bytes here
        extra = []
        if model_file or memory_limit:
            from .checks.memory import check_memory_bytes
            extra = check_memory_bytes(result.schedule, result.timing, model_file, memory_limit, microbatch_size)
        if placement:
            from .interop.torch_placement import check_placement
            extra += check_placement(result.schedule, placement)
    except SchedError as exc:
        _fail(exc)
    diagnostics = result.diagnostics + extra
    _report(diagnostics, result.schedule.source)
    if exit_code(diagnostics):
        count = sum(d.severity.value == "error" for d in diagnostics)
        click.echo(f"{result.schedule.source.path}: {count} error{'s' * (count != 1)}", err=True)
        sys.exit(exit_code(diagnostics))
    click.echo(f"{result.schedule.source.path}: ok ({plural(result.stats['ops'], 'op')} on "
               f"{plural(result.schedule.devices, 'device')}: no deadlock, channels match, memory peak "
               f"{max(result.stats['peak_memory']):g} activation{'s' * (max(result.stats['peak_memory']) != 1)})")


@main.command("simulate")
@click.argument("file")
@define_option
@costs_option
@latency_option
@cluster_options
@with_option
@click.option("--json", "as_json", is_flag=True, help="Print the stats as JSON.")
def simulate_cmd(file, defines, costs, profile, microbatch_size, latency, model_file, cluster, addons, as_json):
    """Simulate FILE under its cost model and print the stats (with --cluster: a model on a cluster,
    in seconds, with iteration time, teraFLOP/s per GPU, memory per GPU and the time's breakdown).
    FILE may be a plan.json: its ranks' orders are re-simulated (under --costs if given)."""
    from .report import device_table, summary
    fail = _fail_json if as_json else _fail
    if _is_plan(file):
        _plan_only(file, defines=defines, model=model_file, cluster=cluster, addons=addons)
        on, result = None, _replayed(file, costs, profile, microbatch_size, _given("latency", latency), fail)
    else:
        on = _on_cluster(file, defines, cluster, lower=False, addons=addons, fail=fail)
        result = on.compiled if on else _compiled(file, defines, costs, profile, microbatch_size, latency,
                                                  model_file, addons, fail)
    if not result.ok:  # a partial simulation's figures (negative bubble, utilization 6) are not stats
        errors = sum(d.severity.value == "error" for d in result.diagnostics)
        if as_json:
            click.echo(json.dumps(_refusal_json(result.diagnostics, result.schedule.source), indent=1))
        click.echo(f"{result.schedule.source.path}: {errors} error{'s' * (errors != 1)}; no stats for a "
                   "schedule that fails its checks", err=True)
        sys.exit(exit_code(result.diagnostics))
    if as_json:
        click.echo(json.dumps(dict(result.stats), indent=1))
    else:
        click.echo(summary(result) + (_cluster_summary(on) if on else ""))
        click.echo(device_table(result))
        if _is_plan(file):
            cycle = len(result.plan.ranks[0]) if result.plan is not None and result.plan.ranks else 1
            step = (f"step 0 of its cycle of {cycle} steps, " if cycle > 1 else "")
            tasks = any(op.is_task for order in result.schedule.orders for op in order)
            messages = ("with the message times the plan records" if "links" in result.plan.meta
                        else f"at latency {result.timing.latency:g}")
            click.echo(f"  (re-simulated from the plan's per-rank orders, {step}{messages}, as render draws it: "
                       "a task waits only for its rank's order"
                       + ("; its tasks' memory is not in a plan, so the peaks count activations only" if tasks else "")
                       + ")")
    sys.exit(exit_code(result.diagnostics))


def _given(name: str, value):
    """An option's value if the user gave it, else None (a plan's re-simulation then uses its own)."""
    return value if option_given(name) else None


def _refusal_json(diagnostics, source) -> dict:
    """`simulate --json` for a schedule without stats: valid false, the error count and the diagnostics
    (capped as the text is) with their places."""
    from .diagnostics import capped
    return {"valid": False, "errors": sum(d.severity.value == "error" for d in diagnostics),
            "diagnostics": [d.to_json(source) for d in capped(diagnostics)]}


def _fail_json(exc: SchedError) -> None:
    """_fail, with the refusal as JSON on stdout too (a syntax or usage error: exit 2)."""
    click.echo(json.dumps(_refusal_json(exc.diagnostics, exc.source), indent=1))
    _fail(exc)


def _is_plan(file: str) -> bool:
    return file.endswith(".json")


def _plan_only(file: str, **given) -> None:
    """Options that change how a schedule is compiled have no meaning for a compiled plan: refused."""
    names = {"defines": "-D", "costs": "--costs", "profile": "--profile", "model": "--model", "cluster": "--cluster",
             "memory_limit": "--memory-limit", "addons": "--with", "placement": "--placement"}
    used = [names[k] for k, v in given.items() if v]
    if used:
        raise click.UsageError(f"{file} is a compiled plan: {', '.join(used)} change{'s' * (len(used) == 1)} how a "
                               "schedule is compiled; give the .sched file instead")


def _replayed(file: str, costs, profile, microbatch_size, latency: float | None, fail=_fail):
    """A plan.json re-simulated from its ranks' step-0 orders, as render draws it."""
    from .render.load import load_input
    try:
        result = load_input(file, (), costs, latency, _profile_choice(costs, profile, microbatch_size))
    except SchedError as exc:
        fail(exc)
    _report(result.diagnostics, result.schedule.source)  # its orders' checks, as a compile's are printed
    return result


def _check_plan(file: str) -> None:
    """`schedc check plan.json`: the plan's fields (as the runtime reads them), its orders (as a .sched
    file's: every op once, on its rank, completing) and its channels."""
    from .diagnostics import Source
    plan, diagnostics = plan_diagnostics(file)
    _report(diagnostics, Source(file, ""))
    if exit_code(diagnostics):
        sys.exit(exit_code(diagnostics))
    click.echo(f"{file}: ok (plan of {plan.meta.get('schedule')}, {plural(plan.devices, 'rank')}, "
               f"{plural(sum(len(step) for steps in plan.ranks for step in steps), 'instruction')}: fields valid, "
               "orders complete, channels match)")


def plan_diagnostics(file: str):
    """A plan.json loaded (a field error ends the process, exit 2) and checked: its step programs'
    orders (render.load.check_plan_orders), then its channels; (plan, diagnostics)."""
    from .checks.channels import check_channels
    from .diagnostics import Source, error
    from .plan import PlanError, load_plan
    from .render.load import check_plan_orders
    try:
        plan = load_plan(file)
    except PlanError as exc:
        _fail(SchedError(error(exc.without_path(file)), Source(file, ""), exit_code=2))
    return plan, check_plan_orders(plan, file) + check_channels(plan)


def _on_cluster(file: str, defines, cluster, lower: bool = True, addons: tuple[str, ...] = (), fail=_fail):
    """With --cluster, FILE (and its --with add-ons) compiled for the cluster (errors end the process,
    exit 2 or 1, the error printed by `fail`); else None."""
    if cluster is None:
        return None
    from .compiler import parse_defines
    from .predict import compile_on_cluster
    try:
        on = compile_on_cluster(file, parse_defines(defines), cluster, lower, addons)
    except SchedError as exc:
        fail(exc)
    _report(on.compiled.diagnostics, on.compiled.schedule.source)
    return on


def _cluster_summary(on) -> str:
    from .predict import summary
    return "\n" + summary(on)


def _progress_line(what: str, done: int, total: int) -> None:
    """Progress on a terminal: `what n/N` rewritten in place on stderr (the caller clears it)."""
    click.echo(f"\r{what} {done}/{total}", err=True, nl=False)


_SYNTHESIZE_ONLY = ("defines", "costs", "costs_file", "activation_limit", "out", "latency")


@main.command("tune")
@click.option("--synthesize", "synth", is_flag=True,
              help="Find a per-device order within --activation-limit and write it as a .sched file.")
@click.option("-D", "defines", multiple=True, metavar="NAME=VALUE", callback=_check_defines,
              help="With --synthesize: -D p=N (devices) and -D m=N (microbatches).")
@click.option("--cost", "costs", multiple=True, metavar="KIND=VALUE[,...]",
              help="With --synthesize: cost of F, B, or split I and W; one value or one per stage (defaults F=1, "
                   "B=2; I=W=1); over --costs.")
@click.option("--costs", "costs_file", type=click.Path(dir_okay=False), default=None,
              help="With --synthesize: measured costs of F, B (or I and W) per stage, JSON from "
                   "`schedc run --profile-out`, as for simulate.")
@click.option("--activation-limit", "activation_limit", default=None, metavar="N[,...]",
              help="With --synthesize: activations a device may hold, one value or one per device.")
@click.option("--latency", type=float, default=0.0, show_default=True, callback=_latency,
              help="With --synthesize: latency of every message between devices (>= 0).")
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False),
              help="With --synthesize: the .sched file to write (default or -: print it).")
@tune_options
@click.option("--json", "as_json", is_flag=True,
              help="Print the ranked list as JSON, best first (with --synthesize: the order's summary).")
def tune_cmd(synth, defines, costs, costs_file, activation_limit, latency, out, options, as_json):
    """Search schedules and parallel layouts (t, p, d, v, b, recomputation) for a model on a cluster,
    ranked by the predicted iteration time of each schedule's simulated order; or, with --synthesize,
    find a per-device order for given costs under an activation-memory limit."""
    from .cluster import usage
    ctx = click.get_current_context()
    flags = {param.name: param.opts[0] for param in ctx.command.params}  # --microbatch-size, not its dest

    def given(names) -> list[str]:
        return [flags[name] for name in names if option_given(name)]

    fail = _fail_json if as_json else _fail
    if synth:
        search_only = given(options)
        if search_only:
            hint = (" (with --synthesize the limit is --activation-limit N, activations per device)"
                    if "--memory-limit" in search_only else "")
            fail(usage(f"{', '.join(search_only)}: option{'s' * (len(search_only) > 1)} of the "
                       f"configuration search, not of --synthesize{hint}"))
        return _synthesize(defines, costs, latency, activation_limit, out, costs_file, as_json)
    synthesis_only = given(_SYNTHESIZE_ONLY)
    if synthesis_only:
        fail(usage(f"{', '.join(synthesis_only)} go{'es' * (len(synthesis_only) == 1)} with --synthesize"))
    from .tune import run_command
    try:
        click.echo(run_command(options, as_json))
    except SchedError as exc:
        fail(exc)  # under --json: {"valid": false, "diagnostics": [...]} on stdout, the error on stderr


def _synthesize(defines, costs, latency, activation_limit, out, costs_file, as_json) -> None:
    """`schedc tune --synthesize`: the order, written or printed, and its report (--json: the summary
    on stdout, with the text in it when there is no -o)."""
    from .compiler import parse_defines
    from .synthesize_cli import run_tune
    if as_json and out == "-":
        out = None  # the text goes into the JSON, as without -o
    shown = sys.stderr.isatty() and not as_json
    try:
        made = run_tune(parse_defines(defines), costs, latency, activation_limit, out,
                        partial(_progress_line, "synthesizing: greedy variant") if shown else None, costs_file)
    except SchedError as exc:
        if as_json:
            _fail_json(exc)
        _fail(exc)
    finally:
        if shown:
            click.echo("\r\033[K", err=True, nl=False)
    if as_json:
        click.echo(json.dumps({**made.summary, **({"sched": made.text} if out is None else {})}, indent=1))
    else:
        if out is None:
            click.echo(made.text, nl=False)
        click.echo(made.report, err=True)
    sys.exit(0 if made.ok else 1)


@main.command("list")
def list_cmd():
    """List the library schedules with their params (a composed one's all: its base's and its add-ons'),
    then the library's add-ons (`--with NAME`), whose params are named NAME.param."""
    from .compiler import load_declaration, read_source
    from .frontend.library import library_addons, library_files
    from .frontend.parse import parse_source
    for path in library_files():
        decl = load_declaration(read_source(path))
        _list_entry(path.stem, decl, "")
    for path in library_addons():
        decl = parse_source(read_source(path))
        _list_entry(f"{path.stem} (add-on)", decl, f"{decl.name}.")


def _list_entry(name: str, decl, prefix: str) -> None:
    from .frontend import ast
    click.echo(f"{name:<18} {decl.name}: {decl.doc}")
    for d in decl.decls:
        if isinstance(d, ast.Param):
            value = d.default.value if isinstance(d.default, ast.Num) else "(expr)"
            click.echo(f"{'':<20}-D {prefix + d.name + '=' + str(value):<18} {d.doc}")


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
@cluster_options
@with_option
def render_cmd(file, defines, costs, profile, microbatch_size, latency, out, dag, comms, measured, model_file,
               cluster, addons):
    """Draw FILE: timeline, dependency DAG, HTML report or Chrome trace (by OUT's extension)."""
    from .render import render_file
    row = _profile_choice(costs, profile, microbatch_size)
    try:
        result = render_file(file, defines, costs, _given("latency", latency), out, dag=dag, comms=comms,
                             measured=measured, profile=row, cluster=cluster, addons=addons)
    except SchedError as exc:
        _fail(exc)
    _report(result.diagnostics, result.schedule.source)
    click.echo(f"wrote {out}")
    sys.exit(exit_code(result.diagnostics))


@main.command("export")
@click.argument("file")
@define_option
@click.option("--format", "fmt", type=click.Choice(["torch-csv", "torch-comms"]), default="torch-csv",
              show_default=True, help="torch-csv: compute-only; torch-comms: with SEND/RECV cells (compute_comms).")
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False),
              help="The CSV to write; - prints it.")
@with_option
def export_cmd(file, defines, fmt, out, addons):
    """Export FILE's per-rank order (torch.distributed.pipelining CSV)."""
    from .compiler import compile_file
    from .interop.torch_comms import export_comms_csv
    from .interop.torch_csv import export_csv
    try:
        result = compile_file(file, defines, None, 0.0, addons=addons)
        if not result.ok:
            _report(result.diagnostics, result.schedule.source)
            sys.exit(exit_code(result.diagnostics))
        text = export_csv(result.schedule)  # refuses what torch's format cannot hold, for both formats
    except SchedError as exc:
        _fail(exc)
    from .interop.torch_placement import describe, sidecar, sidecar_path
    comms = fmt == "torch-comms"
    try:
        write_output(out, export_comms_csv(result.plan) if comms else text)
        if not is_stdout(out):
            stated = sidecar(result.schedule, out, "compute_comms" if comms else "compute_only")
            write_output(str(sidecar_path(out)), json.dumps(stated, indent=1) + "\n")
    except SchedError as exc:
        _fail(exc)
    if not is_stdout(out):  # `-o -` prints the CSV alone, for a pipe
        line = describe(result.schedule.pipelines[0].placement, result.schedule.devices)
        click.echo(f"wrote {out} and {sidecar_path(out)}\n{line}")


@main.command("calibrate")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="The cluster TOML to write.")
@click.option("--ranks", type=int, default=2, show_default=True, help="Local processes for the message timings.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch threads per process.")
@click.option("--quick", is_flag=True, help="Fewer sizes and repeats.")
@click.option("--cluster", "cluster_name", default=None, metavar="NAME|FILE",
              help="Start from this cluster file instead of measuring (with --costs).")
@click.option("--costs", type=click.Path(dir_okay=False), default=None,
              help="A measured profile (schedc run --profile-out) to scale the compute rates to.")
@click.option("--model", "model_file", type=click.Path(dir_okay=False), default=None,
              help="The model description (TOML, as for simulate --cluster; the runtime's --config) the "
                   "profile ran (with --costs).")
@click.option("--microbatch-size", type=click.IntRange(min=1), default=None,
              help="The profile's microbatch size (the runtime's --mb-size); default: the one the profile "
                   "records, which a different value contradicts.")
@click.option("--tp", type=int, default=1, show_default=True, help="The profile's tensor-parallel size.")
@click.option("--recompute", type=click.Choice(["full", "selective", "none"]), default="none", show_default=True,
              help="The profile's recomputation (the runtime recomputes nothing).")
def calibrate_cmd(out, ranks, threads, quick, cluster_name, costs, model_file, microbatch_size, tp, recompute):
    """Write a cluster description of this machine: GEMM rate by size, memory-bound kernel bandwidth and
    messages between local processes on the runtime's backend (gloo on CPU); with --costs and --model,
    the compute rates scaled so that the model's F and B match a measured profile."""
    from .predict import calibrate_file
    try:
        click.echo(calibrate_file(out, ranks, threads, quick, cluster_name, costs, model_file, microbatch_size,
                                  tp, recompute))
    except SchedError as exc:
        _fail(exc)


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
    from .demo import DEFAULT, run_demo
    if schedule == DEFAULT[0] and not defines:
        defines = DEFAULT[1]
    try:
        sys.exit(run_demo(Path(out), schedule, defines, steps, list(ctx.args)))
    except SchedError as exc:
        _fail(exc)


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--nproc", type=int, default=None, help="Processes per node (default: the plan's devices x dp).")
@click.pass_context
def run_cmd(ctx, plan, nproc):
    """Run PLAN (plan.json) under torchrun; options after PLAN go to the runtime, after `--` to torchrun.

    Example: schedc run out/plan.json --nproc 4 --steps 3 --trace-out trace.json
    """
    from .diagnostics import Source, has_errors
    from .runtime.launch import launch_from_cli
    if plan.endswith((".sched", ".csv")):
        raise click.UsageError(f"{plan} is a schedule, not a compiled plan: compile it first (schedc compile "
                               f"{plan} -o DIR), then run DIR/plan.json")
    if _is_plan(plan) and Path(plan).is_file():  # else the launcher says what the file is
        _, diagnostics = plan_diagnostics(plan)
        if has_errors(diagnostics):  # refused before a process starts, as `schedc check` refuses it
            _report(diagnostics, Source(plan, ""))
            sys.exit(exit_code(diagnostics))
    sys.exit(launch_from_cli(plan, nproc, list(ctx.args)))


if __name__ == "__main__":
    main()
