"""Elaboration: AST -> IR. Evaluates params and requires, expands pipelines into ops and runs the
order strategy (per-device programs over queues, explicit lists, or greedy list scheduling).

    schedule one_f_one_b ...  pipeline main { stages 2; ... microbatches 2 }  on device d { F F B B }
    -> Schedule(orders=((F(0,0), F(0,1), B(0,0), B(0,1)), (F(1,0), F(1,1), B(1,0), B(1,1))), ...)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

from . import ast
from ..budget import COMPILE_OPS, REFUSED, SQUEEZE_SLOTS
from ..diagnostics import SCHEDULE, USAGE, SchedError, Source, error, has_errors
from .expr import EvalError, PipeRef, evaluate_int, kind_lists
from ..ir import OP_KEY, Dependencies, Op, Pipeline, Schedule, ops_from_columns
from ..ops import (BUILTIN, DEFAULT_COSTS, MIXED_KINDS, OVERLAP, OpKind, absent_kind, builtin_kinds)
from ..layout import SplitError, split_layers
from .greedy import order_greedy
from .order import run_programs
from .queues import chunk_index
from .footprint import memory_limit_of, memory_of
from .params import bind_params, check_declared_once, fail_at, int_values, per_stage
from .placed import copy_kinds, host_limit, offloaded_dependencies, offloads, placed_costs, recomputes
from .sequence import chunk_count, cost_column, per_unit, same_chunks, units

# The expansion limit: the most ops a schedule may expand to by default, every front end and task
# included (budget.COMPILE_OPS, --max-ops). Render holds itself to less (render.MAX_RENDER_OPS).
MAX_OPS = COMPILE_OPS.limit
# The most devices (ranks) a schedule may have: every pass keeps something per device, and a plan is a
# stream file per rank (at 100,000 devices `check` alone took 20 s of CPU).
MAX_DEVICES = 16_384


@dataclass
class Options:
    """What the command line adds to a schedule: param overrides and measured costs."""

    overrides: dict[str, str] = field(default_factory=dict)
    costs: dict[str, tuple[float, ...] | float] = field(default_factory=dict)  # kind -> per-stage or flat
    memory: dict[str, tuple[float, ...] | float] = field(default_factory=dict)  # measured `memory K(s)`, units
    max_ops: int = MAX_OPS
    addons: tuple[str, ...] = ()     # `--with NAME`: add-ons used as by `use NAME` (compose.py)
    model_layers: int | None = None  # a model description's layers, spread over the stages (`layers`)
    layer_split: tuple = (None, False, False)  # how: the layout's --stage-layers, --account-for-embedding,
    #                                  --account-for-loss (schedc.layout.split_layers' last three arguments)
    per_layer: bool = False          # the measured costs are one layer's (a profile row): times layers
    measured: Any = None             # where measured costs came from (interop.profiles.Measured): their
    # kinds are checked against the schedule's, none left to the unit defaults
    task_scale: tuple[float, ...] | None = None  # per stage, what one declared unit of a task's cost (and
    #                                  `cost piece`) is worth: --cluster's seconds per forward of the stage
    chunk_costs: dict | None = None  # sequence chunks under --cluster: kind -> stage -> chunk j -> its cost
    #                                  over an even 1/k share (costmodel.stages.chunk_multipliers)
    max_ops_why: str = COMPILE_OPS.why  # what the refusal past max_ops says to do (render's own: RENDER_OPS)
    shape_only: bool = False  # the schedule's shape alone (its params, pipelines, stage layers and declared
    #                           costs), every device's order empty: what --cluster reads before costing it


def build_pipelines(decl: ast.ScheduleDecl, env: dict[str, Any], devices: int, source: Source,
                    max_ops: int, why: str = COMPILE_OPS.why) -> tuple[Pipeline, ...]:
    """The declared pipelines; refused before expansion when their ops (stages x microbatches x the op
    kinds each stage and microbatch gets: F B, F I W, or all four with a mixed backward) pass max_ops."""
    kinds = _grid_kinds(decl)
    pipelines, owner, total = [], {}, 0
    for pd in (d for d in decl.decls if isinstance(d, ast.PipelineDecl)):
        if pd.stages is None or pd.mb_stop is None:
            raise fail_at(f"pipeline '{pd.name}' needs 'stages' and 'microbatches'", pd.span, source)
        stages = evaluate_int(pd.stages, env, "stage count")
        mbs = int_values(pd.mb_start, pd.mb_stop, env)
        chunks = chunk_count(pd, env, source)
        if stages < 1 or len(mbs) < 1:
            raise fail_at(f"pipeline '{pd.name}' has {stages} stages and {len(mbs)} microbatches; "
                        "both must be at least 1", pd.span, source)
        total += stages * len(mbs) * chunks * kinds
        if total > max_ops:
            per = f" x {chunks:,} chunks" if chunks > 1 else ""
            raise fail_at(f"schedule would expand to more than {max_ops:,} ops "
                          f"({stages:,} stages x {len(mbs):,} microbatches{per} x {kinds} op kinds); refusing "
                          f"({why})", pd.span, source, REFUSED)
        placement = []
        for s in range(stages):
            device = evaluate_int(pd.placement, {**env, pd.stage_var: s}, "device") if pd.placement else s
            if not 0 <= device < devices:
                raise fail_at(f"stage {s} of pipeline '{pd.name}' is placed on device {device}, "
                            f"but devices are 0..{devices - 1}", pd.placement_span or pd.span, source)
            placement.append(device)
        for mb in mbs:
            if mb < 0 or mb in owner:
                why = "is negative" if mb < 0 else f"is already owned by pipeline '{owner[mb]}'"
                raise fail_at(f"microbatch {mb} of pipeline '{pd.name}' {why}", pd.span, source)
            owner[mb] = pd.name
        pipelines.append(Pipeline(pd.name, stages, tuple(placement), units(mbs, chunks), pd.span, chunks))
    if not pipelines:
        raise fail_at("a schedule needs at least one pipeline", decl.span, source)
    if sorted(owner) != list(range(len(owner))):
        raise fail_at(f"microbatches must be numbered 0..{len(owner) - 1} across pipelines", pipelines[0].span,
                    source)
    same_chunks(pipelines, source)
    return tuple(pipelines)


def _device_count(decl: ast.ScheduleDecl, env: dict[str, Any], source: Source, overrides: dict[str, str]) -> int:
    """`devices e`, else the param p: 1..MAX_DEVICES; a p given with -D that is none is a usage error
    (exit 2), as any -D value that is not one is."""
    for d in decl.decls:
        if isinstance(d, ast.Devices):
            count = evaluate_int(d.count, env, "device count")
            if not 1 <= count <= MAX_DEVICES:
                raise fail_at(f"device count must be 1..{MAX_DEVICES:,}, got {count:,}", d.span, source)
            return count
    p = env.get("p")
    if isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= MAX_DEVICES:
        return p
    if "p" in env:
        param = next(d for d in decl.decls if isinstance(d, ast.Param) and d.name == "p")
        given = "p" in overrides
        raise fail_at(f"param p is the device count and must be an integer 1..{MAX_DEVICES:,}, got {env['p']}",
                    param.span, source, kind=USAGE if given else SCHEDULE,
                    notes=(f"p was given with -D p={overrides['p']}",) if given else ())
    raise fail_at("say how many devices there are: 'devices <expr>' (or a param p)", decl.span, source)


def _replicas(decl: ast.ScheduleDecl, pipelines: tuple[Pipeline, ...], source: Source) -> tuple:
    index = {p.name: k for k, p in enumerate(pipelines)}
    groups = []
    for rep in (d for d in decl.decls if isinstance(d, ast.Replicate)):
        for name in rep.pipelines:
            if name not in index:
                raise fail_at(f"unknown pipeline '{name}' (pipelines: {', '.join(index)})", rep.span, source)
        members = tuple(index[n] for n in rep.pipelines)
        if len({pipelines[k].stages for k in members}) != 1:
            raise fail_at("replicated pipelines must have the same number of stages", rep.span, source)
        groups.append(members)
    covered = {k for g in groups for k in g}
    if len(pipelines) > 1 and covered != set(range(len(pipelines))):
        raise fail_at("several pipelines must be declared copies of one model: 'replicate a, b'",
                    pipelines[1].span, source)
    return tuple(groups)


def _scaled_tasks(costs: dict[str, tuple[float, ...]], tasks: set[str],
                  scale: tuple[float, ...] | None) -> dict[str, tuple[float, ...]]:
    """The declared costs of tasks and `cost piece` times the per-stage scale (Options.task_scale)."""
    if scale is None:
        return costs
    return {kind: tuple(c * f for c, f in zip(value, scale)) if kind in tasks or kind == "piece" else value
            for kind, value in costs.items()}


def build_ops(pipelines: tuple[Pipeline, ...], costs: dict[str, tuple[float, ...]], split: bool,
              mixed: bool = False, recompute: bool = False, offload: bool = False, by_chunk: dict | None = None
              ) -> list[Op]:
    """The built-in ops, pipeline by pipeline, stage by stage, microbatch by microbatch, kind by kind
    (F B, F I W, or all four with a mixed backward: the programs choose); made column by column, as a big
    schedule has 10^5 of them. `by_chunk`: per kind, stage and sequence chunk, a factor on the cost."""
    kinds, ops = (MIXED_KINDS if mixed else builtin_kinds(split, recompute) + copy_kinds(offload)), []
    for k, pipe in enumerate(pipelines):
        mbs, stages = pipe.microbatches, range(pipe.stages)
        per_stage = len(mbs) * len(kinds)
        ops += ops_from_columns(
            per_stage * pipe.stages,
            kinds * (len(mbs) * pipe.stages),                                             # kind
            chain.from_iterable(repeat(s, per_stage) for s in stages),                    # stage
            [mb for mb in mbs for _ in kinds] * pipe.stages,                              # mb
            repeat(k), repeat(0),                                                         # pipe, part
            chain.from_iterable(repeat(pipe.placement[s], per_stage) for s in stages),    # device
            cost_column(costs, kinds, mbs, stages, pipe.chunks, by_chunk),                   # cost
            repeat(None), repeat(pipe.chunks))                                            # span, parts
    return ops


def elaborate(decl: ast.ScheduleDecl, source: Source, options: Options | None = None) -> Schedule:
    """AST -> Schedule. Raises SchedError with every diagnostic it can collect."""
    options = options or Options()
    try:
        return _elaborate(decl, source, options)
    except EvalError as exc:
        given = _given_value(exc.message, options.overrides)
        if given:  # `-D m=2.5`: the command line's value is at fault, not the line that reads it
            raise fail_at(exc.message, exc.span, source, USAGE, notes=(f"{given} was given with -D {given}="
                                                                       f"{options.overrides[given]}",)) from None
        raise fail_at(exc.message, exc.span, source) from None


def _given_value(message: str, params: dict[str, str]) -> str | None:
    """The -D param whose value an evaluation error names (`... must be an integer, got 2.5`), if any."""
    return next((name for name, value in params.items() if value and message.endswith(f"got {value}")), None)


def shape_of(decl: ast.ScheduleDecl, source: Source, overrides: dict[str, str]) -> tuple[dict[str, Any], int, tuple[Pipeline, ...]]:
    """A schedule's params (its requires checked), device count and pipelines, without expanding its
    ops or running its order: what `schedc tune` asks of every candidate before simulating any."""
    try:
        env = bind_params(decl, source, overrides)
        devices = _device_count(decl, env, source, overrides)
        return env, devices, build_pipelines(decl, env, devices, source, MAX_OPS)
    except EvalError as exc:
        raise fail_at(exc.message, exc.span, source) from None


def stage_count(decl: ast.ScheduleDecl, source: Source, overrides: dict[str, str]) -> int | None:
    """The first pipeline's stage count under these params, its requires not checked; None if it cannot
    be evaluated (`schedc tune` asks whether a refused candidate's stages divide the layers at all)."""
    try:
        env = bind_params(decl, source, overrides, requires=False)
        first = next((d for d in decl.decls if isinstance(d, ast.PipelineDecl)), None)  # as build_pipelines
        return None if first is None or first.stages is None else evaluate_int(first.stages, env, "stage count")
    except (SchedError, EvalError):
        return None


def _elaborate(decl: ast.ScheduleDecl, source: Source, options: Options) -> Schedule:
    check_declared_once(decl, source)
    env = bind_params(decl, source, options.overrides)
    devices = _device_count(decl, env, source, options.overrides)
    pipelines = build_pipelines(decl, env, devices, source, options.max_ops, options.max_ops_why)
    replicas = _replicas(decl, pipelines, source)
    stages = pipelines[0].stages
    split = any(isinstance(d, ast.SplitBackward) for d in decl.decls)
    mixed = _mixed_backward(decl, split, source)
    recompute = recomputes(decl, mixed, source)
    offload = offloads(decl, mixed, recompute, source)
    task_decls = [d for d in decl.decls if isinstance(d, ast.TaskDecl)]
    cost_decls = [d for d in decl.decls if isinstance(d, ast.CostDecl)]
    _check_kinds(decl, cost_decls, split, mixed, {t.name for t in task_decls}, source, recompute, offload)
    _check_fill(decl, {t.name for t in task_decls}, source)
    task_names = [t.name for t in task_decls]
    if options.measured is not None:  # with `backward mixed`, the backwards the programs chose: below
        _check_measured(options, [OpKind.F.value] if mixed else [*builtin_kinds(split), *task_names], task_names,
                        split, mixed)
    layers = stage_layers(options.model_layers, stages, decl, source, options.layer_split)
    costs, activation, memory = _costs_and_memory(decl, env, pipelines, split, mixed, cost_decls, task_names, source,
                                                  options, layers)
    costs = placed_costs(costs, cost_decls, (OpKind.R.value,) * recompute + copy_kinds(offload))  # R, O, L
    if options.shape_only:
        return _shape(decl, source, env, devices, pipelines, replicas, costs, activation, split, recompute, offload)
    ops = build_ops(pipelines, costs, split, mixed, recompute, offload, options.chunk_costs)
    tasks, task_ops, task_deps, keeps, fill, canonical = _expanded(decl, env, pipelines, replicas, split, costs,
                                                                   source, layers, options, ops, task_decls)
    deps = Dependencies(pipelines, costs, split, task_deps, tuple(ops + task_ops), recompute)
    filled = {name for name, _ in fill}
    placeable = ops + [op for op in task_ops if op.kind not in filled]
    unplaced = tuple(op for op in task_ops if op.kind in filled)
    env_pipes = {**env, **{p.name: PipeRef(p.name) for p in pipelines}}
    fused: list = []
    slots: list = []
    orders, squeeze = _run_order(decl, mixed, offload, placeable, deps, pipelines, devices, env_pipes, source, fused,
                                 slots)
    limit, limit_span = memory_limit_of(decl, env, devices, source)
    fill_span = next((d.span for d in decl.decls if isinstance(d, ast.Fill)), None)
    split_of = None
    if mixed:
        split_of, deps, keeps = _mixed_dependencies(orders, ops, task_ops, task_deps, keeps, canonical, pipelines,
                                                    costs)
    if options.measured is not None:
        chosen = _chosen_backwards(pipelines, split_of) + task_names if mixed else []
        _check_measured(options, chosen, task_names, split, mixed, bool(fused))
    if offload:  # the O and L the programs placed; the others never run
        deps = offloaded_dependencies(orders, ops, task_ops, deps, pipelines, costs, split)
    if squeeze:
        orders = _squeezed(squeeze, orders, slots, deps, pipelines, fused, source)
    _check_overlap_cost(cost_decls, fused, source)
    return Schedule(name=decl.name, description=decl.doc, source=source, params=env, devices=devices,
                    pipelines=pipelines, replicas=replicas, orders=orders, deps=deps, costs=costs,
                    activation=activation, memory_limit=limit, memory_limit_span=limit_span, split_backward=split,
                    tasks=tasks, keeps=keeps, fill=fill, unplaced=unplaced, fill_span=fill_span, memory=memory,
                    split_of=split_of, fused=tuple(fused), recompute=recompute, offload=offload,
                    **host_limit(decl, env, devices, source))


def _shape(decl: ast.ScheduleDecl, source: Source, env: dict, devices: int, pipelines, replicas, costs, activation,
           split: bool, recompute: bool, offload: bool) -> Schedule:
    """Options.shape_only's schedule: every device's order empty, no op built."""
    return Schedule(name=decl.name, description=decl.doc, source=source, params=env, devices=devices,
                    pipelines=pipelines, replicas=replicas, orders=((),) * devices,
                    deps=Dependencies(pipelines, costs, split, {}, (), recompute), costs=costs, activation=activation,
                    memory_limit=None, memory_limit_span=None, split_backward=split, recompute=recompute,
                    offload=offload)


def _run_order(decl: ast.ScheduleDecl, mixed: bool, offload: bool, placeable: list[Op], deps, pipelines, devices: int,
               env_pipes: dict, source: Source, fused: list, slots: list):
    """The order strategy run: the programs (O and L optional in them), else greedy; (orders, squeeze)."""
    programs, greedy, queues, squeeze = _order_decls(decl, mixed, source)
    if programs:
        orders, diags = run_programs(programs, queues, placeable, pipelines, devices, env_pipes, source,
                                     mixed, fused, slots, frozenset(copy_kinds(offload)))
    else:
        orders, diags = order_greedy(greedy[0] if greedy else None, placeable, deps, pipelines, devices,
                                     env_pipes, source)
    if has_errors(diags):
        raise SchedError(diags, source)
    return orders, squeeze


def _costs_and_memory(decl: ast.ScheduleDecl, env: dict, pipelines, split: bool, mixed: bool, cost_decls: list,
                      task_names: list[str], source: Source, options: Options, layers):
    """Per kind and stage, the cost of one op (of one sequence chunk: frontend/sequence.py); per stage, the
    activation units a forward keeps; the other kinds' memory."""
    stages, chunks = pipelines[0].stages, pipelines[0].chunks
    costs = per_unit(_scaled_tasks(per_stage(cost_decls, dict(DEFAULT_COSTS), env, stages, source,
                                             _per_stage_given(options, layers), origin=options.measured),
                                   set(task_names), options.task_scale), chunks)
    activation, memory = memory_of(decl, env, stages, split, set(task_names), source, options.memory, mixed)
    return costs, per_unit({OpKind.F.value: activation}, chunks)[OpKind.F.value], memory


def _expanded(decl: ast.ScheduleDecl, env: dict, pipelines, replicas, split: bool, costs, source: Source, layers,
              options: Options, ops: list[Op], task_decls: list):
    """The declared tasks expanded into ops, their dependencies and keeps given the canonical ops
    (device and cost); (tasks, task ops, deps, keeps, fill, the canonical op of each key)."""
    if not task_decls:
        return (), [], {}, {}, (), {}
    from .tasks import expand_tasks  # tasks are optional; the module keeps this file small
    tasks, task_ops, task_deps, keeps, fill = expand_tasks(decl, env, pipelines, replicas, split, costs, source,
                                                           layers, options.task_scale,
                                                           (options.max_ops, options.max_ops - len(ops)))
    canonical = {op.key: op for op in ops + task_ops}  # dependencies name ops; give them device and cost
    task_deps = {op: tuple(canonical[d.key] for d in found) for op, found in task_deps.items()}
    keeps = {op: tuple(canonical[d.key] for d in found) for op, found in keeps.items()}
    return tasks, task_ops, task_deps, keeps, fill, canonical


def _order_decls(decl: ast.ScheduleDecl, mixed: bool, source: Source):
    """How the schedule is ordered: its programs, `greedy`, queues and `squeeze`, refused where they do
    not go together; (programs, greedy, queues, squeeze)."""
    programs = [d for d in decl.decls if isinstance(d, ast.Program)]
    greedy = [d for d in decl.decls if isinstance(d, ast.Greedy)]
    queues = [d for d in decl.decls if isinstance(d, ast.QueueDecl)]
    if programs and greedy:
        raise fail_at("a schedule gives either per-device programs or 'greedy', not both", greedy[0].span, source)
    if mixed and not programs:
        raise fail_at("with 'backward mixed' the programs choose B or I per backward: give 'on device' programs",
                      next(d.span for d in decl.decls if isinstance(d, ast.MixedBackward)), source)
    if queues and not programs:  # it would be ignored, its key not even checked
        raise fail_at("'queue' orders the pops of per-device programs: give 'on device' programs, or order a "
                      "greedy schedule with 'greedy by (...)'", queues[0].span, source)
    squeeze = next((d for d in decl.decls if isinstance(d, ast.Squeeze)), None)
    if squeeze and not programs:
        raise fail_at("'squeeze' compacts the slots of per-device programs: give 'on device' programs",
                      squeeze.span, source)
    return programs, greedy, queues, squeeze


def _mixed_dependencies(orders, ops: list[Op], task_ops: list[Op], task_deps: dict, keeps: dict, canonical: dict,
                        pipelines, costs):
    """With `backward mixed`: which (pipe, stage, mb) the programs split into I and W, the dependencies
    of the ops they placed, and the keeps; a task after (or keeping) B(s, i) waits for the backward the
    program chose. (split_of, deps, keeps)."""
    split_of = frozenset((op.pipe, op.stage, op.mb) for order in orders for op in order if op.kind == OpKind.I)
    chosen = set(map(OP_KEY, chain.from_iterable(orders)))
    forward = OpKind.F.value
    grid = tuple([op for op in ops if op.kind == forward or OP_KEY(op) in chosen])
    if task_ops:
        task_deps = {op: _chosen_backward(found, split_of, canonical) for op, found in task_deps.items()}
        keeps = {op: _chosen_backward(found, split_of, canonical) for op, found in keeps.items()}
    return split_of, Dependencies(pipelines, costs, split_of, task_deps, grid + tuple(task_ops)), keeps


def _check_overlap_cost(cost_decls: list, fused: list, source: Source) -> None:
    """A `cost FB` needs a program that overlaps a forward and a backward (F & B)."""
    declared_fb = next((d.span for d in cost_decls if d.kind == "FB"), None)
    if not fused and declared_fb is not None:
        raise fail_at("cost of FB, but no program overlaps a forward and a backward (F & B)", declared_fb, source)


def _squeezed(squeeze: ast.Squeeze, orders, slots, deps, pipelines, fused, source: Source):
    """The programs' orders squeezed (frontend/squeeze.py): built-in ops only, none overlapped. Tasks
    the fill places later (an add-on's) are not in the orders and are welcome; a task the programs
    place themselves is refused."""
    if fused or any(op.kind not in BUILTIN for order in orders for op in order):
        raise fail_at("'squeeze' moves built-in ops in unit slots: it takes no overlapped ops, and no tasks "
                    "in the programs (fill them into the bubbles instead)", squeeze.span, source)
    for device, (order, taken) in enumerate(zip(orders, slots)):
        last = max(range(len(taken)), key=taken.__getitem__, default=None)
        spans = 0 if last is None else taken[last] + 1
        refused = SQUEEZE_SLOTS.refusal(spans, f"'squeeze': device {device}'s program (its {order[last]} at slot "
                                        f"{taken[last]:,}) spans" if last is not None else "", items=len(order))
        if refused:
            raise fail_at(refused, squeeze.span, source, kind=REFUSED)
    from .squeeze import squeeze_orders
    return squeeze_orders(orders, slots, deps, chunk_index(pipelines))


def _chosen_backward(found: tuple[Op, ...], split_of: frozenset, canonical: dict) -> tuple[Op, ...]:
    """With `backward mixed`, a dependency on B(s, i) where the program ran I(s, i) + W(s, i) instead
    names that I: it computes the same input gradient from the same received one."""
    return tuple(canonical[(OpKind.I.value, d.stage, d.mb, d.pipe, d.part)]
                 if d.kind == OpKind.B and (d.pipe, d.stage, d.mb) in split_of else d for d in found)


def _grid_kinds(decl: ast.ScheduleDecl) -> int:
    """Ops per stage and microbatch: 2 (F B), 3 with a split backward (F I W), 4 with a mixed one."""
    if any(isinstance(d, ast.MixedBackward) for d in decl.decls):
        return len(MIXED_KINDS)
    return len(builtin_kinds(any(isinstance(d, ast.SplitBackward) for d in decl.decls),
                             any(isinstance(d, ast.Recompute) for d in decl.decls))
               + copy_kinds(any(isinstance(d, ast.Offload) for d in decl.decls)))


def _mixed_backward(decl: ast.ScheduleDecl, split: bool, source: Source) -> bool:
    mixed = [d for d in decl.decls if isinstance(d, ast.MixedBackward)]
    if mixed and split:
        raise fail_at("a backward is either split or mixed: 'backward split' and 'backward mixed' exclude each "
                    "other", mixed[0].span, source)
    return bool(mixed)


def _check_kinds(decl: ast.ScheduleDecl, costs: list[ast.CostDecl], split: bool, mixed: bool, tasks: set[str],
                 source: Source, recompute: bool = False, offload: bool = False) -> None:
    """Every kind a `cost`, `queue` or program cursor names runs in the schedule: a misspelt kind would
    be ignored (a cost, a queue, an optional pop `Q?` or a choice's `(Wx | B)`)."""
    kinds = set(MIXED_KINDS if mixed else builtin_kinds(split, recompute) + copy_kinds(offload)) | tasks
    diags = []
    seen: set[str] = set()
    for cursor in (c for d in decl.decls if isinstance(d, ast.Program) for c in _cursors(d.body)):
        if cursor.kind not in kinds and cursor.kind not in seen:  # once per kind, at its first cursor
            seen.add(cursor.kind)
            diags.append(error(f"program pops {cursor.kind}: {absent_kind(cursor.kind, kinds, split)}", cursor.span))
    for d in [*costs, *(d for d in decl.decls if isinstance(d, ast.QueueDecl))]:
        if d.kind in kinds or (isinstance(d, ast.CostDecl) and d.kind in ("FB", "piece")):
            continue
        why = absent_kind(d.kind, kinds, split)
        what = "cost" if isinstance(d, ast.CostDecl) else "queue"
        diags.append(error(f"{what} of {d.kind}: {why}", d.span))
    keys = [e for d in decl.decls if isinstance(d, (ast.QueueDecl, ast.Greedy)) for e in (d.key or ())]
    for listed in (k for e in keys for k in kind_lists(e)):
        for name in listed.names:
            if name not in kinds:
                diags.append(error(f"unknown kind '{name}' in a list of kinds (kinds: {', '.join(sorted(kinds))})",
                                   listed.span))
    if diags:
        raise SchedError(diags, source)


def _cursors(body: tuple[ast.Stmt, ...]):
    """Every cursor of a program body, in source order: in items, groups, overlaps, choices, loops, ifs."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Cursor):
            yield node
            continue
        children = ((node.unit,) if isinstance(node, ast.Item) else (node.forward, node.backward)
                    if isinstance(node, ast.Overlap) else node.options if isinstance(node, ast.Choice)
                    else node.body if isinstance(node, (ast.Group, ast.Loop))
                    else (*node.then, *node.orelse) if isinstance(node, ast.When) else ())
        stack.extend(reversed(children))


def _check_measured(options: Options, needs, tasks: list[str], split: bool, mixed: bool,
                    fused: bool | None = None) -> None:
    """Measured costs give every kind in `needs` and name only kinds the schedule runs (its built-in
    kinds and tasks, and FB unless `fused` says no program overlaps F & B); interop.profiles."""
    from ..interop.profiles import check_measured_kinds
    runs = [*(MIXED_KINDS if mixed else builtin_kinds(split)), *tasks] + [OVERLAP] * (fused is not False)
    check_measured_kinds(options.measured, options.costs, runs, needs, split or mixed)


def _chosen_backwards(pipelines: tuple[Pipeline, ...], split_of: frozenset) -> list[str]:
    """The backward kinds the programs of a `backward mixed` schedule chose: B where a (stage,
    microbatch) is not split, I and W where one is."""
    backwards = sum(len(p.microbatches) * p.stages for p in pipelines)
    return [OpKind.B.value] * (len(split_of) < backwards) + [OpKind.I.value, OpKind.W.value] * bool(split_of)


def _check_fill(decl: ast.ScheduleDecl, tasks: set[str], source: Source) -> None:
    """Every name in `fill bubbles with` is a declared task, whether the schedule declares tasks or not
    (a fill list of a schedule without tasks was not read, so a typo in it passed)."""
    for item in (item for d in decl.decls if isinstance(d, ast.Fill) for item in d.items):
        if item.task not in tasks:
            known = f"tasks: {', '.join(sorted(tasks))}" if tasks else "no tasks are declared"
            raise fail_at(f"unknown task '{item.task}' in fill ({known})", item.span, source)


def stage_layers(model_layers: int | None, stages: int, decl, source: Source,
                 split: tuple = (None, False, False)) -> tuple[int, ...] | None:
    """The model's layers over the stages as the layout splits them (schedc.layout.split_layers, as the
    runtime partitions a model: the first ones one more when they do not divide evenly, or as
    --stage-layers gives them, the embedding and the loss counted as layers where the account-for
    switches say so); None without a model."""
    if model_layers is None:
        return None
    try:
        return split_layers(model_layers, stages, *split)
    except SplitError as exc:
        raise fail_at(str(exc), decl.span, source, kind=USAGE) from None


def _per_stage_given(options: Options, layers: tuple[int, ...] | None) -> dict:
    """Measured costs, per stage: a profile's are one layer's, times the stage's layers (`cost piece`,
    the fixed part of one call, stays)."""
    if not (options.per_layer and layers):
        return options.costs
    return {kind: value if kind == "piece" or not isinstance(value, (int, float))
            else tuple(value * n for n in layers) for kind, value in options.costs.items()}


__all__ = ["Options", "elaborate", "shape_of"]
