"""check_structure: every (stage, microbatch) of every pipeline has exactly one F and one B (or one I
and one W) on the stage's device, and nothing else runs outside the declared ranges."""
from __future__ import annotations

from .diagnostics import Diagnostic
from .ir import Schedule


def check_structure(schedule: Schedule) -> list[Diagnostic]:
    return []
