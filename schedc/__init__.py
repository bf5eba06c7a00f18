"""schedc: a compiler for pipeline-parallel training schedules.

The public API (loaded on first use, so that `import schedc.plan` or the runtime loads no compiler):

    from schedc import compile_file
    result = compile_file("1f1b", ["p=4", "m=8"])   # a Compiled: schedule, timing, stats, plan, diagnostics
    result.plan                                      # a Plan (write_plan writes it)

compile_file reads a .sched schedule or a torch CSV order (a library name or a path); load_input also
re-simulates a plan.json; compile_on_cluster compiles for a model on a cluster under a Layout
(ClusterRequest). Every name here is the driver's or the IR's own: `schedc.X is schedc.driver.X`.
"""
from __future__ import annotations

import importlib

# Each public name and the module that defines it (imported when the name is first asked for).
_HOMES = {
    "compile_file": "driver", "compile_source": "driver", "load_input": "driver", "kind_of": "driver",
    "compile_on_cluster": "driver.cluster", "Compiled": "passes.compiled", "Schedule": "ir", "Plan": "plan",
    "write_plan": "plan.write", "Layout": "layout", "ClusterRequest": "layout", "SchedError": "diagnostics",
}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'schedc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
