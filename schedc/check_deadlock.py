"""check_deadlock: program order plus data dependencies must be acyclic."""
from __future__ import annotations

from .diagnostics import Diagnostic, error
from .ir import Schedule
from .simulate import Timing


def check_deadlock(schedule: Schedule, timing: Timing) -> list[Diagnostic]:
    if timing.complete:
        return []
    stuck = [order[0] for order in schedule.orders if order]
    return [error(f"the schedule deadlocks ({len(schedule.deps)} ops, {len(timing.end)} can run)",
                  stuck[0].span if stuck else None)]
