"""User tasks (`task name(s, i) = cost after ... keeps ... split k at end`): expansion into ops.

    task curvature_A(s, i) = 1 after F(s, i)   with 2 stages, microbatches 0..1
    -> ops curvature_A(0,0) curvature_A(0,1) curvature_A(1,0) curvature_A(1,1), each after its F

A task's `split k` says how many units its work comes in (K-FAC: one per layer and factor; `layers`,
the model layers of stage s, is bound in a task's expressions): its instance is k pieces of cost / k,
each after the previous. `fill bubbles with t split n` cuts each instance into n pieces instead, and
`split auto` lets fill_bubbles choose how many pieces each unit becomes (refine_tasks). A piece finer
than a unit costs more: every piece beyond the units adds `cost piece` (per stage; 0 when undeclared),
the fixed cost of one more call (kernel launches, a synchronisation), so an instance of cost C in u
units cut into n >= u pieces costs C + (n - u) * piece in all.

Replicated pipelines (Chimera) hold copies of one model stage. A per-stage task `(s)` that is not
`at end` is *shared*: it is work on the model stage (K-FAC's inversion of the stage's factors), done once
per step cycle and split among the replicas — each replica's instance is its share (cost / replicas, a
part of the stage's layers), and `*` in its dependencies means the microbatches of every replica. An
`at end` task works on its own replica's gradients: full cost, `*` over its own pipeline's microbatches.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import ast
from ..diagnostics import SchedError, Source, error
from .expr import EvalError, compile_expr, evaluate_int
from ..ir import Dependencies, Op, Pipeline, Schedule, TaskSpec
from ..ops import BUILTIN, OpKind, builtin_kinds, cost_range, gradient_kind, in_cost_range

MAX_SPLIT = 1024
AUTO = "auto"  # `split auto` in a fill list: the compiler chooses the pieces
PIECE = "piece"  # `cost piece = e`: what every piece beyond a task's units adds


def _instances(task: ast.TaskDecl, pipe: Pipeline, source: Source) -> list[dict[str, int]]:
    if task.params in ((), ):
        return [{}]
    if task.params == ("s",):
        return [{"s": s} for s in range(pipe.stages)]
    if task.params == ("s", "i"):
        return [{"s": s, "i": i} for s in range(pipe.stages) for i in pipe.microbatches]
    raise SchedError(error(f"task '{task.name}' takes (), (s) or (s, i), not ({', '.join(task.params)})",
                           task.span), source)


def is_auto(expr: ast.Expr | None) -> bool:
    """`split auto`: the name auto in a split count."""
    return isinstance(expr, ast.Name) and expr.id == AUTO


def _count(expr: ast.Expr | None, scope: dict[str, Any], source: Source) -> int:
    if expr is None or is_auto(expr):
        return 1
    k = evaluate_int(expr, scope, "split count")
    if not 1 <= k <= MAX_SPLIT:
        raise SchedError(error(f"split count must be 1..{MAX_SPLIT}, got {k}", expr.span), source)
    return k


def _pieces(task: ast.TaskDecl, fill_split: ast.Expr | None, scope: dict[str, Any], replicas: int,
            source: Source) -> tuple[int, int]:
    """(units, pieces) of one instance: the task's own `split` spread over the replicas sharing it, and
    the fill's `split n` if it gives one (else the units; `split auto` refines them later)."""
    units = -(-_count(task.split, scope, source) // replicas)
    if fill_split is None or is_auto(fill_split):
        return units, units
    return units, _count(fill_split, scope, source)


def _resolve(dep: ast.Dep, scope: dict[str, Any], pipes: tuple[int, ...], pipelines: tuple[Pipeline, ...],
             parts: dict[tuple[str, int], int], split: bool, arities: dict[str, int]) -> list[Op]:
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
    return [Op(kind, stage, mb, k, part) for k, mb in pairs for part in range(parts.get((kind, stage), 1))]


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
                 source: Source, layers: tuple[int, ...] | None = None, scale: tuple[float, ...] | None = None,
                 budget: tuple[int, int] | None = None):
    """Return (specs, ops, deps, keeps, fill) for the declared tasks; fill lists (name, split) in priority.
    `layers[s]` is the model layers of stage s (1 each when not given), the name `layers` in a task.
    `scale[s]`: what a unit of a task's own cost (`task t(s) = 5`) is worth on stage s (a `cost t`
    declaration comes in `costs` already scaled). `budget`: (the expansion limit, what the built-in ops
    leave of it) for the task ops and their dependency entries (an op after F(s, *) has one per
    microbatch); a task that would pass it is refused at its declaration, its ops counted before any is
    made."""
    tasks = [d for d in decl.decls if isinstance(d, ast.TaskDecl)]
    fills = [item for d in decl.decls if isinstance(d, ast.Fill) for item in d.items]
    fill_split = {item.task: item.split for item in fills}
    groups = replica_groups(replicas, len(pipelines))
    arities = {t.name: len(t.params) for t in tasks}
    stages = pipelines[0].stages
    layers = layers or (1,) * stages
    piece = costs.get(PIECE, (0.0,) * stages)
    # (units, pieces) of every (task, stage); a dependency on a task names all of its pieces
    counts = {(t.name, s): _pieces(t, fill_split.get(t.name), {**env, "s": s, "layers": layers[s]},
                                   len(groups[0]) if t.params == ("s",) and not t.at_end else 1, source)
              for t in tasks for s in range(stages)}
    parts = {key: pieces for key, (_, pieces) in counts.items()}
    left = _Budget(*(budget or (None, None)))
    for task in tasks:
        left.take(_op_count(task, pipelines, parts), task, "ops", source)
    specs, ops, deps, keeps = [], [], {}, {}
    for task in tasks:
        if task.name in BUILTIN:
            raise SchedError(error(f"task name '{task.name}' is a built-in op", task.span), source)
        specs.append(TaskSpec(task.name, task.params, max(parts[task.name, s] for s in range(stages)),
                              task.at_end, task.span, is_auto(fill_split.get(task.name))))
        cost_fn = compile_expr(task.cost) if task.cost is not None else None
        for k, pipe in enumerate(pipelines):
            for inst in _instances(task, pipe, source):
                s = inst.get("s", 0)
                scope = {**env, **inst, "layers": layers[s]}
                total = _task_cost(task, cost_fn, scope, costs, scale, s, source)
                shared = task.params == ("s",) and not task.at_end
                pipes = groups[k] if shared else (k,)
                total /= len(pipes)
                units, k_parts = counts[task.name, s]
                total += max(0, k_parts - units) * piece[s]
                after = [op for dep in task.after
                         for op in _resolve(dep, scope, pipes, pipelines, parts, split_backward, arities)]
                kept = [op for dep in task.keeps
                        for op in _resolve(dep, scope, (k,), pipelines, parts, split_backward, arities)]
                left.take(k_parts * (len(after) + len(kept)), task, "dependencies", source)
                for op, op_deps in _chain(task, s, inst.get("i"), k, pipe.placement[s], total, k_parts, after):
                    ops.append(op)
                    deps[op] = op_deps
                    if kept:
                        keeps[op] = tuple(kept)
    _check_acyclic(deps, {t.name: t for t in tasks}, source)
    fill = tuple((item.task, max(parts[item.task, s] for s in range(stages))) for item in fills)
    return tuple(specs), ops, deps, keeps, fill


