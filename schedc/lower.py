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
    """Lower one step program of every device; returns instruction lists per rank."""
    devices, links = schedule.devices, _Links(schedule)
    step_links = [[links(op) for op in order] for order in step]
    # per rank and peer: the messages it sends there, in order, keyed as the receiver names them
    send_order: list[dict[int, list[tuple]]] = [{} for _ in range(devices)]
    for d, order in enumerate(step):
        for op, (sends, _) in zip(order, step_links[d]):
            for kind, s, peer in sends:
                recv = "RECV_F" if kind == "SEND_F" else "RECV_B"
                send_order[d].setdefault(peer, []).append((recv, s, op.mb, op.pipe))
    return [_lower_rank(schedule, d, order, step_links[d], {p: send_order[p].get(d, []) for p in range(devices)})
            for d, order in enumerate(step)]


def _lower_rank(schedule: Schedule, d: int, order: tuple[Op, ...], op_links: list, to_me: dict) -> list[Instr]:
    consumers = [(n, (kind, s, op.mb, op.pipe, peer)) for n, (op, (_, recvs)) in enumerate(zip(order, op_links))
                 for kind, s, peer in recvs]
    posts = _post_positions(order, consumers, to_me)
    stream: list[Instr] = []
    append = stream.append
    for n, op in enumerate(order):
        if n in posts:
            for (kind, s, mb, k), peer in posts[n]:
                append(Instr(kind, s, mb, k, peer))
        append(Instr(op.kind, op.stage, op.mb, op.pipe) if op.parts == 1
               else Instr(op.kind, op.stage, op.mb, op.pipe, part=op.part, parts=op.parts))
        for kind, s, peer in op_links[n][0]:
            append(Instr(kind, s, op.mb, op.pipe, peer))
    for (kind, s, mb, k), peer in posts.get(len(order), ()):
        append(Instr(kind, s, mb, k, peer))
    stream.extend(_sync_grads(schedule, d))
    append(Instr(Opcode.STEP.value))
    return stream


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
