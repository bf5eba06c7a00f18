"""check_structure: every (stage, microbatch) of every pipeline has exactly one F and one B (or one I
and one W; with a mixed backward either, not both) on the stage's device, and nothing else runs
outside the declared ranges.

    device 3: F(3,1) B(3,0) ... F(3,8) B(3,7)   (torch 2.13's 1F1B for 4 ranks, 8 microbatches)
    -> error: F(3,8): microbatch 8 is outside the microbatches 0..7 of pipeline 'main'
       error: B(3,0) runs before its forward: no device runs F(3,0)
       error: device 3 never runs F(3,0) (stage 3 of pipeline 'main')

A fast path compares the placed ops with the expected ones (checks/census.py); only a schedule that
fails it is walked op by op to name every fault.
"""
from __future__ import annotations

from operator import attrgetter

from ..diagnostics import Diagnostic, Span, error
from ..passes.grid import elide, label, location, ranges
from ..ir import OP_KEY, Op, Schedule
from .census import Census, census
from ..ops import BUILTIN, SPLIT, OpKind, follows

HOME = attrgetter("pipe", "stage")
STAGE = attrgetter("stage")


def check_structure(schedule: Schedule, counted: Census | None = None) -> list[Diagnostic]:
    """Guarantees, when it returns no error: each device's order holds exactly the expected ops, each
    once: F and B (or F, I and W with a split backward) of every stage and microbatch of every pipeline,
    and every placed task; every op runs on the device its stage is placed on; no model stage sits twice
    on one device across replicated pipelines; no overlapped pair is of one microbatch. Otherwise every
    fault is reported, located at the op.
    counted: the schedule's census, when the caller has it (a compile counts once for two checks)."""
    counted = counted or census(schedule)
    diags = _check_shape(schedule) + _check_replicas(schedule) + _check_fused(schedule)
    if diags or not counted.exact or not _homes_ok(schedule):
        diags += _walk(schedule, counted)
    return diags


def _homes_ok(schedule: Schedule) -> bool:
    """Every op on the device its stage is placed on (sets of small ints or pairs, built in C)."""
    single = len(schedule.pipelines) == 1
    homes: list[set] = [set() for _ in schedule.orders]
    for k, pipe in enumerate(schedule.pipelines):
        for s, device in enumerate(pipe.placement):
            if 0 <= device < len(homes):
                homes[device].add(s if single else (k, s))
    where = STAGE if single else HOME
    return all(set(map(where, order)) <= homes[d] for d, order in enumerate(schedule.orders))


def _check_shape(schedule: Schedule) -> list[Diagnostic]:
    if len(schedule.orders) != schedule.devices:
        return [error(f"the schedule has {schedule.devices} devices but {len(schedule.orders)} device orders")]
    return []


def _check_fused(schedule: Schedule) -> list[Diagnostic]:
    """An overlapped pair (F & B, F & I) runs its halves together, so they must not depend on each other:
    a backward waits for every forward of its own microbatch (through the last stage's)."""
    return [error(f"{label(schedule, f)} & {label(schedule, b)} on device {f.device}: a backward cannot overlap a "
                  "forward of its own microbatch (it waits for every forward of it); overlap it with another "
                  "microbatch's forward, or place the two one after the other", b.span or f.span)
            for f, b in schedule.fused if (f.pipe, f.mb) == (b.pipe, b.mb)]


def _check_replicas(schedule: Schedule) -> list[Diagnostic]:
    """Replicated pipelines hold copies of one model: no device may hold the same model stage twice."""
    diags = []
    for group in schedule.replicas:
        pipes = [schedule.pipelines[k] for k in group]
        for s in range(min(p.stages for p in pipes)):
            devices = [p.placement[s] for p in pipes]
            for device in sorted({d for d in devices if devices.count(d) > 1}):
                names = ", ".join(f"'{p.name}'" for p in pipes if p.placement[s] == device)
                diags.append(error(f"device {device} holds model stage {s} twice (pipelines {names} are "
                                   "replicas of one model)", pipes[-1].span))
    return diags


# The slow path: name every fault ------------------------------------------------------------------

def _walk(schedule: Schedule, counted: Census) -> list[Diagnostic]:
    seen: dict[tuple, tuple[int, int, Op]] = {}   # key -> (device, position, op) of the first copy
    outside, twice, misplaced = [], [], {}
    for d, order in enumerate(schedule.orders):
        for n, op in enumerate(order):
            problem = _outside(schedule, op)
            if problem:
                outside.append(error(f"{label(schedule, op)} on device {d}: {problem}", op.span))
                continue
            key = OP_KEY(op)
            if key in seen:
                twice.append(_twice(schedule, op, d, seen[key]))
                continue
            seen[key] = (d, n, op)
            if schedule.pipelines[op.pipe].placement[op.stage] != d:
                misplaced.setdefault((op.pipe, op.stage, d), []).append(op)
    return (outside + twice + _misplaced(schedule, misplaced) + _both_backwards(schedule, seen)
            + _early(schedule, seen) + _missing(schedule, seen, counted))


def _both_backwards(schedule: Schedule, seen: dict) -> list[Diagnostic]:
    """With a mixed backward, a (stage, microbatch) runs B or I and W, not both."""
    if not schedule.mixed_backward:
        return []
    diags = []
    for key, (d, _, op) in seen.items():
        if key[0] == OpKind.B and (OpKind.I.value,) + key[1:] in seen:
            split = seen[(OpKind.I.value,) + key[1:]][2]
            diags.append(error(f"{label(schedule, op)} on device {d} runs the backward that "
                               f"{label(schedule, split)} ({location(schedule.source, split.span)}) already splits: "
                               "a backward runs whole (B) or split (I and W), not both", op.span))
    return diags


