"""What a schedule places beside F and B to spend less device memory on saved activations:
recomputation (`recompute F`: every forward drops its state and an op R, placed by the program,
rebuilds it before the backward) and offload (`offload F`: a program may place O after a forward and L
before its backward, which copy the state to host memory and back on the device's copy engine).

    recompute F; on device d { F R B }          ->  F(0,0) R(0,0) B(0,0): B reads what R rebuilt
    offload F;   on device d { F O L B }        ->  B waits for L, L for O, O for F; O and L run beside compute

R costs what the forward does unless `cost R` says otherwise; O and L the forward's unless `cost O` /
`cost L` (or a cluster's host link, costmodel/) say otherwise. O and L are optional per (stage,
microbatch): the program places both or neither (check_structure reports a lone one).
"""
from __future__ import annotations

from ..diagnostics import Source
from ..ir import Dependencies, Op
from ..ops import COPY, OpKind
from . import ast
from .footprint import memory_limit_of
from .params import fail_at


def recomputes(decl: ast.ScheduleDecl, mixed: bool, source: Source) -> bool:
    """Whether the schedule declares `recompute F` (of F only; not with `backward mixed`)."""
    found = [d for d in decl.decls if isinstance(d, ast.Recompute)]
    for d in found:
        if d.kind != OpKind.F:
            raise fail_at(f"'recompute {d.kind}': only a forward's saved state is recomputed (recompute F)",
                          d.span, source)
        if mixed:
            raise fail_at("'recompute F' and 'backward mixed' do not go together", d.span, source)
    return bool(found)


def placed_costs(costs: dict[str, tuple[float, ...]], cost_decls: list, kinds) -> dict[str, tuple[float, ...]]:
    """The cost per stage of each of `kinds` (R, O, L): as declared (or measured, or the cluster's),
    else the forward's (R runs the forward again; a copy of its state takes, without a cluster's host
    link, as long)."""
    declared = {d.kind for d in cost_decls} | set(costs)
    return {**costs, **{kind: costs[OpKind.F.value] for kind in kinds if kind not in declared}}


def offloads(decl: ast.ScheduleDecl, mixed: bool, recompute: bool, source: Source) -> bool:
    """Whether the schedule declares `offload F` (of F only; not with `backward mixed` or `recompute F`:
    a forward's state is either kept, offloaded or recomputed)."""
    found = [d for d in decl.decls if isinstance(d, ast.Offload)]
    for d in found:
        if d.kind != OpKind.F:
            raise fail_at(f"'offload {d.kind}': only a forward's saved state is offloaded (offload F)", d.span, source)
        if mixed or recompute:
            raise fail_at(f"'offload F' and '{'backward mixed' if mixed else 'recompute F'}' do not go together",
                          d.span, source)
    if found and not any(isinstance(d, ast.Program) for d in decl.decls):
        raise fail_at("'offload F': the programs place O and L; give 'on device' programs", found[0].span, source)
    return bool(found)


def offloaded_units(orders) -> frozenset:
    """The (pipe, stage, mb) for which the programs placed an O or an L."""
    return frozenset((op.pipe, op.stage, op.mb) for order in orders for op in order if op.kind in COPY)


def copy_kinds(offload: bool) -> tuple[str, ...]:
    """The copy-engine kinds a (stage, microbatch) may have: O and L with `offload F`."""
    return (OpKind.O.value, OpKind.L.value) if offload else ()


def offloaded_dependencies(orders, ops: list[Op], task_ops: list[Op], deps: Dependencies, pipelines, costs,
                            split: bool) -> Dependencies:
    """With `offload F`: the dependencies of the ops placed (an O and L not placed do not run), each
    backward of an offloaded (stage, microbatch) after its L."""
    offloaded = offloaded_units(orders)
    grid = tuple(op for op in ops if op.kind not in COPY or (op.pipe, op.stage, op.mb) in offloaded)
    return Dependencies(pipelines, costs, split, deps.explicit, grid + tuple(task_ops), deps.recompute, offloaded)


def host_limit(decl: ast.ScheduleDecl, env: dict, devices: int, source: Source) -> dict:
    """`limit host_memory <= e` as the Schedule's host_limit and its span (with `offload F` only)."""
    limit, span = memory_limit_of(decl, env, devices, source, ast.HostLimit)
    if limit is not None and not any(isinstance(d, ast.Offload) for d in decl.decls):
        raise fail_at("'limit host_memory': nothing goes to the host without 'offload F'", span, source)
    return {"host_limit": limit, "host_limit_span": span}
