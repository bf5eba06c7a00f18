"""Message matching between ranks, once. NCCL pairs point-to-point messages per ordered pair of ranks
in issue order, not by tag: for every ordered pair (a, b) the sends of a to b must be, one for one, the
receives b posts from a, each named by what it carries (direction F or B, stage, microbatch, pipeline).
The compiler's check (schedc/checks/channels/pairs.py) names the faults of a step program with it; the
runtime (schedc/runtime/model/train.py) refuses a plan with it before any message is sent.

    rank 0: SEND_F(0,0)>1 SEND_F(0,1)>1        rank 1: RECV_F(0,1)<0 RECV_F(0,0)<0
    -> Mismatch(pair=(0, 1), index=0, sent=[('F', 0, 0, 0), ('F', 0, 1, 0)],
                received=[('F', 0, 1, 0), ('F', 0, 0, 0)])

A stream is a sequence of instructions as tuples (plan.format.Instr): op, stage, mb, pipe, peer, ...
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from ..ops import COMM, RECVS, SENDS, carries

Message = tuple  # (direction, stage, mb, pipe): what both ends of a message call it
_DIRECTION = {op: carries(op) for op in COMM}  # the kind a message is named by, F or B


class Mismatch(NamedTuple):
    """The messages from rank pair[0] to rank pair[1] that do not match, from the first difference on."""

    pair: tuple[int, int]
    index: int           # the first message at which sent and received differ
    sent: list[Message]
    received: list[Message]


def message(instr: tuple) -> Message:
    """A send's or receive's message as both ends name it: a pipe of None is pipeline 0."""
    return _DIRECTION[instr[0]], instr[1], instr[2], instr[3] or 0


def by_pair(streams: Iterable[Sequence[tuple]]) -> tuple[dict, dict]:
    """(sent, received): for each ordered pair of ranks (a, b), the instructions a sends to b and those
    b posts to receive from a, each in issue order. streams[r] is rank r's step program."""
    sent: dict[tuple, list] = {}
    received: dict[tuple, list] = {}
    for r, stream in enumerate(streams):
        for ins in stream:
            op = ins[0]
            if op in SENDS:
                sent.setdefault((r, ins[4]), []).append(ins)
            elif op in RECVS:
                received.setdefault((ins[4], r), []).append(ins)
    return sent, received


def first_difference(sent: list[Message], received: list[Message]) -> int | None:
    """The index of the first message on which the two ends disagree (None when they agree), a message
    missing at one end included."""
    if sent == received:
        return None
    return next((k for k, (x, y) in enumerate(zip(sent, received)) if x != y), min(len(sent), len(received)))


def mismatches(streams: Sequence[Sequence[tuple]]) -> Iterator[Mismatch]:
    """Every ordered pair of ranks whose sends are not its receives, pairs in order (compared as text,
    so a malformed peer still sorts)."""
    sent, received = by_pair(streams)
    for pair in sorted(sent.keys() | received.keys(), key=str):
        ours, theirs = list(map(message, sent.get(pair, ()))), list(map(message, received.get(pair, ())))
        index = first_difference(ours, theirs)
        if index is not None:
            yield Mismatch(pair, index, ours, theirs)
