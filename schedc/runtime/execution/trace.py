# Measurement: per-instruction timings, merged into a Chrome trace, a measured-vs-simulated report and
# a cost profile for the compiler (`schedc compile --costs costs.json`, see docs/plan-format.md).
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedc.ops import OVERLAP, OpKind
from schedc.plan import Instr, Opcode, Plan
from schedc.plan.trace import WAIT, event_name, is_compute, pair_name


@dataclass(frozen=True, slots=True)
class Event:
    """One timed instruction of one rank; times in ns since the common start; `wait` = time blocked on
    a receive inside it (counted apart, so compute durations exclude it). An OVERLAP_F_B is one event,
    its halves (op, stage, mb) in `halves`."""

    rank: int
    step: int
    op: str
    stage: int | None
    mb: int | None
    start: int
    end: int
    wait: int
    halves: tuple[tuple[str, int, int], ...] = ()
    pipe: int | None = None

    @property
    def name(self) -> str:
        """F0.3, SEND_F0.3, STEP; an OVERLAP_F_B by its halves: F0.3 & B7.1."""
        if self.halves:
            return pair_name(self.halves)
        return event_name(self.op, self.stage, self.mb)


def record(rank: int, step: int, instr: Instr, start: int, end: int, wait: int) -> Event:
    halves = () if instr.halves is None else tuple((h.op, h.stage, h.mb) for h in instr.halves)
    return Event(rank, step, instr.op, instr.stage, instr.mb, start, end, wait, halves, instr.pipe)


def chrome_trace(events: list[Event], plan: Plan) -> dict[str, Any]:
    """traceEvents: one process per rank, complete ("X") events in µs, a "wait" event for blocking; an
    OVERLAP_F_B's event names its halves in args.halves ({op, stage, mb} each)."""
    out: list[dict[str, Any]] = []
    for rank in sorted({e.rank for e in events}):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": f"rank {rank}"}})
    for e in events:
        args = {"op": e.op, "stage": e.stage, "mb": e.mb, "pipe": e.pipe, "step": e.step}
        if e.halves:
            args["halves"] = [{"op": op, "stage": stage, "mb": mb} for op, stage, mb in e.halves]
        if e.wait:
            out.append(_complete(WAIT, e.rank, e.start, e.start + e.wait, args))
        out.append(_complete(e.name, e.rank, e.start + e.wait, e.end, args))
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"schedule": plan.meta.get("schedule"), "hash": plan.hash}}


def _complete(name: str, pid: int, start: int, end: int, args: dict) -> dict[str, Any]:
    return {"name": name, "ph": "X", "pid": pid, "tid": 0, "ts": start / 1e3,
            "dur": max(end - start, 0) / 1e3, "args": args}


def cost_key(e: Event) -> tuple[str, int | None]:
    """(cost kind, stage) an event's duration measures: its own op and stage, an OVERLAP_F_B's the
    overlapped cost `FB` at its forward's stage (as `cost FB` is declared and simulated)."""
    forward = next((half for half in e.halves if half[0] == OpKind.F), None)
    return (OVERLAP, forward[1]) if forward else (e.op, e.stage)


