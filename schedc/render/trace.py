"""The simulated schedule as a Chrome trace (chrome://tracing, Perfetto), shaped like the runtime's
measured traces (schedc/runtime/execution/trace.py), the events named by schedc/plan/trace.py: one process per rank named "rank r", complete ("X") events named
`F1.3` (kind, stage, microbatch), args op/stage/mb/pipe/step; an overlapped pair is one OVERLAP_F_B
event named by its halves (`F1.6 & B6.2`), args.halves = [{op, stage, mb}, ...] in the pair's order, as
the runtime writes it. Time scale: 1 cost unit = 1 ms (1000 µs),
which is exact when the costs come from a measured profile (`--costs`, in ms); under --cluster the
costs are seconds and drawn as such (1 s = 10^6 µs). The stats ride along in otherData only for a
schedule that passes its checks (`valid`).
"""
from __future__ import annotations

from typing import Any

from ..passes.compiled import Compiled
from ..ops import Opcode, split_unit
from ..plan.trace import event_name, pair_name
from .timed import TimedOp, in_seconds, timed_ops

US_PER_UNIT = 1000.0
US_PER_SECOND = 1e6


def chrome_trace(compiled: Compiled) -> dict[str, Any]:
    """traceEvents: process metadata per rank, then every timed op in program order per rank (a filled
    plan's cycle step after step, `args.step` = the step of the cycle)."""
    schedule = compiled.schedule
    scale = US_PER_SECOND if in_seconds(compiled) else US_PER_UNIT
    events: list[dict[str, Any]] = []
    for rank in range(schedule.devices):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    second = {id(b): f for f, b in schedule.fused}
    for rank, row in enumerate(timed_ops(compiled)):
        for n, t in enumerate(row):
            if id(t.op) in second:  # the second half of a pair: in the pair's event, made at the first
                continue
            if n + 1 < len(row) and second.get(id(row[n + 1].op)) is t.op:
                events.append(_pair_event(rank, t, row[n + 1], scale))
                continue
            op = t.op
            args = {"op": op.kind, "stage": op.stage, "mb": op.mb, "pipe": op.pipe, "step": t.step}
            if op.parts > 1 and op.is_task:
                args.update(part=op.part, parts=op.parts)
            elif op.parts > 1:  # a sequence chunk: its microbatch and chunk
                args.update(zip(("mb", "chunk"), split_unit(op.mb, op.parts)), chunks=op.parts)
            events.append({"name": event_name(op.kind, op.stage, op.mb), "ph": "X", "pid": rank, "tid": 0,
                           "ts": _us(t.start, scale), "dur": _duration(t.start, t.end, scale), "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": schedule.name, "params": schedule.params, "simulated": True,
                          "time_scale": "costs in seconds (--cluster)" if scale == US_PER_SECOND
                          else "1 cost unit = 1 ms", "valid": compiled.ok,
                          "stats": dict(compiled.stats) if compiled.ok else None}}


def _pair_event(rank: int, first: TimedOp, second: TimedOp, scale: float) -> dict[str, Any]:
    """An overlapped pair's one event, over both halves' time."""
    halves = (first.op, second.op)
    start, end = min(first.start, second.start), max(first.end, second.end)
    args = {"op": Opcode.OVERLAP_F_B.value, "stage": None, "mb": None, "pipe": None, "step": first.step,
            "halves": [{"op": h.kind, "stage": h.stage, "mb": h.mb} for h in halves]}
    name = pair_name(tuple((h.kind, h.stage, h.mb) for h in halves))
    return {"name": name, "ph": "X", "pid": rank, "tid": 0, "ts": _us(start, scale),
            "dur": _duration(start, end, scale), "args": args}


def _duration(start: float, end: float, scale: float) -> float:
    """The rounded end minus the rounded start: back-to-back ops touch, neither overlaps the next."""
    return round(_us(end, scale) - _us(start, scale), 3)


def _us(units: float, scale: float) -> float:
    return round(units * scale, 3)