def _task_cost(task: ast.TaskDecl, cost_fn, scope: dict, costs: dict, scale, s: int, source: Source) -> float:
    """One instance's cost on stage s: a `cost t` declaration's (already scaled), else its own cost
    expression's (1 when it has none) times what a unit is worth on the stage."""
    if task.name in costs:
        return costs[task.name][s]
    own = _own_cost(task, cost_fn, scope, source) if cost_fn is not None else 1.0
    return own * (scale[s] if scale else 1.0)


def _chain(task: ast.TaskDecl, s: int, mb, k: int, device: int, total: float, k_parts: int, after: list):
    """The k_parts pieces of one task instance, each after the one before (the first after `after`):
    [(op, its dependencies)], the cost shared evenly."""
    chain, previous = [], None
    for part in range(k_parts):
        op = Op(task.name, s, mb, k, part, device, total / k_parts, task.span, k_parts)
        chain.append((op, tuple(after) + ((previous,) if previous else ())))
        previous = op
    return chain


def _check_acyclic(deps: dict[Op, tuple[Op, ...]], decls: dict[str, ast.TaskDecl], source: Source) -> None:
    """Task dependencies form no cycle (built-in ops depend on no task, so only tasks can close one):
    a cycle is refused at the first task in it, naming the ops around it (`a(0) -> b(0) -> a(0)`)."""
    state: dict[Op, int] = {}  # 1: on the current path, 2: done
    for root in deps:
        if root in state:
            continue
        path, stack = [], [(root, iter(deps.get(root, ())))]
        state[root] = 1
        path.append(root)
        while stack:
            node, preds = stack[-1]
            nxt = next(preds, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                shown = " -> ".join(map(str, reversed(cycle)))  # each op before the one that waits for it
                raise SchedError(error(f"task dependencies form a cycle: {shown} (each runs after the one before "
                                       "it), so none can run", decls[nxt.kind].span), source)
            elif nxt not in state and nxt in deps:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(deps[nxt])))