def mean_costs(events: list[Event], stages: int) -> dict[str, list[float | None]]:
    """Mean compute duration (ms, waits excluded) per op kind and stage; a stage never seen running an
    op kind gets that kind's mean over the other stages."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0] * stages)
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * stages)
    for e in events:
        kind, stage = cost_key(e)
        if is_compute(e.op) and stage is not None:
            sums[kind][stage] += (e.end - e.start - e.wait) / 1e6
            counts[kind][stage] += 1
    means = {}
    for op in _ordered(sums):
        known = [sums[op][s] / n for s, n in enumerate(counts[op]) if n]
        fill = math.fsum(known) / len(known)
        means[op] = [round(sums[op][s] / n if n else fill, 6) for s, n in enumerate(counts[op])]
    return means


def _ordered(keys) -> list[str]:
    builtin = [op for op in (Opcode.F.value, Opcode.B.value, Opcode.I.value, Opcode.W.value, OVERLAP) if op in keys]
    return builtin + sorted(k for k in keys if k not in builtin)


def profile(events: list[Event], stages: int, microbatch_size: int | None = None, chunks: int = 1) -> dict[str, Any]:
    """costs.json: ms per op kind and stage, and the microbatch size (sequences) they were measured at,
    which `schedc calibrate --costs` fits at (it refuses another --microbatch-size). A run of `chunks`
    sequence chunks gives a microbatch's cost as a compile declares it: k times a chunk's mean (the sum
    over its k chunks)."""
    size = {} if microbatch_size is None else {"microbatch_size": microbatch_size}
    costs = {op: [round(ms * chunks, 6) for ms in means] for op, means in mean_costs(events, stages).items()}
    return {"unit": "ms", **size, **costs}


def report(events: list[Event], plan: Plan, ranks: int) -> dict[str, Any]:
    """Measured makespan, bubble and utilization per step (mean over the measured steps), mean op
    costs, and the plan's simulated figures scaled to ms by the ratio of measured to simulated work."""
    by_step: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        by_step[e.step].append(e)
    if not by_step:
        return {"steps": 0}
    spans, busy = [], []
    for step_events in by_step.values():
        spans.append((max(e.end for e in step_events) - min(e.start for e in step_events)) / 1e6)
        busy.append(sum(e.end - e.start - e.wait for e in step_events if is_compute(e.op)) / 1e6)
    makespan, work = _mean(spans), _mean(busy)
    out = {"steps": len(by_step), "ranks": ranks, "makespan_ms": round(makespan, 3),
           "busy_ms_per_rank": round(work / ranks, 3),
           "bubble": round((makespan * ranks - work) / work, 4) if work else None,
           "utilization": round(work / (makespan * ranks), 4) if makespan else None,
           "mean_ms": mean_costs(events, plan.meta.get("stages", 1))}
    out["simulated"] = simulated(plan, work / (ranks // max(plan.devices, 1)))
    return out


def memory_report(summaries: list[dict]) -> dict[str, Any]:
    """The ranks' saved-activation figures (runtime/execution/memory.py), by rank and merged by stage (the
    largest over the data-parallel ranks holding a stage)."""
    stages: dict[str, dict[str, int]] = {}
    for summary in summaries:
        for s, size in summary["saved_bytes_per_microbatch"].items():
            entry = stages.setdefault(s, {"saved_bytes_per_microbatch": 0, "peak_microbatches_in_flight": 0})
            entry["saved_bytes_per_microbatch"] = max(entry["saved_bytes_per_microbatch"], size)
            entry["peak_microbatches_in_flight"] = max(entry["peak_microbatches_in_flight"],
                                                       summary["peak_microbatches_in_flight"].get(s, 0))
    return {"stages": dict(sorted(stages.items(), key=lambda item: int(item[0]))), "ranks": summaries}


def simulated(plan: Plan, measured_work_ms: float) -> dict[str, Any]:
    """The plan's simulated stats per step (a filled cycle of K steps is divided by K), with the
    simulated makespan in ms at the measured ms per cost unit."""
    stats = plan.meta.get("stats") or {}
    cycle = max(plan.cycle_steps, 1)
    busy = stats.get("busy")
    sim_work = (sum(busy) if isinstance(busy, list) else _simulated_work(plan)) / cycle
    scale = measured_work_ms / sim_work if sim_work else None
    makespan = stats.get("makespan")
    per_step = makespan / cycle if isinstance(makespan, (int, float)) else None
    out = {"makespan": per_step, "bubble": stats.get("bubble", stats.get("bubble_fraction")),
           "utilization": stats.get("utilization"), "work_units": sim_work,
           "ms_per_unit": round(scale, 6) if scale else None}
    cluster = plan.meta.get("cluster")
    if isinstance(cluster, dict) and cluster.get("unit") == "s":  # a --cluster plan: its costs are seconds
        out["unit"], out["compiled_for"] = "s", f"{Path(str(cluster.get('model'))).name} on {cluster.get('cluster')}"
    if scale and per_step is not None:
        out["makespan_ms"] = round(per_step * scale, 3)
    return out


def _simulated_work(plan: Plan) -> float:
    """Total cost of the compute instructions of every rank over the whole cycle."""
    costs = plan.meta.get("costs") or {}
    total = 0.0
    for steps in plan.ranks:
        for instr in (i for step in steps for i in step):
            forward = next((h for h in instr.units() if h.op == OpKind.F), None)
            if instr.halves is not None and _cost(costs, OVERLAP, forward.stage) is not None:
                total += _cost(costs, OVERLAP, forward.stage)
                continue
            for unit in instr.units():
                if is_compute(unit.op) and unit.stage is not None:
                    total += (_cost(costs, unit.op, unit.stage) or 0.0) / (unit.parts or 1)
    return total


def _cost(costs: dict, kind: str, stage: int) -> float | None:
    """The plan's cost of `kind` at `stage` (a list per stage or one number), None when it has none."""
    per_stage = costs.get(kind)
    if isinstance(per_stage, list) and stage < len(per_stage):
        return per_stage[stage]
    return per_stage if isinstance(per_stage, (int, float)) else None


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def format_report(rep: dict[str, Any]) -> str:
    if not rep.get("steps"):
        return "report: no measured steps (use more --steps than --warmup)"
    sim = rep["simulated"]
    lines = [f"measured over {rep['steps']} steps on {rep['ranks']} ranks: makespan "
             f"{rep['makespan_ms']:.2f} ms, bubble {rep['bubble']}, utilization {rep['utilization']}"]
    if sim.get("makespan_ms") is not None:
        unit, per = ("s", "s") if sim.get("unit") == "s" else ("units", "unit")
        lines.append(f"simulated: makespan {sim['makespan']} {unit} = {sim['makespan_ms']:.2f} ms at "
                     f"{sim['ms_per_unit']:.4f} ms/{per}, bubble {sim['bubble']}, "
                     f"utilization {sim['utilization']}")
    if sim.get("compiled_for"):
        lines.append(f"note: the plan's costs are the prediction for {sim['compiled_for']}; this run trains "
                     "its own model (--model, --model-code), so its times are scaled to the prediction's, not "
                     "measured against it")
    for op, per_stage in rep["mean_ms"].items():
        cells = " ".join(f"{v:.3f}" for v in per_stage)
        lines.append(f"mean {op} ms by stage: {cells}")
    if rep.get("memory"):
        stages = rep["memory"]["stages"].values()
        peak = max(r["peak_saved_bytes"] for r in rep["memory"]["ranks"])
        lines.append("saved for backward, bytes per microbatch by stage: "
                     + " ".join(str(v["saved_bytes_per_microbatch"]) for v in stages)
                     + "; most microbatches in flight by stage: "
                     + " ".join(str(v["peak_microbatches_in_flight"]) for v in stages)
                     + f"; peak on a rank {peak / 2 ** 20:.2f} MiB")
    return "\n".join(lines)


def write_json(path: str | Path, obj: Any) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(target)
