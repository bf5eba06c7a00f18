"""Measured Chrome traces (written by the runtime, or by `schedc render -o X.json`) read back for
drawing next to the simulation.

One step is drawn: the last one in the trace (warm). Its compute events (not sends, receives, gradient
sync, STEP, nor the runtime's "wait" events, time blocked on a receive) are kept per rank, in ms from the step's first event;
an OVERLAP_F_B's event is drawn as its halves, each over its whole time (stacked in one box, as the simulation draws it). `ms_per_unit` is the
measured compute time per rank over the simulated one, so that perfectly predicted costs line up.

A trace of another shape than the schedule (other ranks, stages or microbatches) is refused, naming
both; one of the same shape measured on another schedule (by name) or plan (by hash) is drawn with
a warning.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..inputs import load_json, read_source
from ..diagnostics import USAGE, SchedError, Source, error
from ..text import listed, plural
from ..ir import Schedule
from ..plan.trace import WAIT, half_args, is_compute


@dataclass(frozen=True, slots=True)
class MeasuredOp:
    kind: str
    stage: int | None
    mb: int | None
    pipe: int
    start: float  # ms from the step's start
    end: float
    half: int | None = None  # of an OVERLAP_F_B's event: its first (0) or second (1) half

    @property
    def busy(self) -> float:
        """The time the op takes on its rank: an overlapped pair's once, at its first half."""
        return 0.0 if self.half == 1 else self.end - self.start


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    step: int
    ranks: tuple[int, ...]
    ops: tuple[tuple[MeasuredOp, ...], ...]   # ops[n] = compute ops of ranks[n], by start time
    makespan_ms: float
    ms_per_unit: float
    warnings: tuple[str, ...] = ()  # what differs between the trace and the schedule it is drawn with


def _usage(message: str, path: str) -> SchedError:
    return SchedError(error(message), Source(str(path), ""), kind=USAGE)


def read_events(path: str) -> tuple[list[dict], dict]:
    """The complete ("X") events of a Chrome trace and its otherData (schedule name, plan hash)."""
    data = load_json(read_source(path, "the measured trace"), "the measured trace")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise _usage("not a Chrome trace (expected {\"traceEvents\": [...]})", path)
    other = data.get("otherData") if isinstance(data, dict) else None
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"], other if isinstance(other, dict) else {}


def load_measured(path: str, schedule: Schedule, plan_hash: str = "") -> MeasuredRun:
    """The last measured step of a trace, with its time scale against the simulation of `schedule`
    (whose plan, if read from plan.json, has `plan_hash`); a field of the wrong type (a "ts" of "x")
    or a trace of another shape is a usage error naming the file."""
    try:
        events, other = read_events(path)
        run = _load_measured(path, schedule, events)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise _usage(f"not a usable measured trace: {type(exc).__name__}: {exc}", path) from None
    return _matched(run, schedule, events, other, plan_hash, path)


def _matched(run: MeasuredRun, schedule: Schedule, events: list[dict], other: dict, plan_hash: str,
             path: str) -> MeasuredRun:
    """The run, refused if its ranks, stages or microbatches are not the schedule's (world ranks may be
    a multiple of the devices: data parallelism), with warnings if its schedule or plan is another."""
    stages, mbs = _coverage([e for e in events if int(_args(e).get("step") or 0) == run.step])
    ranks_fit = run.ranks == tuple(range(len(run.ranks))) and len(run.ranks) % max(schedule.devices, 1) == 0
    if not ranks_fit or (stages, mbs) != (set(range(schedule.stages)), set(range(schedule.microbatches))):
        raise _usage(f"the measured trace does not fit {schedule.title}: it has "
                     f"{plural(len(run.ranks), 'rank')}, "
                     f"{_span('stage', stages)} and {_span('microbatch', mbs, 'microbatches')}, the schedule "
                     f"{plural(schedule.devices, 'device')}, {plural(schedule.stages, 'stage')} and "
                     f"{plural(schedule.microbatches, 'microbatch', 'microbatches')}{_origin(other)}; render the "
                     "schedule the trace was measured on", path)
    warnings = []
    name, measured_hash = other.get("schedule"), other.get("hash")
    if isinstance(name, str) and name != schedule.name:
        warnings.append(f"the measured trace {path} is of schedule '{name}', drawn above '{schedule.name}'")
    elif isinstance(measured_hash, str) and plan_hash and measured_hash != plan_hash:
        warnings.append(f"the measured trace {path} is of plan {measured_hash[:12]}, drawn above plan "
                        f"{plan_hash[:12]} (another compile of '{schedule.name}')")
    return replace(run, warnings=tuple(warnings))


def _coverage(events: list[dict]) -> tuple[set[int], set[int]]:
    """The stages and microbatches the compute events of one step name (overlapped halves included)."""
    stages, mbs = set(), set()
    for e in events:
        a = _args(e)
        if not _is_compute(e):
            continue
        pairs = [(a.get("stage"), a.get("mb"))]
        halves = a.get("halves")
        for half in halves if isinstance(halves, list) else ():  # {op, stage, mb}, or older traces' "F0.3"
            half = half_args(half)
            pairs.append((half.get("stage"), half.get("mb")))
        for stage, mb in pairs:
            if isinstance(stage, int) and not isinstance(stage, bool):
                stages.add(stage)
            if isinstance(mb, int) and not isinstance(mb, bool):
                mbs.add(mb)
    return stages, mbs


def _span(noun: str, values: set[int], nouns: str | None = None) -> str:
    """`stages 0-3`, `stage 0`, `stages 0-1, 5`, `no stages`."""
    if not values:
        return f"no {nouns or noun + 's'}"
    ordered, runs = sorted(values), []
    for v in ordered:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = listed([f"{a}" if a == b else f"{a}-{b}" for a, b in runs])
    return f"{noun if len(values) == 1 else nouns or noun + 's'} {text}"


def _origin(other: dict) -> str:
    name, measured_hash = other.get("schedule"), other.get("hash")
    parts = ([f"schedule '{name}'"] if isinstance(name, str) else []) + (
        [f"plan {measured_hash[:12]}"] if isinstance(measured_hash, str) else [])
    return f" (measured on {', '.join(parts)})" if parts else ""


def _load_measured(path: str, schedule: Schedule, events: list[dict]) -> MeasuredRun:
    events = [e for e in events if _is_compute(e)]
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
        halves = [half_args(h) for h in a["halves"]] if isinstance(a.get("halves"), list) else [a]
        for k, half in enumerate(halves):  # an OVERLAP_F_B: its halves stacked in its one box
            pipe = half.get("pipe", pipe_of.get(half.get("mb"), 0))
            op = MeasuredOp(str(half.get("op", e.get("name"))), half.get("stage"), half.get("mb"), int(pipe or 0),
                            start, end, k if len(halves) == 2 else None)
            by_rank.setdefault(int(e.get("pid", 0)), []).append(op)
    ranks = tuple(sorted(by_rank))
    ops = tuple(tuple(sorted(by_rank[r], key=lambda o: (o.start, o.end))) for r in ranks)
    makespan = max(o.end for row in ops for o in row)
    work = sum(o.busy for row in ops for o in row) / len(ranks)
    sim_work = sum(op.cost for op in schedule.ops()) / max(schedule.devices, 1)
    return MeasuredRun(step, ranks, ops, makespan, work / sim_work if sim_work and work > 0 else 1.0)


def _is_compute(event: dict) -> bool:
    """A compute event: not the runtime's wait, nor a message, sync or STEP (by its op, else its name)."""
    return event.get("name") != WAIT and is_compute(_args(event).get("op", event.get("name")))


def _args(event: dict) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}
