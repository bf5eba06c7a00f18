"""Lowering: a schedule's per-device orders -> per-rank instruction streams with communication.

A forward whose next stage sits on another device gets a SEND_F after it and a RECV_F on the
consumer; gradients likewise (SEND_B/RECV_B). Streams are written in simulated time order and a
receive is posted when its message is sent: in the sender's send order (NCCL matches messages per pair
in issue order), early enough not to stall the consumer, and so that no two ranks' sends can wait on
each other (see lower_step).
Replicated stages get SYNC_GRAD (ascending stage, the same order on every rank), then STEP.

    device 0: F(0,0) B(0,0)          rank 0: F(0,0) SEND_F(0,0)->1 RECV_B(1,0)<-1 B(0,0) STEP
    device 1: F(1,0) B(1,0)   ->     rank 1: RECV_F(0,0)<-0 F(1,0) B(1,0) SEND_B(1,0)->0 STEP
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from operator import attrgetter
from typing import Any

from .ir import Dependencies, Op, Schedule
from .plan import Instr, Opcode, Plan
from .simulate import Timing, simulate

LINK_KEY = attrgetter("kind", "pipe", "stage", "device")


class _Links(dict):
    """The messages of an op, by LINK_KEY (kind, pipeline, stage, device): sends after it, receives it
    consumes, each as (opcode, producing stage, peer). A dict filled on first use, so that looking up a
    device's order is one C-level map."""

    def __init__(self, schedule: Schedule):
        super().__init__()
        self.pipelines = schedule.pipelines

    def __missing__(self, key: tuple) -> tuple[tuple, tuple]:
        found = self[key] = self._links(*key)
        return found

    def _links(self, kind: str, k: int, s: int, device: int) -> tuple[tuple, tuple]:
        pipe = self.pipelines[k]
        place, sends, recvs = pipe.placement, [], []
        if kind == "F":
            if s + 1 < pipe.stages and place[s + 1] != device:
                sends.append(("SEND_F", s, place[s + 1]))
            if s > 0 and place[s - 1] != device:
                recvs.append(("RECV_F", s - 1, place[s - 1]))
        elif kind in ("B", "I"):
            if s > 0 and place[s - 1] != device:
                sends.append(("SEND_B", s, place[s - 1]))
            if s + 1 < pipe.stages and place[s + 1] != device:
                recvs.append(("RECV_B", s + 1, place[s + 1]))
        return tuple(sends), tuple(recvs)


def lower_step(schedule: Schedule, step: tuple[tuple[Op, ...], ...],
               sequence: tuple[tuple[float, float, Op], ...]) -> list[list[Instr]]:
    """Lower one step program of every device; returns instruction lists per rank.

    The streams are written in simulated time: each op when it starts, its sends when it ends (`sequence`
    is the simulation's (start, end, op) in start order, a topological order). When a send is written,
    its receive is posted on the receiver at the receiver's current place: while it computes something
    else, before the consumer starts, and in the sender's order. Every wait (a send on its receive, a
    consumer on its data, an instruction on the one before it) then points backwards in this sweep, so
    a replay with rendezvous sends cannot deadlock.
    """
    devices = schedule.devices
    sends, receives = _messages(step, _Links(schedule))
    streams: list[list[Instr]] = [[] for _ in range(devices)]
    posted = [[0] * devices for _ in range(devices)]  # posted[r][d]: receives rank r posted from d (a prefix)
    for _, _, _, ends, d, data in _events(sequence, sends):
        if not ends:  # an op starts
            streams[d].append(data)
            continue
        for peer, k, instr in data:  # an op ends: its sends, each after the receiver posts it
            _post(streams[peer], posted[peer], receives[peer][d], d, k + 1)
            streams[d].append(instr)
    for r in range(devices):
        for d in range(devices):
            _post(streams[r], posted[r], receives[r][d], d, len(receives[r][d]))
    return [stream + _sync_grads(schedule, d) + [Instr(Opcode.STEP.value)] for d, stream in enumerate(streams)]


_instr = partial(tuple.__new__, Instr)  # Instr from all eight fields (skips the Python-level __new__)


def _compute(op: Op) -> Instr:
    if op.parts == 1:
        return _instr((op.kind, op.stage, op.mb, op.pipe, None, None, None, None))
    return _instr((op.kind, op.stage, op.mb, op.pipe, None, None, op.part, op.parts))


