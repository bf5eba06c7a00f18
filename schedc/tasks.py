"""User tasks (`task name(s, i) = cost after ... keeps ... split k at end`): expansion into ops.

    task curvature_A(s, i) = 1 after F(s, i)   with 2 stages, microbatches 0..1
    -> ops curvature_A(0,0) curvature_A(0,1) curvature_A(1,0) curvature_A(1,1), each after its F
"""
from __future__ import annotations

from typing import Any

from . import ast
from .diagnostics import SchedError, Source, error
from .expr import EvalError, compile_expr, evaluate_int
from .ir import BUILTIN, Op, Pipeline, TaskSpec

MAX_SPLIT = 1024


def _instances(task: ast.TaskDecl, pipe: Pipeline, source: Source) -> list[dict[str, int]]:
    if task.params in ((), ):
        return [{}]
    if task.params == ("s",):
        return [{"s": s} for s in range(pipe.stages)]
    if task.params == ("s", "i"):
        return [{"s": s, "i": i} for s in range(pipe.stages) for i in pipe.microbatches]
    raise SchedError(error(f"task '{task.name}' takes (), (s) or (s, i), not ({', '.join(task.params)})",
                           task.span), source)


def _split(task: ast.TaskDecl, fill_split: dict[str, ast.Expr | None], env: dict[str, Any], source) -> int:
    expr = fill_split.get(task.name) or task.split
    if expr is None:
        return 1
    k = evaluate_int(expr, env, "split count")
    if not 1 <= k <= MAX_SPLIT:
        raise SchedError(error(f"split count must be 1..{MAX_SPLIT}, got {k}", expr.span), source)
    return k


def _resolve(dep: ast.Dep, scope: dict[str, Any], pipe_index: int, pipe: Pipeline, parts: dict[str, int],
             split: bool) -> list[Op]:
    """Ops named by a dependency clause, e.g. F(s, i) or curvature_A(s, *)."""
    kind = "I" if dep.kind == "B" and split else dep.kind
    stage = evaluate_int(dep.args[0], scope, "dependency stage")
    if len(dep.args) == 1:
        mbs: list[int | None] = [None]
    elif isinstance(dep.args[1], ast.Star):
        mbs = list(pipe.microbatches)
    else:
        mbs = [evaluate_int(dep.args[1], scope, "dependency microbatch")]
    return [Op(kind, stage, mb, pipe_index, part) for mb in mbs for part in range(parts.get(kind, 1))]


def expand_tasks(decl: ast.ScheduleDecl, env: dict[str, Any], pipelines: tuple[Pipeline, ...],
                 costs: dict[str, tuple[float, ...]], source: Source):
    """Return (specs, ops, deps, keeps, fill) for the declared tasks; fill lists (name, split) in priority."""
    tasks = [d for d in decl.decls if isinstance(d, ast.TaskDecl)]
    fills = [item for d in decl.decls if isinstance(d, ast.Fill) for item in d.items]
    names = {t.name for t in tasks}
    for item in fills:
        if item.task not in names:
            raise SchedError(error(f"unknown task '{item.task}' in fill (tasks: {', '.join(sorted(names))})",
                                   item.span), source)
    split_backward = any(isinstance(d, ast.SplitBackward) for d in decl.decls)
    fill_split = {item.task: item.split for item in fills}
    parts = {t.name: _split(t, fill_split, env, source) for t in tasks}
    specs, ops, deps, keeps = [], [], {}, {}
    for task in tasks:
        if task.name in BUILTIN:
            raise SchedError(error(f"task name '{task.name}' is a built-in op", task.span), source)
        k_parts = parts[task.name]
        specs.append(TaskSpec(task.name, task.params, k_parts, task.at_end, task.span))
        cost_fn = compile_expr(task.cost) if task.cost is not None else None
        for k, pipe in enumerate(pipelines):
            for inst in _instances(task, pipe, source):
                scope = {**env, **inst}
                s = inst.get("s", 0)
                if task.name in costs:
                    total = costs[task.name][s]
                elif cost_fn is not None:
                    total = float(cost_fn(scope))
                else:
                    total = 1.0
                after = [op for dep in task.after for op in _resolve(dep, scope, k, pipe, parts, split_backward)]
                kept = [op for dep in task.keeps for op in _resolve(dep, scope, k, pipe, parts, split_backward)]
                previous = None
                for part in range(k_parts):
                    op = Op(task.name, s, inst.get("i"), k, part, pipe.placement[s], total / k_parts, task.span,
                            k_parts)
                    ops.append(op)
                    deps[op] = tuple(after) + ((previous,) if previous else ())
                    if kept:
                        keeps[op] = tuple(kept)
                    previous = op
    try:
        fill = tuple((item.task, parts[item.task]) for item in fills)
    except EvalError:
        raise
    return tuple(specs), ops, deps, keeps, fill
