"""The ways in: a FILE named on the command line (a path or a library name) is a .sched schedule, a
torch CSV order or a compiled plan.json, chosen here and nowhere else (`kind_of`), and compiled by the
passes (a plan.json re-simulated: driver.replay)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from ..passes.compiled import Compiled
from ..diagnostics import USAGE, Diagnostic, SchedError, Source, Span, error
from ..frontend.ast import ScheduleDecl
from ..frontend.compose import compose
from ..frontend.elaborate import Options, elaborate
from ..frontend.parse import parse_source, read_source
from ..ir import Schedule
from ..plan import Plan
from .passes import Checks, collector_paused, compile_schedule

SCHEDULE, TORCH_CSV, PLAN = "schedule", "torch CSV", "plan"


def kind_of(file: str | Path) -> str:
    """What FILE holds, by its name: a plan.json, a torch CSV order, else a .sched schedule (a library
    name resolves to one)."""
    suffix = Path(file).suffix
    return PLAN if suffix == ".json" else TORCH_CSV if suffix == ".csv" else SCHEDULE


def load_declaration(source: Source, addons: Iterable[str] = ()) -> ScheduleDecl:
    """Parse and compose: text -> one declaration with its `extends`, `use` and the command line's
    `--with` add-ons resolved. Every path that elaborates a .sched file starts here (compile_file,
    --cluster's driver.cluster.compile_for, tune's search), so a composed schedule is the same schedule on
    each of them."""
    return compose(parse_source(source), source, tuple(addons))


def build_schedule(source: Source, options: Options | None = None) -> Schedule:
    """Parse, compose and elaborate: text -> AST -> IR with per-device orders."""
    return elaborate(load_declaration(source, options.addons if options else ()), source, options)


def compile_source(source: Source, options: Options | None = None, latency: float = 0.0) -> Compiled:
    return compile_schedule(build_schedule(source, options), latency)


def compile_file(file: str, defines: Iterable[str] = (), costs: str | None = None, latency: float = 0.0,
                 profile: tuple[str, int | None] | None = None, model: str | None = None,
                 addons: Iterable[str] = (), max_ops: int | None = None, checks: Checks = Checks(),
                 max_ops_why: str | None = None) -> Compiled:
    """The library's entry point (the command line, the demo, the renderer and the tests call it): read
    FILE (a path or a library name; a .sched or a torch CSV schedule) and compile it. defines: NAME=VALUE
    params; costs: a measured-costs JSON; profile: (PipeFisher profile CSV, microbatch size) instead;
    model: a model description (TOML), whose layers per stage give tasks their units; addons: add-ons
    applied as `use NAME` would (`--with`); max_ops: the most ops the schedule may expand to, checked
    before the work grows (--max-ops, or a render's own; budget.COMPILE_OPS when None), and max_ops_why
    what its refusal tells the user to do; checks: the optional checks
    selected (schedc check's --model, --memory-limit, --placement). Raises SchedError on user errors; a
    schedule that fails its checks comes back with its diagnostics."""
    from ..frontend.library import resolve
    path = resolve(file)
    if kind_of(path) == PLAN:  # not parsed as a .sched: "unexpected '{'" said nothing useful
        raise SchedError(error(f"{file} is JSON (a compiled plan?), not a schedule: check, simulate, render and run "
                               "read a plan.json; give this command the .sched (or torch CSV) file"),
                         Source(str(path), ""), kind=USAGE)
    options = replace(_options(parse_defines(defines), costs, profile, model), addons=tuple(addons))
    if max_ops is not None:
        options = replace(options, max_ops=max_ops, max_ops_why=max_ops_why or options.max_ops_why)
    with collector_paused():
        if kind_of(path) == TORCH_CSV:
            refuse_addons(file, options.addons)
            from ..interop.torch_csv import schedule_from_csv
            schedule = schedule_from_csv(path, options)
            return _with_imported_comms(compile_schedule(schedule, latency, checks=checks), path)
        else:
            schedule = build_schedule(read_source(path), options)
        return compile_schedule(schedule, latency, checks=checks)


def refuse_addons(file: str, addons: tuple[str, ...]) -> None:
    """A torch CSV schedule is a finished per-rank order, not a declaration an add-on can join: `--with`
    on one is a usage error (exit 2), not silently dropped."""
    if addons:
        raise SchedError(error(f"--with {addons[0]}: add-ons apply to .sched schedules; {Path(file).name} is a "
                               "torch CSV order (write a .sched with `use` instead)"), Source(file, ""), kind=USAGE)


def _with_imported_comms(compiled: Compiled, path) -> Compiled:
    """A torch compute_comms CSV brings its own messages and actions: its streams replace the lowered
    plan, the channel check runs on them and torch's UNSHARD/RESHARD/REDUCE_GRAD cells are checked
    (torch checks neither in a hand-ordered compute_comms schedule)."""
    from ..interop.torch_comms import check_torch_actions, comms_rows, comms_streams
    rows = comms_rows(read_source(path))
    if rows is None or compiled.plan is None:
        return compiled
    from ..checks.channels import check_channels
    streams, spans = comms_streams(rows, compiled.schedule)
    plan = Plan(compiled.plan.meta, tuple((stream,) for stream in streams))
    channels = [_at_cell(d, spans, compiled.schedule.source) for d in check_channels(plan)]
    return Compiled(compiled.schedule, compiled.timing, compiled.stats, plan,
                    [*compiled.diagnostics, *channels, *check_torch_actions(rows, compiled.schedule)])


def _at_cell(diagnostic: Diagnostic, spans: tuple[tuple[Span, ...], ...], source: Source) -> Diagnostic:
    """A channel fault of an imported compute_comms CSV, located at the cell of the instruction it is
    about (Diagnostic.at: spans[rank][index]); a fault of a rank as a whole at its row (a CSV row is a
    rank), one of no rank at the first row; so the error points into the file like every other."""
    if diagnostic.span is not None:
        return diagnostic
    rank, _, index = diagnostic.at or (0, 0, None)
    if 0 <= rank < len(spans) and index is not None and index < len(spans[rank]):
        return replace(diagnostic, span=spans[rank][index])
    line = rank + 1 if source.line(rank + 1) else 1
    return replace(diagnostic, span=Span(line, 1, line, len(source.line(line)) + 1))


def parse_defines(values: Iterable[str]) -> dict[str, str]:
    """-D NAME=VALUE pairs as a dict (later ones win); a malformed one is a usage error (exit 2)."""
    out = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise SchedError(error(f"expected NAME=VALUE, got {value!r}"), Source("-D", ""), kind=USAGE)
        out[name.strip()] = text.strip()
    return out


def _options(params: dict[str, str], costs: str | None, profile: tuple[str, int | None] | None,
             model: str | None = None) -> Options:
    """Options from params and a costs JSON, or one row of a PipeFisher profile CSV (path, microbatch
    size, its costs one layer's); a model description gives its layer count."""
    layers = None
    if model:
        from ..costmodel.modelspec import model_layers
        layers = model_layers(model)
    if profile:
        from ..interop.profiles import profile_origin, read_profile, read_profile_memory
        return Options(params, read_profile(*profile), memory=read_profile_memory(*profile), model_layers=layers,
                       per_layer=True, measured=profile_origin(profile[0]))
    if not costs:
        return Options(params, {}, model_layers=layers)
    from ..interop.profiles import costs_origin, load_costs, load_memory
    return Options(params, load_costs(costs), memory=load_memory(costs), model_layers=layers,
                   measured=costs_origin(costs))


def load_input(file: str, defines, costs: str | None, latency: float | None,
               profile: tuple[str, int | None] | None = None, addons: tuple[str, ...] = (),
               max_ops: int | None = None, max_ops_why: str | None = None) -> Compiled:
    """Compile FILE (with the `--with` add-ons) at `latency` (None: 0), or read and re-simulate it when
    it is a plan.json (under measured costs if given; None: at the plan's own latency or message times)."""
    if kind_of(file) == PLAN:
        if defines or addons:
            flag = "-D" if defines else "--with"
            raise SchedError(error(f"{flag} cannot change a compiled plan; render the .sched instead"),
                             Source(file, ""), kind=USAGE)
        from ..interop.profiles import load_costs, read_profile
        from .replay import check_measured, compiled_from_plan, read_plan
        plan = read_plan(file)
        measured = read_profile(*profile) if profile else load_costs(costs) if costs else {}
        if measured:
            check_measured(plan, measured, profile[0] if profile else None, costs)
        return compiled_from_plan(plan, file, measured, latency)
    return compile_file(file, defines, costs, latency or 0.0, profile, addons=addons, max_ops=max_ops,
                        max_ops_why=max_ops_why)
