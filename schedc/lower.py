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
from typing import Any

from .ir import Dependencies, Op, Schedule
from .plan import Instr, Opcode, Plan
from .simulate import Timing, simulate

PLAN_KEYS = ("schedule", "description", "source", "params", "devices", "stages", "microbatches", "pipelines",
             "replicas", "costs", "stats")


class _Links:
    """The messages of an op, by (kind, pipeline, stage, device): sends after it, receives it consumes,
    each as (opcode, producing stage, peer)."""

    def __init__(self, schedule: Schedule):
        self.pipelines = schedule.pipelines
        self.cache: dict[tuple, tuple[tuple, tuple]] = {}

    def __call__(self, op: Op) -> tuple[tuple, tuple]:
        key = (op.kind, op.pipe, op.stage, op.device)
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = self._links(*key)
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
    devices, links = schedule.devices, _Links(schedule)
    step_links = [[links(op) for op in order] for order in step]
    send_order: list[dict[int, list[tuple]]] = [{} for _ in range(devices)]
    sends: list[list[list[tuple]]] = [[] for _ in range(devices)]  # per rank, per op: (peer, k, instr)
    for d, order in enumerate(step):
        for op, (out, _) in zip(order, step_links[d]):
            mine = []
            for kind, s, peer in out:
                queue = send_order[d].setdefault(peer, [])
                mine.append((peer, len(queue), Instr(kind, s, op.mb, op.pipe, peer)))
                queue.append(("RECV_F" if kind == "SEND_F" else "RECV_B", s, op.mb, op.pipe))
            sends[d].append(mine)
    ranks = [_RankStream(order, {p: send_order[p].get(d, []) for p in range(devices)})
             for d, order in enumerate(step)]
    events = []  # (time, 0 for sends at the end of a nonzero op, position in sequence, 0 start / 1 sends, data)
    at = [0] * devices
    for position, (start, end, op) in enumerate(sequence):
        events.append((start, 1, position, 0, op))
        out = sends[op.device][at[op.device]]
        at[op.device] += 1
        if out:
            events.append((end, 0 if end > start else 1, position, 1, (op.device, out)))
    events.sort(key=lambda event: event[:4])
    for _, _, _, what, data in events:
        if what == 0:
            ranks[data.device].run(data)
            continue
        d, out = data
        stream = ranks[d].stream
        for peer, k, instr in out:
            ranks[peer].post(d, k)  # the receiver posts it now, wherever it is: before its consumer starts
            stream.append(instr)
    return [rank.finish() + _sync_grads(schedule, d) + [Instr(Opcode.STEP.value)] for d, rank in enumerate(ranks)]


class _RankStream:
    """One rank's stream while it is written: its compute ops and the receives posted so far."""

    def __init__(self, order: tuple[Op, ...], incoming: dict):
        self.order, self.incoming = order, incoming              # incoming: peer -> messages, in send order
        self.posted = {peer: 0 for peer in incoming}              # receives posted, per peer (a prefix)
        self.stream: list[Instr] = []
        self.pc = 0

    def post(self, peer: int, upto: int) -> None:
        """Post the receives from peer up to message `upto`, in the peer's send order."""
        for k in range(self.posted[peer], upto + 1):
            kind, s, mb, pipe = self.incoming[peer][k]
            self.stream.append(Instr(kind, s, mb, pipe, peer))
        self.posted[peer] = max(self.posted[peer], upto + 1)

    def run(self, op: Op) -> None:
        assert self.order[self.pc] is op, "the simulated sequence follows every device's order"
        self.stream.append(Instr(op.kind, op.stage, op.mb, op.pipe) if op.parts == 1 else
                           Instr(op.kind, op.stage, op.mb, op.pipe, part=op.part, parts=op.parts))
        self.pc += 1

    def finish(self) -> list[Instr]:
        for peer, msgs in self.incoming.items():
            if msgs:
                self.post(peer, len(msgs) - 1)
        return self.stream


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
