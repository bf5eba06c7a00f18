"""check_memory: peak activation memory per device against `limit memory <= expr`."""
from __future__ import annotations

from .diagnostics import Diagnostic, error
from .ir import Schedule
from .simulate import Timing


def check_memory(schedule: Schedule, timing: Timing) -> list[Diagnostic]:
    if schedule.memory_limit is None:
        return []
    return [error(f"device {d}: peak memory {peak:g} exceeds the limit {limit:g}", schedule.memory_limit_span)
            for d, (peak, limit) in enumerate(zip(timing.peak_memory, schedule.memory_limit)) if peak > limit]