def _outside(schedule: Schedule, op: Op) -> str | None:
    """Why op is not an op of this schedule, or None."""
    if not 0 <= op.pipe < len(schedule.pipelines):
        return f"pipeline index {op.pipe} does not exist (the schedule has {len(schedule.pipelines)})"
    pipe = schedule.pipelines[op.pipe]
    if not 0 <= op.stage < pipe.stages:
        return f"stage {op.stage} is outside the stages 0..{pipe.stages - 1} of pipeline '{pipe.name}'"
    if op.kind in BUILTIN:
        return _outside_builtin(schedule, op, pipe)
    names = {task.name for task in schedule.tasks}
    if op.kind not in names:
        return f"'{op.kind}' is neither F, B, I, W nor a declared task"
    if op.mb is not None and op.mb not in pipe.microbatches:
        return f"microbatch {op.mb} is outside the microbatches {ranges(pipe.microbatches)} of '{pipe.name}'"
    return None


def _outside_builtin(schedule: Schedule, op: Op, pipe) -> str | None:
    if op.kind == OpKind.B and schedule.split_backward:
        return "this schedule splits its backward into I and W; B does not run"
    if op.kind in SPLIT and not schedule.split_backward and not schedule.mixed_backward:
        return "this schedule runs a full backward B; I and W need 'backward split'"
    if op.mb is None:
        return "a built-in op needs a microbatch"
    if not pipe.microbatches:
        return f"pipeline '{pipe.name}' has no microbatches, so no microbatch {op.mb}"
    first = pipe.microbatches[0]
    if not (0 <= op.mb - first < len(pipe.microbatches) and pipe.microbatches[op.mb - first] == op.mb):
        return f"microbatch {op.mb} is outside the microbatches {ranges(pipe.microbatches)} of pipeline '{pipe.name}'"
    if op.part != 0:
        return f"part {op.part} of a built-in op does not exist"
    return None


def _twice(schedule: Schedule, op: Op, device: int, first: tuple[int, int, Op]) -> Diagnostic:
    d0, n0, op0 = first
    where = f" ({location(schedule.source, op0.span)})" if op0.span else ""
    return error(f"{label(schedule, op)} runs twice: on device {d0} at step {n0}{where} and again on device "
                 f"{device}", op.span)


def _misplaced(schedule: Schedule, misplaced: dict) -> list[Diagnostic]:
    diags = []
    for (k, s, d), ops in sorted(misplaced.items(), key=lambda item: item[0]):
        pipe = schedule.pipelines[k]
        shown = elide(ops, 6, "ops", lambda op: label(schedule, op))
        diags.append(error(f"stage {s} of pipeline '{pipe.name}' is on device {pipe.placement[s]}, but device "
                           f"{d} runs it too: {shown}", ops[0].span,
                           notes=("a stage lives on one device; its weights cannot be in two places",)))
    return diags


def _early(schedule: Schedule, seen: dict) -> list[Diagnostic]:
    """A backward (B or I) before its forward, or W before its I, in one device's order."""
    diags = []
    for key, (d, n, op) in seen.items():
        before = follows(key[0])
        if before is None:
            continue
        found = seen.get((before,) + key[1:])
        need = label(schedule, Op(before, op.stage, op.mb, op.pipe))
        if found is None:
            diags.append(error(f"{label(schedule, op)} on device {d} runs before its {_name(before)}: no device "
                               f"runs {need}", op.span))
        elif found[0] == d and found[1] > n:
            diags.append(error(f"{label(schedule, op)} on device {d} runs before its {_name(before)} {need}, "
                               f"which device {d} runs later (step {found[1]}, "
                               f"{location(schedule.source, found[2].span)})", op.span))
    return sorted(diags, key=_position)


_NAMES = {OpKind.F: "forward", OpKind.B: "backward", OpKind.I: "input backward", OpKind.W: "weight backward",
          OpKind.R: "recomputation", OpKind.O: "offload", OpKind.L: "reload"}


def _name(kind: str) -> str:
    """An op kind in words (what ops.follows may name: a forward, an input backward, an offload, a
    reload or a recomputation)."""
    return _NAMES.get(kind, kind)


def _missing(schedule: Schedule, seen: dict, counted: Census) -> list[Diagnostic]:
    """Expected ops no device runs, grouped per (pipeline, stage, kind) with their microbatches."""
    groups: dict[tuple, list] = {}
    for key in sorted(counted.expected - seen.keys(), key=_sort_key):
        kind, s, mb, k, part = key
        groups.setdefault((k, s, kind), []).append(mb if kind in BUILTIN else key)
    diags = []
    for (k, s, kind), mbs in groups.items():
        pipe = schedule.pipelines[k]
        device = pipe.placement[s]
        if kind in BUILTIN:
            what = (str(Op(kind, s, mbs[0])) if len(mbs) == 1
                    else f"{kind}({s},i) for microbatches {ranges(mbs)}")
        else:
            what = elide(mbs, 6, "ops", lambda key: str(Op(*key)))
        diags.append(error(f"device {device} never runs {what} (stage {s} of pipeline '{pipe.name}')",
                           _device_span(schedule, device, pipe.span)))
    return diags


def _sort_key(key: tuple) -> tuple:
    kind, s, mb, k, part = key
    return (k, s, kind, -1 if mb is None else mb, part)


def _device_span(schedule: Schedule, device: int, fallback: Span | None) -> Span | None:
    """Where a device's order comes from: the span of its first op, else the pipeline's."""
    order = schedule.orders[device] if 0 <= device < len(schedule.orders) else ()
    return next((op.span for op in order if op.span is not None), fallback)


def _position(diag: Diagnostic) -> tuple:
    return (diag.span.line, diag.span.column) if diag.span else (0, 0)
