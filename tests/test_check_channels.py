"""check_channels: library plans pass the rendezvous replay; hand-made plans with mismatched or
hanging channels are refused."""
from __future__ import annotations

import pytest

from conftest import compile_library
from schedc.check_channels import check_channels
from schedc.plan import Instr, Plan

SIZES = [(p, m) for p in (2, 4, 8) for m in (p, 2 * p)]
LIBRARY = [(name, p, m) for name in ("1f1b", "gpipe", "chimera", "interleaved_1f1b") for p, m in SIZES]


@pytest.mark.parametrize("name,p,m", LIBRARY, ids=[f"{n}-p{p}-m{m}" for n, p, m in LIBRARY])
def test_library_schedules_pass_check(name, p, m):
    result = compile_library(name, p=p, m=m)
    assert result.ok, "\n".join(d.message for d in result.diagnostics)


@pytest.mark.parametrize("v", (2, 3, 4))
@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (8, 16)])
def test_interleaved_plans_complete_under_rendezvous(p, v, m):
    result = compile_library("interleaved_1f1b", p=p, v=v, m=m)
    assert result.ok, "\n".join(d.message for d in result.diagnostics)


def plan(*ranks, stages=2, placement=(0, 1)):
    meta = {"schedule": "hand", "pipelines": [{"name": "main", "stages": stages, "placement": list(placement),
                                               "microbatches": [0, 1]}]}
    return Plan(meta, tuple((tuple(r),) for r in ranks))


F, B, STEP = "F", "B", Instr("STEP")


def good():
    rank0 = [Instr(F, 0, 0, 0), Instr("SEND_F", 0, 0, 0, 1), Instr("RECV_B", 1, 0, 0, 1), Instr(B, 0, 0, 0), STEP]
    rank1 = [Instr("RECV_F", 0, 0, 0, 0), Instr(F, 1, 0, 0), Instr(B, 1, 0, 0), Instr("SEND_B", 1, 0, 0, 0), STEP]
    return rank0, rank1


def test_hand_plan_passes():
    assert check_channels(plan(*good())) == []


def test_mismatched_messages_are_named():
    rank0, rank1 = good()
    rank1[0] = Instr("RECV_F", 0, 1, 0, 0)          # expects microbatch 1, rank 0 sends microbatch 0
    messages = [d.message for d in check_channels(plan(rank0, rank1))]
    assert any("messages from rank 0 to rank 1 do not match" in m and "microbatch 0" in m and "microbatch 1" in m
               for m in messages), messages


def test_missing_receive_and_wrong_peer():
    rank0, rank1 = good()
    del rank1[0]
    assert any("1 sent, 0 received" in d.message for d in check_channels(plan(rank0, rank1)))
    rank0, rank1 = good()
    rank0[1] = Instr("SEND_F", 0, 0, 0, 0)
    assert check_channels(plan(rank0, rank1))


def test_receive_after_its_consumer_hangs():
    rank0, rank1 = good()
    rank1[0], rank1[1] = rank1[1], rank1[0]        # F(1,0) before RECV_F(0,0)
    (diag,) = check_channels(plan(rank0, rank1))
    assert "hangs under blocking sends" in diag.message
    assert "rank 0 blocks at SEND_F(0,0)>1" in diag.message and "rank 1 blocks at F(1,0)" in diag.message
    assert "[SEND_F(0,0)>1]" in diag.detail


def test_head_to_head_sends_hang():
    # both ranks send before posting the receive the other one needs
    rank0 = [Instr(F, 0, 0, 0), Instr("SEND_F", 0, 0, 0, 1), Instr("RECV_F", 2, 0, 0, 1), Instr(F, 3, 0, 0), STEP]
    rank1 = [Instr(F, 2, 1, 0), Instr("SEND_F", 2, 1, 0, 0), Instr("RECV_F", 0, 0, 0, 0), Instr(F, 1, 0, 0), STEP]
    rank0[2] = Instr("RECV_F", 2, 1, 0, 1)
    rank0[3] = Instr(F, 3, 1, 0)
    hand = plan(rank0, rank1, stages=4, placement=(0, 1, 1, 0))
    messages = [d.message for d in check_channels(hand)]
    assert messages and "hangs" in messages[-1], messages


def test_sync_grad_groups_must_agree():
    rank0, rank1 = good()
    rank0.insert(-1, Instr("SYNC_GRAD", 0, None, group=(0, 1)))
    assert any("SYNC_GRAD #0 of group [0, 1]" in d.message for d in check_channels(plan(rank0, rank1)))
    rank1.insert(-1, Instr("SYNC_GRAD", 0, None, group=(0, 1)))
    assert check_channels(plan(rank0, rank1)) == []
