"""What a compile returns (the driver makes it; the renderer, the report and the search read it)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import Diagnostic, has_errors
from ..ir import Schedule
from ..plan import Plan
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
