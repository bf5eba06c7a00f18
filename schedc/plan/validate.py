"""What the runtime and the renderer rely on in a loaded plan, checked when it is loaded.

A plan whose hash was recomputed after an edit (by a careless tool or person) is well-formed JSON with
a matching hash, and can still hold a stage of 99, no ranks, an uneven number of step programs, a step
without its STEP, or a placement that puts two stages' ranks together. Each is refused here with a
PlanError naming the field (`ranks[1].steps[0][5].stage: 99 is out of range 0..3`), before a renderer
indexes past a table or a rank waits for a message its peer will never send.

    check_plan_fields(plan)   # None, or PlanError for the first field that does not hold

`load_plan` and `plan_from_json` here (what `schedc.plan` exports) are format's, with these checks.
"""
from __future__ import annotations

import math
from typing import Any

from ..ops import COMM, COMPUTE, DECLARED, GRADIENT, Opcode, OpKind, cost_range, in_cost_range
from pathlib import Path

from . import format as _format
from .format import Instr, Plan, PlanError

MAX_CYCLE = 4096   # step programs per rank; a compiled cycle is far shorter
MAX_SIZE = 2 ** 31  # stages, microbatches, devices: beyond any plan that fits in memory


def load_plan(path: str | Path, verify: bool = True) -> Plan:
    """Read plan.json (format.load_plan) and check its fields."""
    plan = _format.load_plan(path, verify)
    check_plan_fields(plan)
    return plan


def plan_from_json(obj: dict[str, Any], verify: bool = True) -> Plan:
    """format.plan_from_json, with the fields checked."""
    plan = _format.plan_from_json(obj, verify)
    check_plan_fields(plan)
    return plan


def check_plan_fields(plan: Plan) -> None:
    """Refuse a plan whose metadata or instructions the runtime or the renderer cannot use."""
    meta = plan.meta
    devices = len(plan.ranks)
    if devices < 1:
        raise PlanError("ranks: the plan has no ranks")
    stages = _count(meta, "stages")
    microbatches = _count(meta, "microbatches")
    chunks = meta.get("chunks", 1)
    if type(chunks) is not int or not 1 <= chunks <= microbatches or microbatches % chunks:
        raise PlanError(f"chunks: expected an integer >= 1 dividing the plan's {microbatches} microbatch units "
                        f"(its sequence chunks per microbatch), got {_shown(chunks)}")
    if "devices" in meta and meta["devices"] != devices:
        raise PlanError(f"devices: {meta['devices']!r}, but the plan has {devices} ranks")
    pipelines = _pipelines(meta.get("pipelines"), stages, microbatches, devices)
    _replicas(meta.get("replicas", []), len(pipelines))
    _costs(meta.get("costs") or {}, stages)
    _links(meta.get("links", []), devices)
    if "activation" in meta and not (isinstance(meta["activation"], list) and len(meta["activation"]) == stages
                                     and all(_finite(v) and v >= 0 for v in meta["activation"])):
        raise PlanError(f"activation: expected {stages} finite sizes >= 0, one per stage, got "
                        f"{_shown(meta['activation'])}")
    params = meta.get("params", {})
    if not isinstance(params, dict) or not all(type(v) in (int, float) for v in params.values()):
        raise PlanError(f"params: expected an object of param name to number, got {_shown(params)}")
    cycle = len(plan.ranks[0])
    for rank, steps in enumerate(plan.ranks):
        if not 1 <= len(steps) <= MAX_CYCLE:
            raise PlanError(f"ranks[{rank}].steps: {len(steps)} step programs (1..{MAX_CYCLE} expected)")
        if len(steps) != cycle:
            raise PlanError(f"ranks[{rank}].steps: {len(steps)} step programs, but rank 0 has {cycle} "
                            "(every rank runs the same cycle)")
        for k, step in enumerate(steps):
            _check_step(step, f"ranks[{rank}].steps[{k}]", rank, stages, microbatches, devices, pipelines)


def _count(meta: dict, key: str) -> int:
    value = meta.get(key)
    if type(value) is not int or not 1 <= value <= MAX_SIZE:
        raise PlanError(f"{key}: expected an integer >= 1, got {value!r}")
    return value


