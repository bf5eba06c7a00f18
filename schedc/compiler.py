"""The compiler driver: source text -> AST -> IR (frontend), then PASSES in order, one line each:
checks, timing, bubble filling, lowering to a plan and the plan's check. `compile_file` is the library's
entry point; the command line, the demo, the renderer and the tests call it."""
from __future__ import annotations


import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from .checks.channels import check_channels
from .checks.deadlock import check_deadlock
from .checks.memory import check_memory
from .checks.census import Census, census
from .checks.structure import check_structure
from .diagnostics import Diagnostic, SchedError, Source, Span, error, has_errors
from .frontend.ast import ScheduleDecl
from .frontend.compose import compose
from .frontend.elaborate import Options, elaborate
from .ir import Schedule
from .lower import lower
from .frontend.parse import parse_source, read_source
from .plan import Plan
from .simulate import Links, simulate, step_sequences
from .timing import Stats, Timing


@dataclass(frozen=True)
class Compiled:
    """What a compile returns: the (filled) schedule, its timing and stats, the plan (None when a check
    before lowering failed) and every diagnostic."""

    schedule: Schedule
    timing: Timing
    stats: Stats
    plan: Plan | None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


@dataclass(frozen=True, slots=True)
class Unit:
    """What the passes hand on to each other. Each pass takes a Unit and returns a new one with its
    result filled in (dataclasses.replace); nothing is changed in place."""

    schedule: Schedule
    latency: float = 0.0
    links: Links | None = None            # per device pair message times, instead of `latency`
    census: Census | None = None          # placed ops against the expected ones
    timing: Timing | None = None          # of the schedule as it now is (over the cycle once filled)
    unfilled: Timing | None = None        # the timing before fill_bubbles, when it ran
    sequences: tuple = ()                 # per step program: (start, end, op) in start order
    stats: Stats | None = None
    plan: Plan | None = None
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def failed(self) -> bool:
        return has_errors(self.diagnostics)


def _census(u: Unit) -> Unit:
    return replace(u, census=census(u.schedule))


def _check_structure(u: Unit) -> Unit:
    return replace(u, diagnostics=u.diagnostics + tuple(check_structure(u.schedule, u.census)))


def _simulate(u: Unit) -> Unit:
    return replace(u, timing=simulate(u.schedule, u.latency, u.links))


def _check_deadlock(u: Unit) -> Unit:
    return replace(u, diagnostics=u.diagnostics + tuple(check_deadlock(u.schedule, u.timing, u.census)))


def _fill_bubbles(u: Unit) -> Unit:
    if not u.schedule.fill or not u.timing.complete or u.failed:
        return u
    from .fill import fill_bubbles
    schedule, timing, notes = fill_bubbles(u.schedule, u.timing)
    return replace(u, schedule=schedule, timing=timing, unfilled=u.timing, diagnostics=u.diagnostics + tuple(notes))


def _check_memory(u: Unit) -> Unit:
    return replace(u, diagnostics=u.diagnostics + tuple(check_memory(u.schedule, u.timing)))


def _stats(u: Unit) -> Unit:
    return replace(u, stats=Stats.of(u.schedule, u.timing, u.unfilled))


def _step_sequences(u: Unit) -> Unit:
    return u if u.failed else replace(u, sequences=step_sequences(u.schedule, u.timing))


def _lower(u: Unit) -> Unit:
    return u if u.failed else replace(u, plan=lower(u.schedule, u.stats, u.sequences, u.links))


def _check_channels(u: Unit) -> Unit:
    return u if u.plan is None else replace(u, diagnostics=u.diagnostics + tuple(check_channels(u.plan)))


# The passes after elaboration, in the order they run. A check returns diagnostics and changes nothing;
# fill_bubbles, the step sequences and lowering are skipped once a check has failed.
PASSES: tuple[Callable[[Unit], Unit], ...] = (
    _census,            # the placed ops' identities against the expected ones (for the next checks)
    _check_structure,   # one F and one B (or I and W) per stage and microbatch, on the stage's device
    _simulate,          # event-driven timing under the cost model; memory peaks
    _check_deadlock,    # program order plus dependencies let every op run
    _fill_bubbles,      # `fill bubbles with`: tasks into idle gaps, a cycle of K step programs
    _check_memory,      # peak per device within `limit memory`
    _stats,             # makespan, bubble, utilization, busy/idle, peaks (and the fill's figures)
    _step_sequences,    # each step program's ops in simulated start order
    _lower,             # sends, receives, gradient sync and STEP per rank: the plan
    _check_channels,    # on the plan: messages match per pair, a blocking replay completes
)
ANALYSIS = PASSES[:PASSES.index(_stats) + 1]  # the passes before lowering (`simulate` without a plan)


def load_declaration(source: Source, addons: Iterable[str] = ()) -> ScheduleDecl:
    """Parse and compose: text -> one declaration with its `extends`, `use` and the command line's
    `--with` add-ons resolved. Every path that elaborates a .sched file starts here (compile_file,
    --cluster's predict.compile_for, tune's search), so a composed schedule is the same schedule on
    each of them."""
    return compose(parse_source(source), source, tuple(addons))


def build_schedule(source: Source, options: Options | None = None) -> Schedule:
    """Parse, compose and elaborate: text -> AST -> IR with per-device orders."""
    return elaborate(load_declaration(source, options.addons if options else ()), source, options)


