"""Measured Chrome traces (written by the runtime, or by `schedc render -o X.json`) read back for
drawing next to the simulation.

One step is drawn: the last one in the trace (warm). Its compute events (not sends, receives, gradient
sync, STEP, nor the runtime's "wait" events, time blocked on a receive) are kept per rank, in ms from the step's first event;
an OVERLAP_F_B's event is drawn as its halves, each over half its time, as the simulation draws it. `ms_per_unit` is the
measured compute time per rank over the simulated one, so that perfectly predicted costs line up.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..diagnostics import SchedError, Source, error
from ..ir import Schedule
from ..plan import NOT_COMPUTE as NOT_COMPUTE_INSTRS

NOT_COMPUTE = NOT_COMPUTE_INSTRS | {"wait"}  # and the runtime's wait events


@dataclass(frozen=True, slots=True)
class MeasuredOp:
    kind: str
    stage: int | None
    mb: int | None
    pipe: int
    start: float  # ms from the step's start
    end: float


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    step: int
    ranks: tuple[int, ...]
    ops: tuple[tuple[MeasuredOp, ...], ...]   # ops[n] = compute ops of ranks[n], by start time
    makespan_ms: float
    ms_per_unit: float


def _usage(message: str, path: str) -> SchedError:
    return SchedError(error(message), Source(str(path), ""), exit_code=2)


def read_events(path: str) -> list[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _usage(f"cannot read the measured trace: {exc}", path) from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise _usage("not a Chrome trace (expected {\"traceEvents\": [...]})", path)
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def load_measured(path: str, schedule: Schedule) -> MeasuredRun:
    """The last measured step of a trace, with its time scale against the simulation of `schedule`;
    a field of the wrong type (a "ts" of "x") is a usage error naming the file."""
    try:
        return _load_measured(path, schedule)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise _usage(f"not a usable measured trace: {type(exc).__name__}: {exc}", path) from None


def _load_measured(path: str, schedule: Schedule) -> MeasuredRun:
    events = [e for e in read_events(path)
              if e.get("name") != "wait" and _args(e).get("op", e.get("name")) not in NOT_COMPUTE]
    if not events:
        raise _usage("the measured trace has no compute events", path)
    step = max(int(_args(e).get("step") or 0) for e in events)
    events = [e for e in events if int(_args(e).get("step") or 0) == step]
    t0 = min(float(e["ts"]) for e in events) / 1e3
    pipe_of = schedule.pipeline_of_mb()
    by_rank: dict[int, list[MeasuredOp]] = {}
    for e in events:
        a = _args(e)
        start = float(e["ts"]) / 1e3 - t0
        end = start + float(e.get("dur", 0)) / 1e3
        halves = a.get("halves") if isinstance(a.get("halves"), list) else [a]
        for k, half in enumerate(halves):  # an OVERLAP_F_B: its halves side by side in its one box
            pipe = half.get("pipe", pipe_of.get(half.get("mb"), 0))
            op = MeasuredOp(str(half.get("op", e.get("name"))), half.get("stage"), half.get("mb"), int(pipe or 0),
                            start + (end - start) * k / len(halves), start + (end - start) * (k + 1) / len(halves))
            by_rank.setdefault(int(e.get("pid", 0)), []).append(op)
    ranks = tuple(sorted(by_rank))
    ops = tuple(tuple(sorted(by_rank[r], key=lambda o: (o.start, o.end))) for r in ranks)
    makespan = max(o.end for row in ops for o in row)
    work = sum(o.end - o.start for row in ops for o in row) / len(ranks)
    sim_work = sum(op.cost for op in schedule.ops()) / max(schedule.devices, 1)
    return MeasuredRun(step, ranks, ops, makespan, work / sim_work if sim_work and work > 0 else 1.0)


def _args(event: dict) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}
