"""Lowering: a schedule's per-device orders -> per-rank instruction streams with communication.

A forward whose next stage sits on another device gets a SEND_F after it and a RECV_F on the
consumer; gradients likewise (SEND_B/RECV_B). Receives are posted in the sender's send order (NCCL
matches messages per pair in issue order) and one message ahead: the receive of message k from a peer
is posted right after the consumer of message k-1. A replay under rendezvous semantics then moves
receives earlier wherever two ranks' sends would otherwise wait on each other.
Replicated stages get SYNC_GRAD (ascending stage, the same order on every rank), then STEP.

    device 0: F(0,0) B(0,0)          rank 0: F(0,0) SEND_F(0,0)->1 RECV_B(1,0)<-1 B(0,0) STEP
    device 1: F(1,0) B(1,0)   ->     rank 1: RECV_F(0,0)<-0 F(1,0) B(1,0) SEND_B(1,0)->0 STEP
"""
from __future__ import annotations

from collections import deque
from typing import Any

from .ir import Op, Schedule
from .plan import Instr, Opcode, Plan

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


def _post_positions(order: tuple[Op, ...], consumers: list[tuple[int, tuple]], rank_sends: dict) -> dict:
    """Where each receive is posted: before compute op p_k, in the sender's send order."""
    positions: dict[int, list[tuple]] = {}
    by_peer: dict[int, dict[tuple, int]] = {}
    for position, msg in consumers:
        by_peer.setdefault(msg[4], {})[msg[:4]] = position
    for peer, needed in by_peer.items():
        sequence = [m for m in rank_sends[peer] if m in needed]  # the peer's send order to us
        post = [0] * len(sequence)
        for k, msg in enumerate(sequence):
            post[k] = min(needed[msg], needed[sequence[k - 1]] + 1 if k else 0)
        for k in range(len(sequence) - 2, -1, -1):
            post[k] = min(post[k], post[k + 1])
        for k, msg in enumerate(sequence):
            positions.setdefault(post[k], []).append((msg, peer))
    return positions


def lower_step(schedule: Schedule, step: tuple[tuple[Op, ...], ...]) -> list[list[Instr]]:
    """Lower one step program of every device; returns instruction lists per rank.

    The streams are written by replaying all ranks under rendezvous semantics (a send completes only
    once its receiver has posted the receive): receives go where _post_positions plans them, and where
    two ranks would block each other's sends, the waiting receive is posted at once instead.
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
    ranks = [_RankReplay(schedule, d, order, step_links[d], {p: send_order[p].get(d, []) for p in range(devices)},
                         sends[d]) for d, order in enumerate(step)]
    _replay(ranks)
    return [rank.finish() for rank in ranks]


class _RankReplay:
    """One rank during lowering: its compute ops, planned receive posts and the stream written so far."""

    def __init__(self, schedule: Schedule, d: int, order: tuple[Op, ...], op_links: list, incoming: dict,
                 sends: list[list[tuple]]):
        self.schedule, self.d, self.order, self.sends = schedule, d, order, sends
        self.incoming = incoming                                 # peer -> messages in the peer's send order
        index = {(msg, peer): k for peer, msgs in incoming.items() for k, msg in enumerate(msgs)}
        self.needs = [[(peer, index[((kind, s, op.mb, op.pipe), peer)]) for kind, s, peer in recvs]
                      for op, (_, recvs) in zip(order, op_links)]
        consumers = [(n, (kind, s, op.mb, op.pipe, peer)) for n, (op, (_, recvs)) in enumerate(zip(order, op_links))
                     for kind, s, peer in recvs]
        self.plan = {n: [(peer, index[(msg, peer)]) for msg, peer in posted]
                     for n, posted in _post_positions(order, consumers, incoming).items()}
        self.posted = {peer: 0 for peer in incoming}              # receives posted, per peer (a prefix)
        self.sent: dict[int, int] = {}                            # sends completed, per peer
        self.stream: list[Instr] = []
        self.pc, self.next_send = 0, None                         # next_send: index into sends[pc] once run

    def post(self, peer: int, upto: int) -> bool:
        """Post the receives from peer up to message `upto` (in order); True if any was new."""
        first = self.posted[peer]
        for k in range(first, upto + 1):
            kind, s, mb, pipe = self.incoming[peer][k]
            self.stream.append(Instr(kind, s, mb, pipe, peer))
        self.posted[peer] = max(first, upto + 1)
        return upto >= first

    def advance(self, ranks: list[_RankReplay], wake) -> None:
        """Run until blocked: on data not yet sent, or on a send whose receive is not yet posted."""
        order, sends, needs, plan, d = self.order, self.sends, self.needs, self.plan, self.d
        append, pc, next_send = self.stream.append, self.pc, self.next_send
        while pc < len(order):
            if next_send is None:
                if pc in plan:
                    for peer, k in plan[pc]:
                        if self.post(peer, k):
                            wake(peer)
                for peer, k in needs[pc]:
                    if ranks[peer].sent.get(d, 0) <= k:
                        self.pc, self.next_send = pc, None
                        return
                op = order[pc]
                append(Instr(op.kind, op.stage, op.mb, op.pipe) if op.parts == 1 else
                       Instr(op.kind, op.stage, op.mb, op.pipe, part=op.part, parts=op.parts))
                next_send = 0
            pending = sends[pc]
            while next_send < len(pending):
                peer, k, instr = pending[next_send]
                if ranks[peer].posted.get(d, 0) <= k:
                    self.pc, self.next_send = pc, next_send
                    return
                append(instr)
                self.sent[peer] = k + 1
                next_send += 1
                wake(peer)
            pc, next_send = pc + 1, None
        self.pc, self.next_send = pc, None

    def blocked_send(self) -> tuple[int, int] | None:
        """(peer, message index) of the send this rank waits on, if it waits on one."""
        if self.next_send is None or self.pc >= len(self.order):
            return None
        peer, k, _ = self.sends[self.pc][self.next_send]
        return peer, k

    def finish(self) -> list[Instr]:
        for peer, msgs in self.incoming.items():
            if msgs:
                self.post(peer, len(msgs) - 1)
        return self.stream + _sync_grads(self.schedule, self.d) + [Instr(Opcode.STEP.value)]


def _replay(ranks: list[_RankReplay]) -> None:
    """Advance every rank; when all wait, post early the receive that a blocked send waits for."""
    ready, queued = deque(range(len(ranks))), [True] * len(ranks)

    def wake(d: int) -> None:
        if not queued[d]:
            queued[d] = True
            ready.append(d)

    while True:
        while ready:
            d = ready.popleft()
            queued[d] = False
            ranks[d].advance(ranks, wake)
        stuck = [(d, wait) for d, rank in enumerate(ranks) if (wait := rank.blocked_send())]
        if not stuck:
            if any(rank.pc < len(rank.order) for rank in ranks):
                raise ValueError("lowering a schedule whose orders deadlock (check_deadlock refuses it)")
            return
        d, (peer, k) = stuck[0]
        ranks[peer].post(d, k)
        wake(d)
        wake(peer)


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


def lower(schedule: Schedule, stats: dict[str, Any]) -> Plan:
    """Schedule -> Plan: every rank's K step programs with communication, gradient sync and STEP."""
    steps = [lower_step(schedule, step) for step in schedule.steps]
    ranks = tuple(tuple(tuple(steps[k][d]) for k in range(len(steps))) for d in range(schedule.devices))
    return Plan(plan_meta(schedule, stats), ranks)
