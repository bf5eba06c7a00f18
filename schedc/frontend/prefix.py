"""The start of a schedule's order without the rest of it: each device's program run only until it
places its first backward (B, I or W), over the ops elaboration would give it. `schedc tune` bounds a
candidate's memory by it before elaborating the whole order (schedc/search/searcher.py): the
activations alive along a start of an order never exceed those alive at the order's peak.

    1f1b p=4 m=8: device 0 -> F(0,0) F(0,1) F(0,2) F(0,3) B(0,0)   (its whole order: 16 ops)

The starts are those of elaborate's orders only where the programs alone give the order; elsewhere
there is none (None): `order greedy` (the costs choose), `squeeze` (it moves ops after the programs
ran), tasks and fills, `recompute F` and `offload F` (the ops they add), `memory` declarations.
"""
from __future__ import annotations

from . import ast
from ..diagnostics import SchedError, Source, has_errors
from ..ir import Op
from ..ops import GRADIENT, MIXED_KINDS, SPLIT, builtin_kinds
from .elaborate import build_ops, shape_of
from .expr import EvalError, PipeRef
from .order import run_programs

BACKWARDS = frozenset(GRADIENT | SPLIT)  # where a device's start ends: its first B, I or W
# what makes the programs' orders other than elaborate's (or memory other than the order walk's)
_REORDERED = (ast.Greedy, ast.Squeeze, ast.TaskDecl, ast.Fill, ast.Recompute, ast.Offload, ast.MemoryDecl)


def order_starts(decl: ast.ScheduleDecl, source: Source, overrides: dict[str, str]
                 ) -> tuple[tuple[Op, ...], ...] | None:
    """Per device, its order up to and including its first backward (the whole order where it has
    none), as elaborate(decl, source, Options(overrides)) orders it; None where the programs alone do
    not give that order, or the schedule cannot be built (elaborate says why)."""
    programs = [d for d in decl.decls if isinstance(d, ast.Program)]
    if not programs or any(isinstance(d, _REORDERED) for d in decl.decls):
        return None
    queues = [d for d in decl.decls if isinstance(d, ast.QueueDecl)]
    split = any(isinstance(d, ast.SplitBackward) for d in decl.decls)
    mixed = any(isinstance(d, ast.MixedBackward) for d in decl.decls)
    try:
        env, devices, pipelines = shape_of(decl, source, overrides)
        kinds = MIXED_KINDS if mixed else builtin_kinds(split)
        ops = build_ops(pipelines, {kind: (0.0,) * pipelines[0].stages for kind in kinds}, split, mixed)
        env = {**env, **{p.name: PipeRef(p.name) for p in pipelines}}
        orders, diags = run_programs(programs, queues, ops, pipelines, devices, env, source, mixed,
                                     until=BACKWARDS)
    except (SchedError, EvalError):
        return None
    return None if has_errors(diags) else orders
