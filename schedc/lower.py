"""Lowering: a schedule's per-device orders -> per-rank instruction streams with communication.

A forward whose next stage sits on another device gets a SEND_F after it and a RECV_F on the
consumer; gradients likewise (SEND_B/RECV_B). Receives are posted in the sender's send order (NCCL
matches messages per pair in issue order) and one message ahead: the receive of message k from a peer
is posted right after the consumer of message k-1, so neither side can block the other's send.
Replicated stages get SYNC_GRAD (ascending stage, the same order on every rank), then STEP.

    device 0: F(0,0) B(0,0)          rank 0: F(0,0) SEND_F(0,0)->1 RECV_B(1,0)<-1 B(0,0) STEP
    device 1: F(1,0) B(1,0)   ->     rank 1: RECV_F(0,0)<-0 F(1,0) B(1,0) SEND_B(1,0)->0 STEP
"""
from __future__ import annotations

from typing import Any

from .ir import Op, Schedule
from .plan import Instr, Opcode, Plan

PLAN_KEYS = ("schedule", "description", "source", "params", "devices", "stages", "microbatches", "pipelines",
             "replicas", "costs", "stats")


def _instr(op: Op) -> Instr:
    if op.parts > 1:
        return Instr(op.kind, op.stage, op.mb, op.pipe, part=op.part, parts=op.parts)
    return Instr(op.kind, op.stage, op.mb, op.pipe)


def _messages(schedule: Schedule, op: Op) -> tuple[list[tuple], list[tuple]]:
    """(sends after op, receives op consumes) as (kind, producing stage, mb, pipe, peer) tuples."""
    sends, recvs = _links(schedule, op.kind, op.pipe, op.stage, op.device)
    mb, k = op.mb, op.pipe
    return ([(kind, s, mb, k, peer) for kind, s, peer in sends],
            [(kind, s, mb, k, peer) for kind, s, peer in recvs])


def _links(schedule: Schedule, kind: str, k: int, s: int, device: int, cache: dict = {}) -> tuple:
    """The messages of an op kind at stage s of pipeline k: (kind, producing stage, peer) lists."""
    key = (id(schedule.pipelines), kind, k, s, device)
    found = cache.get(key)
    if found is None:
        pipe = schedule.pipelines[k]
        place, sends, recvs = pipe.placement, [], []
        if kind == "F":
            if s + 1 < pipe.stages and place[s + 1] != device:
                sends.append((Opcode.SEND_F, s, place[s + 1]))
            if s > 0 and place[s - 1] != device:
                recvs.append((Opcode.RECV_F, s - 1, place[s - 1]))
        elif kind in ("B", "I"):
            if s > 0 and place[s - 1] != device:
                sends.append((Opcode.SEND_B, s, place[s - 1]))
            if s + 1 < pipe.stages and place[s + 1] != device:
                recvs.append((Opcode.RECV_B, s + 1, place[s + 1]))
        found = cache[key] = (tuple(sends), tuple(recvs))
    return found


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
    """Lower one step program of every device; returns instruction lists per rank."""
    devices = schedule.devices
    sends_after = [[_messages(schedule, op)[0] for op in order] for order in step]
    # per rank: the ordered messages it sends to each peer, as (kind->SEND, stage, mb, pipe)
    send_order: list[dict[int, list[tuple]]] = [{} for _ in range(devices)]
    for d in range(devices):
        for sends in sends_after[d]:
            for kind, s, mb, k, peer in sends:
                recv_kind = Opcode.RECV_F if kind is Opcode.SEND_F else Opcode.RECV_B
                send_order[d].setdefault(peer, []).append((recv_kind, s, mb, k))
    streams = []
    for d, order in enumerate(step):
        consumers = [(n, (*m[:4], m[4])) for n, op in enumerate(order) for m in _messages(schedule, op)[1]]
        to_me = {peer: send_order[peer].get(d, []) for peer in range(devices)}
        posts = _post_positions(order, consumers, to_me)
        stream: list[Instr] = []
        for n, op in enumerate(order):
            stream.extend(Instr(m[0].value, m[1], m[2], m[3], peer) for m, peer in posts.get(n, ()))
            stream.append(_instr(op))
            stream.extend(Instr(k.value, s, mb, p, peer) for k, s, mb, p, peer in sends_after[d][n])
        stream.extend(Instr(m[0].value, m[1], m[2], m[3], peer) for m, peer in posts.get(len(order), ()))
        stream.extend(_sync_grads(schedule, d))
        stream.append(Instr(Opcode.STEP.value))
        streams.append(stream)
    return streams


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