def _pipelines(value: Any, stages: int, microbatches: int, devices: int) -> list[list[int]]:
    """The placement of every pipeline (placement[s] = rank of stage s), checked field by field."""
    if not isinstance(value, list) or not value:
        raise PlanError(f"pipelines: expected a list of pipelines, got {_shown(value)}")
    placements, owned = [], set()
    for n, pipe in enumerate(value):
        where = f"pipelines[{n}]"
        if not isinstance(pipe, dict):
            raise PlanError(f"{where}: expected an object, got {_shown(pipe)}")
        if not isinstance(pipe.get("name"), str):
            raise PlanError(f"{where}.name: expected a string, got {_shown(pipe.get('name'))}")
        if pipe.get("stages") != stages:
            raise PlanError(f"{where}.stages: {_shown(pipe.get('stages'))}, but the plan has {stages} stages")
        placement = pipe.get("placement")
        if not _ints(placement, 0, devices - 1) or len(placement) != stages:
            raise PlanError(f"{where}.placement: expected {stages} ranks in 0..{devices - 1}, got {_shown(placement)}")
        mbs = pipe.get("microbatches")
        if not _ints(mbs, 0, microbatches - 1) or not mbs or len(set(mbs)) != len(mbs) or owned & set(mbs):
            raise PlanError(f"{where}.microbatches: expected one or more distinct microbatches in "
                            f"0..{microbatches - 1} owned by no other pipeline, got {_shown(mbs)}")
        owned |= set(mbs)
        placements.append(placement)
    return placements


def _links(value: Any, devices: int) -> None:
    """[from, to, seconds] per device pair: two ranks of the plan, and a finite time >= 0."""
    if not isinstance(value, list) or not all(
            isinstance(e, list) and len(e) == 3 and _ints(e[:2], 0, devices - 1) and e[0] != e[1]
            and _finite(e[2]) and e[2] >= 0 for e in value):
        raise PlanError(f"links: expected [from rank, to rank, seconds >= 0] entries between the ranks "
                        f"0..{devices - 1}, got {_shown(value)}")


def _replicas(value: Any, count: int) -> None:
    if not isinstance(value, list) or not all(_ints(group, 0, count - 1) for group in value):
        raise PlanError(f"replicas: expected lists of pipeline numbers 0..{count - 1}, got {_shown(value)}")


def _costs(value: Any, stages: int) -> None:
    if not isinstance(value, dict):
        raise PlanError(f"costs: expected an object of op kind to cost, got {_shown(value)}")
    for kind, cost in value.items():
        values = cost if isinstance(cost, list) else [cost]
        if (isinstance(cost, list) and len(cost) != stages) or not all(type(v) in (int, float) and in_cost_range(v) for v in values):
            raise PlanError(f"costs.{kind}: expected {cost_range()} (as a declared cost), or one per stage "
                            f"({stages}), got {_shown(cost)}")


def _check_step(step: tuple[Instr, ...], where: str, rank: int, stages: int, microbatches: int, devices: int,
                pipelines: list[list[int]]) -> None:
    """One step program: one STEP, its last instruction; stages, microbatches, pipelines, peers and parts
    in range; every compute instruction on the rank its pipeline places the stage on. Columns are
    checked in C first; the first instruction at fault is named."""
    ops = [i.op for i in step]
    if ops.count(Opcode.STEP.value) != 1 or ops[-1] != Opcode.STEP.value:
        found = ops.count(Opcode.STEP.value)
        raise PlanError(f"{where}: a step program ends with exactly one STEP (found {found}"
                        f"{'' if not found or ops[-1] == Opcode.STEP.value else ', not at the end'})")
    if _columns_fine(step, stages, microbatches, devices, len(pipelines), rank, pipelines):
        return
    for n, instr in enumerate(step):
        _check_instr(instr, f"{where}[{n}]", rank, stages, microbatches, devices, pipelines)


def _columns_fine(step, stages, microbatches, devices, pipes, rank, pipelines) -> bool:
    _, stage, mb, pipe, peer, group, part, parts, halves = (list(c) for c in zip(*step))
    if halves.count(None) < len(halves):
        return False  # overlapped instructions: checked one by one
    set_stages = [s for s in stage if s is not None]
    set_mbs = [m for m in mb if m is not None]
    set_pipes = [p for p in pipe if p is not None]
    set_peers = [p for p in peer if p is not None]
    if (set_stages and not 0 <= min(set_stages) <= max(set_stages) < stages) or \
            (set_mbs and not 0 <= min(set_mbs) <= max(set_mbs) < microbatches) or \
            (set_pipes and not 0 <= min(set_pipes) <= max(set_pipes) < pipes) or \
            (set_peers and not 0 <= min(set_peers) <= max(set_peers) < devices) or rank in set_peers:
        return False
    if any(p is not None for p in part + parts):
        return False  # task pieces: checked one by one
    if not all(0 <= x < devices for g in group if g is not None for x in g):
        return False
    if not (all(i.stage is not None and i.mb is not None and i.peer is not None for i in step if i.op in COMM)
            and all(i.stage is not None for i in step if i.op in COMPUTE)):
        return False  # a missing field, named by _check_instr (before the placement is looked up by it)
    if not all(_declared_fine(i, rank) for i in step if i.op in DECLARED):
        return False
    placed = {(p or 0, s) for i, p, s in zip(step, pipe, stage) if i.op in COMPUTE or i.op in DECLARED}
    return all(pipelines[p][s] == rank for p, s in placed)