def run_passes(schedule: Schedule, latency: float = 0.0, links: Links | None = None,
               passes: Iterable[Callable[[Unit], Unit]] = PASSES) -> Unit:
    """Run the passes in order over a schedule; returns the last Unit. links: per device pair message
    times (simulate), instead of one latency."""
    unit = Unit(schedule, latency, links)
    for run in passes:
        unit = run(unit)
    return unit


def compile_schedule(schedule: Schedule, latency: float = 0.0, links: Links | None = None) -> Compiled:
    """Check, time, fill, lower and check the plan of an elaborated schedule (PASSES)."""
    u = run_passes(schedule, latency, links)
    return Compiled(u.schedule, u.timing, u.stats, u.plan, list(u.diagnostics))


def analyse(schedule: Schedule, latency: float = 0.0, links: Links | None = None) -> Compiled:
    """The passes up to the stats, without lowering (ANALYSIS): the schedule checked and timed (and
    filled); the plan is None."""
    u = run_passes(schedule, latency, links, ANALYSIS)
    return Compiled(u.schedule, u.timing, u.stats, None, list(u.diagnostics))


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while compiling. A big schedule builds ~10^6 IR values
    and instructions, none of them in reference cycles, and the collector's repeated passes over them
    cost about a quarter of a compile. What is alive afterwards is frozen (left out of later passes)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def compile_source(source: Source, options: Options | None = None, latency: float = 0.0) -> Compiled:
    return compile_schedule(build_schedule(source, options), latency)


def compile_file(file: str, defines: Iterable[str] = (), costs: str | None = None, latency: float = 0.0,
                 profile: tuple[str, int | None] | None = None, model: str | None = None,
                 addons: Iterable[str] = ()) -> Compiled:
    """The library's entry point (the command line, the demo, the renderer and the tests call it): read
    FILE (a path or a library name; a .sched or a torch CSV schedule) and compile it. defines: NAME=VALUE
    params; costs: a measured-costs JSON; profile: (PipeFisher profile CSV, microbatch size) instead;
    model: a model description (TOML), whose layers per stage give tasks their units; addons: add-ons
    applied as `use NAME` would (`--with`). Raises SchedError on user errors; a schedule that fails its checks comes back with its diagnostics."""
    from .frontend.library import resolve
    path = resolve(file)
    if path.suffix == ".json":  # not parsed as a .sched: "unexpected '{'" said nothing useful
        raise SchedError(error(f"{file} is JSON (a compiled plan?), not a schedule: check, simulate, render and run "
                               "read a plan.json; give this command the .sched (or torch CSV) file"),
                         Source(str(path), ""), exit_code=2)
    options = replace(_options(parse_defines(defines), costs, profile, model), addons=tuple(addons))
    with collector_paused():
        if path.suffix == ".csv":
            refuse_addons(file, options.addons)
            from .interop.torch_csv import schedule_from_csv
            schedule = schedule_from_csv(path, options)
            return _with_imported_comms(compile_schedule(schedule, latency), path)
        else:
            schedule = build_schedule(read_source(path), options)
        return compile_schedule(schedule, latency)


def refuse_addons(file: str, addons: tuple[str, ...]) -> None:
    """A torch CSV schedule is a finished per-rank order, not a declaration an add-on can join: `--with`
    on one is a usage error (exit 2), not silently dropped."""
    if addons:
        raise SchedError(error(f"--with {addons[0]}: add-ons apply to .sched schedules; {Path(file).name} is a "
                               "torch CSV order (write a .sched with `use` instead)"), Source(file, ""), exit_code=2)


def _with_imported_comms(compiled: Compiled, path) -> Compiled:
    """A torch compute_comms CSV brings its own messages and actions: its streams replace the lowered
    plan, the channel check runs on them and torch's UNSHARD/RESHARD/REDUCE_GRAD cells are checked
    (torch checks neither in a hand-ordered compute_comms schedule)."""
    from .interop.torch_comms import check_torch_actions, comms_rows, comms_streams
    rows = comms_rows(read_source(path))
    if rows is None or compiled.plan is None:
        return compiled
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
            raise SchedError(error(f"expected NAME=VALUE, got {value!r}"), Source("-D", ""), exit_code=2)
        out[name.strip()] = text.strip()
    return out


def _options(params: dict[str, str], costs: str | None, profile: tuple[str, int | None] | None,
             model: str | None = None) -> Options:
    """Options from params and a costs JSON, or one row of a PipeFisher profile CSV (path, microbatch
    size, its costs one layer's); a model description gives its layer count."""
    layers = None
    if model:
        from .cluster import load_model_spec
        layers = load_model_spec(model).layers
    if profile:
        from .interop.profiles import profile_origin, read_profile, read_profile_memory
        return Options(params, read_profile(*profile), memory=read_profile_memory(*profile), model_layers=layers,
                       per_layer=True, measured=profile_origin(profile[0]))
    if not costs:
        return Options(params, {}, model_layers=layers)
    from .interop.profiles import costs_origin, load_costs, load_memory
    return Options(params, load_costs(costs), memory=load_memory(costs), model_layers=layers,
                   measured=costs_origin(costs))


__all__ = ["Compiled", "Options", "PASSES", "ANALYSIS", "Unit", "analyse", "read_source", "load_declaration", "build_schedule", "run_passes",
           "compile_schedule", "collector_paused", "compile_source", "compile_file", "parse_defines"]