def _messages(step: tuple[tuple[Op, ...], ...], links: _Links) -> tuple[dict, list]:
    """sends[id(op)]: the sends after op, as (peer, k, instr) with k its place among the messages op's
    device sends to peer; receives[r][d]: the receives rank r posts from d, in d's send order."""
    devices = len(step)
    sends: dict[int, list[tuple]] = {}
    receives: list[list[list[Instr]]] = [[[] for _ in range(devices)] for _ in range(devices)]
    for d, order in enumerate(step):
        for op, (out, _) in zip(order, map(links.__getitem__, map(LINK_KEY, order))):
            if out:
                sends[id(op)] = mine = []
                for kind, s, peer in out:
                    incoming = receives[peer][d]
                    mine.append((peer, len(incoming), _instr((kind, s, op.mb, op.pipe, peer, None, None, None))))
                    incoming.append(_instr((_RECEIVE[kind], s, op.mb, op.pipe, d, None, None, None)))
    return sends, receives


_RECEIVE = {"SEND_F": "RECV_F", "SEND_B": "RECV_B"}


def _events(sequence: tuple[tuple[float, float, Op], ...], sends: dict[int, list[tuple]]) -> list[tuple]:
    """The sweep in time order: (time, 0 for the sends at the end of a nonzero op else 1, position in
    sequence, 0 at the op's start / 1 at its end, device, the op's instruction at its start or its
    sends at its end). The first four fields are unique, so the tuples sort without comparing the rest."""
    events = []
    for position, (start, end, op) in enumerate(sequence):
        events.append((start, 1, position, 0, op.device, _compute(op)))
        out = sends.get(id(op))
        if out:
            events.append((end, 0 if end > start else 1, position, 1, op.device, out))
    events.sort()
    return events


def _post(stream: list[Instr], posted: list[int], incoming: list[Instr], peer: int, upto: int) -> None:
    """Post the receives from peer before message `upto`, in the peer's send order."""
    if posted[peer] < upto:
        stream += incoming[posted[peer]:upto]
        posted[peer] = upto


def _sync_grads(schedule: Schedule, device: int) -> list[Instr]:
    """SYNC_GRAD for every replicated stage this device holds, ascending by stage."""
    out = []
    for group in schedule.replicas:
        for s in range(schedule.pipelines[group[0]].stages):
            ranks = sorted({schedule.pipelines[k].placement[s] for k in group})
            if device in ranks and len(ranks) > 1:
                out.append(Instr(Opcode.SYNC_GRAD.value, s, None, group=tuple(ranks)))
    return sorted(out, key=lambda i: i.stage)


def plan_meta(schedule: Schedule, stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "schedule": schedule.name,
        "description": schedule.description,
        "source": schedule.source.path,
        "params": schedule.params,
        "devices": schedule.devices,
        "stages": schedule.stages,
        "microbatches": schedule.microbatches,
        "pipelines": [{"name": p.name, "stages": p.stages, "placement": list(p.placement),
                       "microbatches": list(p.microbatches)} for p in schedule.pipelines],
        "replicas": [list(g) for g in schedule.replicas],
        "costs": {k: list(v) for k, v in schedule.costs.items()},
        "stats": stats,
    }


def _sequence(schedule: Schedule, step: tuple[tuple[Op, ...], ...]) -> tuple[Op, ...]:
    """The start order of one step program of a filled cycle. Only the built-in dependencies count:
    a task placed in a later step reads inputs saved in an earlier one, and tasks send nothing."""
    builtin = Dependencies(schedule.pipelines, schedule.costs, schedule.split_backward, {}, ())
    return simulate(replace(schedule, orders=step, cycle=(), deps=builtin)).sequence


def lower(schedule: Schedule, stats: dict[str, Any], timing: Timing | None = None) -> Plan:
    """Schedule -> Plan: every rank's K step programs with communication, gradient sync and STEP.
    `timing` (of the unfilled orders) saves simulating them again."""
    steps = []
    for step in schedule.steps:
        known = timing is not None and timing.sequence and step is schedule.orders
        steps.append(lower_step(schedule, step, timing.sequence if known else _sequence(schedule, step)))
    ranks = tuple(tuple(tuple(steps[k][d]) for k in range(len(steps))) for d in range(schedule.devices))
    return Plan(plan_meta(schedule, stats), ranks)