def _check_instr(instr: Instr, where: str, rank: int, stages: int, microbatches: int, devices: int,
                 pipelines: list[list[int]]) -> None:
    if instr.op == Opcode.OVERLAP_F_B or instr.halves is not None:
        _check_overlap(instr, where, rank, stages, microbatches, devices, pipelines)
        return
    limits = {"stage": stages, "mb": microbatches, "pipe": len(pipelines), "peer": devices}
    for key, limit in limits.items():
        value = getattr(instr, key)
        if value is not None and not 0 <= value < limit:
            raise PlanError(f"{where}.{key}: {value} is out of range 0..{limit - 1} ({instr})")
    if instr.op in COMPUTE or instr.op in COMM:
        needed = ("stage", "mb", "peer") if instr.op in COMM else ("stage",)
        missing = [key for key in needed if getattr(instr, key) is None]
        if missing:
            raise PlanError(f"{where}.{missing[0]}: {instr.op} needs a {missing[0]} ({instr})")
    if instr.group is not None and not all(0 <= x < devices for x in instr.group):
        raise PlanError(f"{where}.group: ranks must be in 0..{devices - 1}, got {list(instr.group)} ({instr})")
    if instr.op in DECLARED and not _declared_fine(instr, rank):
        raise PlanError(f"{where}.group: {instr.op} needs a stage and a group of distinct ranks that holds "
                        f"rank {rank} ({instr})")
    if instr.op in COMM and instr.peer == rank:
        raise PlanError(f"{where}.peer: rank {rank} sends or receives to itself ({instr})")
    if (instr.op in COMPUTE or instr.op in DECLARED) and pipelines[instr.pipe or 0][instr.stage] != rank:
        placed = pipelines[instr.pipe or 0][instr.stage]
        raise PlanError(f"{where}: {instr} runs stage {instr.stage} on rank {rank}, but pipelines"
                        f"[{instr.pipe or 0}].placement puts it on rank {placed}")
    if instr.part is not None or instr.parts is not None:
        if instr.part is None or instr.parts is None or not 0 <= instr.part < instr.parts <= MAX_SIZE:
            raise PlanError(f"{where}.part: expected 0 <= part < parts, got part {instr.part!r}, parts "
                            f"{instr.parts!r} ({instr})")


def _declared_fine(instr: Instr, rank: int) -> bool:
    """A declared collective names the op's stage and a group of distinct ranks with its own rank in it."""
    group = instr.group
    return instr.stage is not None and group is not None and rank in group and len(set(group)) == len(group)


_OVERLAP_UNSET = ("stage", "mb", "pipe", "peer", "group", "part", "parts")  # an OVERLAP_F_B's own fields


def _check_overlap(instr: Instr, where: str, rank: int, stages: int, microbatches: int, devices: int,
                   pipelines: list[list[int]]) -> None:
    """OVERLAP_F_B: its two halves and nothing else, a forward and a backward (B or I) of this rank with
    a microbatch each, each checked as an instruction of its own."""
    if instr.op != Opcode.OVERLAP_F_B:
        raise PlanError(f"{where}.halves: only {Opcode.OVERLAP_F_B.value} has halves ({instr})")
    others = [key for key in _OVERLAP_UNSET if getattr(instr, key) is not None]
    if instr.halves is None or others:
        raise PlanError(f"{where}: {Opcode.OVERLAP_F_B.value} has its two halves and no other field ({instr})")
    kinds = [half.op for half in instr.halves]
    if kinds.count(OpKind.F.value) != 1 or not GRADIENT.intersection(kinds):
        raise PlanError(f"{where}.halves: a forward and a backward (F and B or I), got {' and '.join(kinds)} "
                        f"({instr})")
    for k, half in enumerate(instr.halves):
        if half.mb is None:
            raise PlanError(f"{where}.halves[{k}].mb: {half.op} needs a mb ({instr})")
        _check_instr(half, f"{where}.halves[{k}]", rank, stages, microbatches, devices, pipelines)


def _ints(value: Any, low: int, high: int) -> bool:
    return isinstance(value, list) and all(type(x) is int and low <= x <= high for x in value)


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."