def _op_count(task: ast.TaskDecl, pipelines: tuple[Pipeline, ...], parts: dict[tuple[str, int], int]) -> int:
    """How many ops (pieces) a task expands to over every pipeline (0 for a parameter list _instances refuses)."""
    per_stage = [parts[task.name, s] for s in range(pipelines[0].stages)]
    if task.params == ():
        return per_stage[0] * len(pipelines)
    if task.params == ("s",):
        return sum(per_stage) * len(pipelines)
    if task.params == ("s", "i"):
        return sum(per_stage) * sum(len(pipe.microbatches) for pipe in pipelines)
    return 0


class _Budget:
    """What the expansion limit leaves for tasks (None: no limit), taken as their ops and dependency
    entries are counted."""

    def __init__(self, limit: int | None, left: int | None):
        self.limit, self.left = limit, left

    def take(self, count: int, task: ast.TaskDecl, what: str, source: Source) -> None:
        if self.left is None:
            return
        self.left -= count
        if self.left < 0:
            raise SchedError(error(f"task '{task.name}' would expand the schedule past {self.limit:,} ops and "
                                   f"dependency entries (its {what}, counted with the built-in ops and the "
                                   "tasks before it); refusing", task.span), source)


def refine_tasks(schedule: Schedule, cuts: dict[str, int]) -> Schedule:
    """The schedule with every piece of the tasks in `cuts` (kind -> j) cut into j pieces, each after the
    previous: piece q of an instance in p pieces of cost c becomes pieces q*j .. q*j + j-1 of p*j, each of
    cost c / j + piece * (j - 1) / j (`cost piece`, see the module docstring), so the instance costs
    (j - 1) * p pieces more. A task that depended on a cut piece depends on its last part; the chain of
    an instance keeps the shape expand_tasks gives it (deps..., previous piece).

        inversion(0)[1/2] inversion(0)[2/2], cost 4 each, j = 2, piece 0.5
        -> inversion(0)[1/4] .. inversion(0)[4/4], cost 2.25 each"""
    cuts = {kind: j for kind, j in cuts.items() if j > 1}
    if not cuts:
        return schedule
    piece = schedule.costs.get(PIECE, (0.0,) * schedule.stages)
    pieces: dict[Op, list[Op]] = {}
    for op in schedule.unplaced:
        j = cuts.get(op.kind, 1)
        if j > 1:
            cost = op.cost / j + piece[op.stage] * (j - 1) / j
            pieces[op] = [replace(op, part=op.part * j + q, parts=op.parts * j, cost=cost) for q in range(j)]

    def last(dep: Op) -> Op:
        return pieces[dep][-1] if dep in pieces else dep

    explicit, keeps, unplaced = {}, {}, []
    for op, deps in schedule.deps.explicit.items():
        deps = tuple(map(last, deps))
        if op not in pieces:
            explicit[op] = deps
            continue
        first = [dep for dep in deps if not (dep.kind == op.kind and dep.key[:4] == op.key[:4])]
        previous = deps[len(first):]
        for piece_op in pieces[op]:
            explicit[piece_op] = tuple(first) + previous
            previous = (piece_op,)
    for op, kept in schedule.keeps.items():
        for piece_op in pieces.get(op, (op,)):
            keeps[piece_op] = kept
    for op in schedule.unplaced:
        unplaced += pieces.get(op, [op])
    old = schedule.deps
    ops = tuple(new for op in old.ops for new in pieces.get(op, (op,)))
    deps = Dependencies(schedule.pipelines, old.costs, old.split, explicit, ops)
    specs = tuple(replace(spec, split=spec.split * cuts.get(spec.name, 1)) for spec in schedule.tasks)
    fill = tuple((name, split * cuts.get(name, 1)) for name, split in schedule.fill)
    return replace(schedule, deps=deps, keeps=keeps, unplaced=tuple(unplaced), tasks=specs, fill=fill)


def _own_cost(task: ast.TaskDecl, cost_fn, scope: dict, source: Source) -> float:
    """`task t(s) = e`: e at this instance, a finite cost >= 0 (as `cost t = e` must be), refused at e."""
    value = float(cost_fn(scope))
    if not in_cost_range(value):
        shown = ", ".join(f"{k}={v}" for k, v in scope.items() if k in ("s", "i") or k in task.params)
        raise SchedError(error(f"cost of task {task.name} must be {cost_range()}, got {value:g}"
                               + (f" (at {shown})" if shown else ""), task.cost.span), source)
    return value
