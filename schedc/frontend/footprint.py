"""What a schedule's declarations say about memory: the activation units a forward holds per stage, the
`memory` declarations of tasks and kinds, and `limit memory` per device."""
from __future__ import annotations

from ..diagnostics import Source
from ..ops import MIXED_KINDS, builtin_kinds
from . import ast
from .expr import compile_expr
from .params import fail_at, per_stage


def memory_of(decl, env, stages: int, split: bool, tasks: set[str], source: Source,
            given: dict[str, tuple[float, ...] | float],
            mixed: bool = False) -> tuple[tuple[float, ...], dict[str, tuple[float, ...]]]:
    """`memory K(s) = e` per stage: F's activation units, and the other kinds' (B's saved gradient, I's
    with `backward split`; a task's persistent state). Measured values (a profile) win where the kind
    exists in the schedule."""
    kinds = set(MIXED_KINDS if mixed else builtin_kinds(split)) | tasks
    decls = [d for d in decl.decls if isinstance(d, ast.MemoryDecl)]
    for d in decls:
        if d.kind not in kinds and not (split and d.kind == "B"):
            raise fail_at(f"memory of unknown kind '{d.kind}' (kinds: {', '.join(sorted(kinds))})", d.span, source)
    given = {k: v for k, v in given.items() if k in kinds or (split and k == "B")}
    table = (per_stage(decls, {"F": 1.0}, env, stages, source, given, "memory") if decls or given
             else {"F": (1.0,) * stages})
    if split and "B" in table:
        table["I"] = table.pop("B")  # B's saved gradient is I's when backward is split, as in `keeps B(s, i)`
    activation = table.pop("F")
    return activation, {k: v for k, v in table.items() if any(v)}


def memory_limit_of(decl, env, devices, source: Source, of=ast.Limit):
    """`limit memory <= e` (`of` HostLimit: `limit host_memory <= e`): per device (d bound), activation
    units, a number >= 0 (a negative limit no op could meet was reported at every device's first
    forward instead of here)."""
    for d in decl.decls:
        if isinstance(d, of):
            fn = compile_expr(d.value)
            limits = tuple(float(fn({**env, "d": dev})) for dev in range(devices))
            bad = next((v for v in limits if not v >= 0), None)  # NaN too; inf: no limit
            if bad is not None:
                shown = ", ".join(f"{k}={v}" for k, v in env.items())
                what = "memory" if of is ast.Limit else "host_memory"
                raise fail_at(f"limit {what} must be a number >= 0, got {bad:g}", d.span, source,
                            notes=(f"with {shown}",) if shown else ())
            return limits, d.span
    return None, None
