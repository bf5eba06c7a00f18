"""User tasks (`task name(s, i) = cost after ... keeps ... split k at end`): expansion into ops.

    task curvature_A(s, i) = 1 after F(s, i)   with 2 stages, microbatches 0..1
    -> ops curvature_A(0,0) curvature_A(0,1) curvature_A(1,0) curvature_A(1,1), each after its F

Replicated pipelines (Chimera) hold copies of one model stage. A per-stage task `(s)` that is not
`at end` is *shared*: it is work on the model stage (K-FAC's inversion of the stage's factors), done once
per step cycle and split among the replicas — each replica's instance is its share (cost / replicas, a
part of the stage's layers), and `*` in its dependencies means the microbatches of every replica. An
`at end` task works on its own replica's gradients: full cost, `*` over its own pipeline's microbatches.
"""
from __future__ import annotations

from typing import Any

from . import ast
from ..diagnostics import SchedError, Source, error
from .expr import EvalError, compile_expr, evaluate_int
from ..ir import Op, Pipeline, TaskSpec
from ..ops import BUILTIN, OpKind, builtin_kinds, gradient_kind

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


def _resolve(dep: ast.Dep, scope: dict[str, Any], pipes: tuple[int, ...], pipelines: tuple[Pipeline, ...],
             parts: dict[str, int], split: bool, arities: dict[str, int]) -> list[Op]:
    """Ops named by a dependency clause, e.g. F(s, i) or curvature_A(s, *); `pipes[0]` is the task's
    pipeline, `*` covers the microbatches of all `pipes` (the replicas of a shared task)."""
    kind = gradient_kind(split) if dep.kind == OpKind.B else dep.kind
    if len(dep.args) > 2:
        raise EvalError(f"{dep.kind}(...) takes a stage and at most a microbatch", dep.span)
    stage = evaluate_int(dep.args[0], scope, "dependency stage")
    if len(dep.args) == 1:
        pairs: list[tuple[int, int | None]] = [(pipes[0], None)]
    elif isinstance(dep.args[1], ast.Star):
        pairs = [(k, mb) for k in pipes for mb in pipelines[k].microbatches]
    else:
        pairs = [(pipes[0], evaluate_int(dep.args[1], scope, "dependency microbatch"))]
    for k, mb in pairs:
        _check_dep(dep, kind, stage, mb, pipelines[k], arities, split)
    return [Op(kind, stage, mb, k, part) for k, mb in pairs for part in range(parts.get(kind, 1))]


def _check_dep(dep: ast.Dep, kind: str, stage: int, mb: int | None, pipe: Pipeline, arities: dict[str, int],
               split: bool) -> None:
    """A dependency must name an op that exists: a known kind, a stage and microbatch of the pipeline."""
    builtin = dict.fromkeys(builtin_kinds(split), 2)
    arity = builtin.get(kind, arities.get(kind))
    if arity is None:
        known = ", ".join([*builtin, *arities])
        raise EvalError(f"'{dep.kind}' is neither an op kind nor a task (known: {known})", dep.span)
    label = f"{dep.kind}({stage}{'' if mb is None else f', {mb}'})"
    if not 0 <= stage < pipe.stages:
        raise EvalError(f"{label} names stage {stage}, but pipeline '{pipe.name}' has stages "
                        f"0..{pipe.stages - 1}", dep.span)
    if arity == 2 and (mb is None or mb not in pipe.microbatches):
        raise EvalError(f"{label} needs a microbatch of pipeline '{pipe.name}' "
                        f"({pipe.microbatches[0]}..{pipe.microbatches[-1]}) or '*'", dep.span)
    if arity == 1 and mb is not None:
        raise EvalError(f"{label}: task '{kind}' takes a stage only", dep.span)


def replica_groups(replicas: tuple[tuple[int, ...], ...], pipelines: int) -> dict[int, tuple[int, ...]]:
    """Pipeline index -> the indices of its replica group, itself first (alone when not replicated)."""
    groups = {k: (k,) for k in range(pipelines)}
    for members in replicas:
        for k in members:
            groups[k] = (k, *[j for j in members if j != k])
    return groups


def expand_tasks(decl: ast.ScheduleDecl, env: dict[str, Any], pipelines: tuple[Pipeline, ...],
                 replicas: tuple[tuple[int, ...], ...], split_backward: bool, costs: dict[str, tuple[float, ...]],
                 source: Source):
    """Return (specs, ops, deps, keeps, fill) for the declared tasks; fill lists (name, split) in priority."""
    tasks = [d for d in decl.decls if isinstance(d, ast.TaskDecl)]
    fills = [item for d in decl.decls if isinstance(d, ast.Fill) for item in d.items]
    names = {t.name for t in tasks}
    for item in fills:
        if item.task not in names:
            raise SchedError(error(f"unknown task '{item.task}' in fill (tasks: {', '.join(sorted(names))})",
                                   item.span), source)
    fill_split = {item.task: item.split for item in fills}
    parts = {t.name: _split(t, fill_split, env, source) for t in tasks}
    groups = replica_groups(replicas, len(pipelines))
    arities = {t.name: len(t.params) for t in tasks}
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
                shared = task.params == ("s",) and not task.at_end
                pipes = groups[k] if shared else (k,)
                total /= len(pipes)
                after = [op for dep in task.after
                         for op in _resolve(dep, scope, pipes, pipelines, parts, split_backward, arities)]
                kept = [op for dep in task.keeps
                        for op in _resolve(dep, scope, (k,), pipelines, parts, split_backward, arities)]
                previous = None
                for part in range(k_parts):
                    op = Op(task.name, s, inst.get("i"), k, part, pipe.placement[s], total / k_parts, task.span,
                            k_parts)
                    ops.append(op)
                    deps[op] = tuple(after) + ((previous,) if previous else ())
                    if kept:
                        keeps[op] = tuple(kept)
                    previous = op
    fill = tuple((item.task, parts[item.task]) for item in fills)
    return tuple(specs), ops, deps, keeps, fill
