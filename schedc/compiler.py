"""The compiler driver: source text -> AST -> IR -> checks -> timing -> plan, one pass per line."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .check_channels import check_channels
from .check_deadlock import check_deadlock
from .check_memory import check_memory
from .check_structure import census, check_structure
from .diagnostics import Diagnostic, SchedError, Source, error, has_errors
from .elaborate import Options, elaborate
from .ir import Schedule
from .lower import lower
from .parse import decode_source, parse_source
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


def read_source(path: str | Path) -> Source:
    """Read a schedule file; a missing or unreadable file is a usage error (exit 2)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SchedError(error(f"cannot read file: {exc.strerror or exc}"), Source(str(path), ""),
                         exit_code=2) from None
    return decode_source(data, str(path))


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
        schedule, timing, notes = fill_bubbles(schedule, timing)  # tasks into idle gaps, a K-step cycle
        diagnostics += notes
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


def schedule_stats(schedule: Schedule, timing: Timing) -> dict[str, Any]:
    stats = timing.stats()
    stats.update(devices=schedule.devices, ops=schedule.op_count(), cycle_steps=len(schedule.steps))
    stats.update(timing.extra)
    return stats


__all__ = ["Compiled", "Options", "read_source", "build_schedule", "analyse", "compile_schedule",
           "collector_paused", "compile_source", "schedule_stats"]
