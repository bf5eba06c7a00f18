"""schedc: a compiler for pipeline-parallel training schedules.

The public API (loaded on first use, so that `import schedc.plan` or the runtime loads no compiler):

    from schedc import compile_file
    result = compile_file("1f1b", ["p=4", "m=8"])   # a Compiled: schedule, timing, stats, plan, diagnostics
    result.plan                                      # a Plan (schedc.plan.write.write_plan writes it)
"""
from __future__ import annotations

__all__ = ["compile_file", "Compiled", "Schedule", "Plan"]


def __getattr__(name: str):
    if name in ("compile_file", "Compiled"):
        from . import compiler
        return getattr(compiler, name)
    if name == "Schedule":
        from .ir import Schedule
        return Schedule
    if name == "Plan":
        from .plan import Plan
        return Plan
    raise AttributeError(f"module 'schedc' has no attribute {name!r}")
