"""A plan.json re-simulated, for render, check and simulate of a plan. A plan carries no timing, so it is
re-simulated: each rank's step-0 instruction order, compute
instructions only, with the plan's costs (or --costs) and the built-in dependencies (F after the
previous stage's F; B/I after the next stage's B/I and its own F; W after its I); an OVERLAP_F_B is
its halves, overlapped. User tasks wait only
for their rank's program order (a plan does not record their dependencies), and every stage holds one
activation unit for the memory chart.
"""
from __future__ import annotations

from dataclasses import replace

from ..passes.compiled import Compiled
from ..diagnostics import USAGE, SchedError, Source, error
from ..ir import Dependencies, Op, Pipeline, Schedule
from ..ops import BUILTIN, COPY, DEFAULT_COSTS, OpKind
from ..inputs import load_json, read_source
from ..plan import NOT_COMPUTE, Plan, PlanError, plan_from_json
from .passes import replay, run_passes


def check_measured(plan: Plan, measured: dict, profile: str | None, costs: str | None) -> None:
    """Measured costs give every compute kind the plan runs and (a costs file) no other: a plan's own
    costs are in its units, never mixed with milliseconds (interop.profiles.check_measured_kinds)."""
    from ..interop.profiles import check_measured_kinds, costs_origin, profile_origin
    from ..ops import OVERLAP
    kinds = {unit.op for steps in plan.ranks for step in steps[:1] for instr in step if _is_compute(instr.op)
             for unit in instr.units()}
    overlapped = any(instr.halves is not None for steps in plan.ranks for step in steps[:1] for instr in step)
    order = [k for k in (OpKind.F, OpKind.B, OpKind.I, OpKind.W) if k in kinds] + sorted(kinds - set(OpKind))
    check_measured_kinds(profile_origin(profile) if profile else costs_origin(costs), measured,
                         order + [OVERLAP] * overlapped, order, OpKind.I in kinds)


def compiled_from_plan(plan: Plan, path: str, costs: dict, latency: float | None = None) -> Compiled:
    """The plan's step-0 orders simulated as it was compiled: with the message times it records (a
    `--cluster` compile's "links"), else at the latency its stats record; `latency`, if given, instead
    (refused for a plan with message times, which a single latency would not replace)."""
    links = plan_links(plan)
    if links is not None and latency is not None:
        raise SchedError(error(f"--latency {latency:g}: the plan records the message time of each pair of ranks "
                               "(a --cluster compile), which its re-simulation uses; compile the schedule again "
                               "to change them"), Source(path, ""), kind=USAGE)
    schedule = schedule_from_plan(plan, path, costs)
    u = replayed(schedule, _recorded_latency(plan) if latency is None else latency, links)
    return Compiled(u.schedule, u.timing, u.stats, plan, list(u.diagnostics))


def read_plan(path: str) -> Plan:
    """A plan.json as the runtime reads it; a field error is a usage error (exit 2) naming the field."""
    obj = load_json(read_source(path, "plan"), "plan")  # a regular file, its size and nesting capped
    try:
        return plan_from_json(obj)
    except PlanError as exc:
        raise SchedError(error(exc.without_path(path)), Source(path, ""), kind=USAGE) from None


def check_plan(plan: Plan, path: str) -> list:
    """`schedc check plan.json` and `schedc run`'s check: the plan's step programs' orders
    (check_plan_orders), then its channels (a message sent for every one received, a blocking replay
    completes)."""
    from ..checks.channels import check_channels
    return check_plan_orders(plan, path) + check_channels(plan)


def check_plan_orders(plan: Plan, path: str) -> list:
    """The checks a .sched file's orders get, on each step program of a plan (a plan.json may have been
    edited, its hash recomputed): every built-in op of every stage and microbatch once, on its stage's
    rank (check_structure), and the orders complete under the built-in dependencies (check_deadlock);
    each error noted with its step program where the plan has several."""
    diagnostics = []
    steps = max((len(s) for s in plan.ranks), default=1)
    for k in range(steps):
        schedule = schedule_from_plan(plan, path, {}, k)
        found = list(replayed(schedule, 0.0).diagnostics)
        if steps > 1:
            found = [replace(d, notes=(*d.notes, f"in step program {k} of the plan's {steps}")) for d in found]
        diagnostics += found
    return diagnostics


def replayed(schedule: Schedule, latency: float, links: list[list[float]] | None = None):
    """The replay passes over a plan's orders: the structure checks see its built-in ops (a plan does
    not declare the tasks fill_bubbles placed), the timing and the deadlock check all of them."""
    builtin = replace(schedule, orders=tuple(tuple(op for op in order if op.kind in BUILTIN)
                                             for order in schedule.orders))
    return run_passes(schedule, latency, links, replay(), checked=builtin)


