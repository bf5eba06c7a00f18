"""lower: sends follow producers, receives precede consumers in the sender's order, SYNC_GRAD for replicas."""
from __future__ import annotations

import pytest

from conftest import compile_library
from schedc.plan import COMM, Opcode


def _stream(plan, rank):
    return plan.ranks[rank][0]


@pytest.mark.parametrize("name,params", [
    ("gpipe", {"p": 4, "m": 8}), ("1f1b", {"p": 4, "m": 8}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}),
    ("chimera", {"p": 4, "m": 8}), ("interleaved_1f1b", {"p": 2, "v": 3, "m": 4}),
])
def test_sends_and_receives_pair_up_in_order(name, params):
    plan = compile_library(name, **params).plan
    for a in range(plan.devices):
        for b in range(plan.devices):
            sent = [(i.op[5:], i.stage, i.mb) for i in _stream(plan, a) if i.op.startswith("SEND") and i.peer == b]
            got = [(i.op[5:], i.stage, i.mb) for i in _stream(plan, b) if i.op.startswith("RECV") and i.peer == a]
            assert sent == got


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 4, "m": 8}), ("chimera", {"p": 4, "m": 8}),
                                         ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8})])
def test_every_remote_input_is_received_before_its_consumer(name, params):
    result = compile_library(name, **params)
    pipes = result.schedule.pipelines
    for rank in range(result.plan.devices):
        posted, consumed = set(), 0
        for instr in _stream(result.plan, rank):
            if instr.op in ("RECV_F", "RECV_B"):
                posted.add((instr.op, instr.stage, instr.mb))
            elif instr.op in ("F", "B"):
                place = pipes[instr.pipe].placement
                if instr.op == "F" and instr.stage > 0 and place[instr.stage - 1] != rank:
                    assert ("RECV_F", instr.stage - 1, instr.mb) in posted
                    consumed += 1
                if instr.op == "B" and instr.stage + 1 < len(place) and place[instr.stage + 1] != rank:
                    assert ("RECV_B", instr.stage + 1, instr.mb) in posted
                    consumed += 1
        assert consumed == len(posted)


def test_1f1b_rank_stream():
    """Receives are posted when their message is sent (simulated time), in the sender's order."""
    plan = compile_library("1f1b", p=2, m=2).plan
    assert [str(i) for i in _stream(plan, 0)] == [
        "F stage=0 mb=0 pipe=0", "SEND_F stage=0 mb=0 pipe=0 peer=1",
        "F stage=0 mb=1 pipe=0", "SEND_F stage=0 mb=1 pipe=0 peer=1",
        "RECV_B stage=1 mb=0 pipe=0 peer=1",
        "B stage=0 mb=0 pipe=0",
        "RECV_B stage=1 mb=1 pipe=0 peer=1",
        "B stage=0 mb=1 pipe=0", "STEP"]
    assert [str(i) for i in _stream(plan, 1)] == [
        "RECV_F stage=0 mb=0 pipe=0 peer=0",
        "F stage=1 mb=0 pipe=0",
        "RECV_F stage=0 mb=1 pipe=0 peer=0",
        "B stage=1 mb=0 pipe=0", "SEND_B stage=1 mb=0 pipe=0 peer=0",
        "F stage=1 mb=1 pipe=0",
        "B stage=1 mb=1 pipe=0", "SEND_B stage=1 mb=1 pipe=0 peer=0", "STEP"]


def test_local_handoff_needs_no_messages():
    plan = compile_library("interleaved_1f1b", p=1, v=2, m=2).plan
    assert not [i for i in _stream(plan, 0) if Opcode(i.op) in COMM]


def test_chimera_syncs_replicated_stages_in_the_same_order_everywhere():
    plan = compile_library("chimera", p=4, m=8).plan
    syncs = {r: [(i.stage, i.group) for i in _stream(plan, r) if i.op == "SYNC_GRAD"] for r in range(4)}
    assert syncs[0] == [(0, (0, 3)), (3, (0, 3))]
    assert syncs[1] == [(1, (1, 2)), (2, (1, 2))]
    assert all(_stream(plan, r)[-1].op == "STEP" for r in range(4))


def test_every_compute_op_appears_once():
    result = compile_library("interleaved_1f1b", p=4, v=2, m=8)
    compute = [(i.op, i.stage, i.mb) for r in range(4) for i in _stream(result.plan, r) if i.op in ("F", "B")]
    assert len(compute) == len(set(compute)) == result.schedule.op_count()
