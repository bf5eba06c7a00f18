"""The compiler driver: source text -> AST -> IR -> checks -> timing -> plan, one pass per line."""
from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .checks.channels import check_channels
from .checks.deadlock import check_deadlock
from .checks.memory import check_memory
from .checks.structure import census, check_structure
from .diagnostics import Diagnostic, SchedError, Source, error, has_errors
from .frontend.elaborate import Options, elaborate
from .ir import Schedule
from .lower import lower
from .frontend.parse import parse_source, read_source
from .plan import Plan
from .simulate import Timing, simulate


@dataclass(frozen=True)
class Compiled:
    schedule: Schedule
    timing: Timing
    stats: dict[str, Any]
    plan: Plan | None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


def build_schedule(source: Source, options: Options | None = None) -> Schedule:
    """Parse and elaborate: text -> AST -> IR with per-device orders."""
    return elaborate(parse_source(source), source, options)


def analyse(schedule: Schedule, latency: float = 0.0) -> tuple[Schedule, Timing, list[Diagnostic]]:
    """Check and time a schedule; fill its bubbles when it asks for that."""
    counted = census(schedule)                                   # placed ops against the expected ones
    diagnostics = check_structure(schedule, counted)             # one F and one B per (stage, mb)
    timing = simulate(schedule, latency)                         # event-driven timing, memory peaks
    diagnostics += check_deadlock(schedule, timing, counted)     # program order + deps acyclic
    if schedule.fill and timing.complete and not has_errors(diagnostics):
        from .fill import fill_bubbles
        schedule, timing = fill_bubbles(schedule, timing)        # tasks into idle gaps, a K-step cycle
    diagnostics += check_memory(schedule, timing)                # peak per device within the limit
    return schedule, timing, diagnostics


def compile_schedule(schedule: Schedule, latency: float = 0.0) -> Compiled:
    schedule, timing, diagnostics = analyse(schedule, latency)
    stats = schedule_stats(schedule, timing)
    if has_errors(diagnostics):
        return Compiled(schedule, timing, stats, None, diagnostics)
    plan = lower(schedule, stats, timing)                        # sends, receives, grad sync, STEP
    diagnostics += check_channels(plan)                          # pairwise message order, rendezvous replay
    return Compiled(schedule, timing, stats, plan, diagnostics)


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
                 profile: tuple[str, int | None] | None = None) -> Compiled:
    """The library's entry point (the command line, the demo, the renderer and the tests call it): read
    FILE (a path or a library name; a .sched or a torch CSV schedule) and compile it. defines: NAME=VALUE
    params; costs: a measured-costs JSON; profile: (PipeFisher profile CSV, microbatch size) instead.
    Raises SchedError on user errors; a schedule that fails its checks comes back with its diagnostics."""
    from .frontend.library import resolve
    path = resolve(file)
    options = _options(parse_defines(defines), costs, profile)
    with collector_paused():
        if path.suffix == ".csv":
            from .interop.torch_csv import schedule_from_csv
            schedule = schedule_from_csv(path, options)
        else:
            schedule = build_schedule(read_source(path), options)
        return compile_schedule(schedule, latency)


def parse_defines(values: Iterable[str]) -> dict[str, str]:
    """-D NAME=VALUE pairs as a dict (later ones win); a malformed one is a usage error (exit 2)."""
    out = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise SchedError(error(f"expected NAME=VALUE, got {value!r}"), Source("-D", ""), exit_code=2)
        out[name.strip()] = text.strip()
    return out


def _options(params: dict[str, str], costs: str | None, profile: tuple[str, int | None] | None) -> Options:
    """Options from params and a costs JSON, or one row of a PipeFisher profile CSV (path, microbatch size)."""
    if profile:
        from .interop.profiles import read_profile, read_profile_memory
        return Options(params, read_profile(*profile), memory=read_profile_memory(*profile))
    if not costs:
        return Options(params, {})
    from .interop.profiles import load_costs, load_memory
    return Options(params, load_costs(costs), memory=load_memory(costs))


def schedule_stats(schedule: Schedule, timing: Timing) -> dict[str, Any]:
    stats = timing.stats()
    stats.update(devices=schedule.devices, ops=schedule.op_count(), cycle_steps=len(schedule.steps))
    stats.update(timing.extra)
    return stats


__all__ = ["Compiled", "Options", "read_source", "build_schedule", "analyse", "compile_schedule",
           "collector_paused", "compile_source", "compile_file", "parse_defines", "schedule_stats"]