def _recorded_latency(plan: Plan) -> float:
    """The latency the plan was compiled with (its stats record it), 0 where it records none."""
    recorded = (plan.meta.get("stats") or {}).get("latency") if isinstance(plan.meta.get("stats"), dict) else None
    ok = isinstance(recorded, (int, float)) and not isinstance(recorded, bool) and 0 <= recorded < float("inf")
    return float(recorded) if ok else 0.0


def plan_links(plan: Plan) -> list[list[float]] | None:
    """The per device pair message times a plan records, as simulate takes them (0 between pairs that
    exchange nothing); None for a plan without them."""
    if "links" not in plan.meta:
        return None
    links = [[0.0] * plan.devices for _ in range(plan.devices)]
    for a, b, seconds in plan.meta["links"]:
        links[a][b] = float(seconds)
    return links


def schedule_from_plan(plan: Plan, path: str, costs: dict, step: int = 0) -> Schedule:
    """The plan's step program `step` of every rank as a Schedule (its compute instructions in order,
    the built-in dependencies, the plan's costs or `costs`)."""
    meta = plan.meta
    stages = int(meta.get("stages", 1))
    table = {k: (v,) * stages for k, v in DEFAULT_COSTS.items()}
    table.update({k: _per_stage(v, stages) for k, v in (meta.get("costs") or {}).items()})
    table.update({k: _per_stage(v, stages) for k, v in costs.items()})
    pipelines = tuple(Pipeline(p["name"], int(p["stages"]), tuple(p["placement"]), tuple(p["microbatches"]),
                               chunks=int(meta.get("chunks", 1)))
                      for p in meta.get("pipelines", ()))
    orders, fused, chunks = [], [], int(meta.get("chunks", 1))
    for rank, steps in enumerate(plan.ranks):
        order = []
        for instr in (i for i in (steps[step] if step < len(steps) else ()) if _is_compute(i.op)):
            order += [_op(unit, rank, table, chunks) for unit in instr.units()]
            if instr.halves is not None:  # an OVERLAP_F_B: its halves, side by side, one overlapped op
                fused.append((order[-2], order[-1]))
        orders.append(tuple(order))
    kinds = {op.kind for order in orders for op in order}
    split = OpKind.I in kinds
    split_of = frozenset((op.pipe, op.stage, op.mb) for order in orders for op in order if op.kind == OpKind.I) \
        if split and OpKind.B in kinds else None  # B and I mixed: the stages and microbatches split
    recompute = OpKind.R in kinds  # `recompute F`: the plan places R ops; `offload F`: O and L
    offloaded = frozenset((op.pipe, op.stage, op.mb) for order in orders for op in order if op.kind in COPY)
    deps = Dependencies(pipelines, table, split if split_of is None else split_of, {},
                        tuple(op for order in orders for op in order), recompute, offloaded)
    return Schedule(name=str(meta.get("schedule", "plan")), description=str(meta.get("description", "")),
                    source=Source(path, ""), params=_declared_order(meta.get("params") or {}), devices=plan.devices,
                    pipelines=pipelines, replicas=tuple(tuple(g) for g in meta.get("replicas", ())),
                    orders=tuple(orders), deps=deps, costs=table,
                    activation=_per_stage(meta.get("activation", 1.0), stages), memory_limit=None,
                    memory_limit_span=None, split_backward=split and split_of is None, split_of=split_of,
                    fused=tuple(fused), recompute=recompute, offload=bool(offloaded))


PARAM_ORDER = ("p", "v", "m")  # a plan.json keeps its params sorted by name; the library declares these first


def _declared_order(params: dict) -> dict:
    """A plan's params in the order the library declares them (p, v, m, then the rest by name), so a plan
    re-simulated is titled as its schedule was, (p=4 m=8) and not (m=8 p=4)."""
    first = [k for k in PARAM_ORDER if k in params]
    return {k: params[k] for k in [*first, *sorted(set(params) - set(first))]}


def _per_stage(value, stages: int) -> tuple[float, ...]:
    return tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else (float(value),) * stages


def _is_compute(opcode: str) -> bool:
    return opcode not in NOT_COMPUTE


def _op(instr, rank: int, table: dict, chunks: int = 1) -> Op:
    """The op an instruction runs; a built-in op of a plan with sequence chunks has them as its parts."""
    stage = instr.stage or 0
    per_stage = table.get(instr.op)
    cost = per_stage[stage] if per_stage and stage < len(per_stage) else 1.0
    parts = chunks if instr.op in BUILTIN and instr.parts is None else instr.parts or 1
    return Op(instr.op, stage, instr.mb, instr.pipe or 0, instr.part or 0, rank, cost, parts=parts)
