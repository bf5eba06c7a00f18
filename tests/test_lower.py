"""lower: sends follow producers, receives precede consumers in the sender's order, SYNC_GRAD for replicas."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import schedc.passes.lower as lower_module
from conftest import FIXTURES, compile_library
from schedc.driver import build_schedule, read_source
from schedc.passes.lower import lower
from schedc.plan import COMM, NOT_COMPUTE, Opcode
from schedc.passes.simulate import simulate, step_sequences


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


@pytest.mark.parametrize("name,params", [("dualpipev", {"p": 4, "m": 10}), ("dualpipe", {"p": 4, "m": 8})])
def test_an_overlapped_pair_is_one_instruction_with_its_sends_after_it(name, params):
    """Each overlapped pair of the orders is one OVERLAP_F_B, its halves in the pair's order, in the place
    of its first half in the rank's compute order; the receives of both halves come before it, the sends
    of both after it, the first half's first."""
    result = compile_library(name, **params)
    pairs = {(str(a), str(b)) for a, b in result.schedule.fused}
    assert pairs
    for rank, order in enumerate(result.schedule.orders):
        stream = _stream(result.plan, rank)
        computes = [unit for i in stream for unit in i.units() if unit.op not in NOT_COMPUTE]
        assert [u.short() for u in computes] == [str(op) for op in order]
        for n, instr in enumerate(stream):
            if instr.op != "OVERLAP_F_B":
                continue
            pairs.discard(tuple(half.short() for half in instr.halves))
            received = {(i.op[5:], i.stage, i.mb) for i in stream[:n] if i.op.startswith("RECV")}
            sends = [(i.op[5:], i.stage, i.mb) for i in stream[n + 1:] if i.op.startswith("SEND")]
            wanted = []
            for half in instr.halves:
                place = result.schedule.pipelines[half.pipe].placement
                step = 1 if half.op == "F" else -1  # where its output goes; its input comes from -step
                if 0 <= half.stage - step < len(place) and place[half.stage - step] != rank:
                    assert (half.op if half.op == "F" else "B", half.stage - step, half.mb) in received
                if 0 <= half.stage + step < len(place) and place[half.stage + step] != rank:
                    wanted.append((half.op if half.op == "F" else "B", half.stage, half.mb))
            assert [s for s in sends if s in wanted] == wanted
    assert not pairs  # every pair became one instruction


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 4, "m": 8}), ("chimera", {"p": 4, "m": 8}),
                                         ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}),
                                         ("dualpipev", {"p": 4, "m": 10})])
def test_posting_receives_one_by_one_writes_the_same_streams(name, params, monkeypatch):
    """The general path (an op with negative time) agrees with the fast one wherever sends end in order."""
    fast = compile_library(name, **params).plan
    monkeypatch.setattr(lower_module, "le", lambda a, b: False)  # as if some op took negative time
    assert compile_library(name, **params).plan.ranks == fast.ranks


def test_deadlocked_order_ends_with_the_receives_never_sent():
    schedule = build_schedule(read_source(FIXTURES / "broken" / "deadlock.sched"))
    timing = simulate(schedule)
    assert not timing.complete
    plan = lower(schedule, {}, step_sequences(schedule, timing))
    assert [str(i) for i in _stream(plan, 0)] == [
        "F stage=0 mb=0 pipe=0", "SEND_F stage=0 mb=0 pipe=0 peer=1",
        "RECV_B stage=1 mb=0 pipe=0 peer=1", "RECV_B stage=1 mb=1 pipe=0 peer=1", "STEP"]
    assert [str(i) for i in _stream(plan, 1)] == [
        "RECV_F stage=0 mb=0 pipe=0 peer=0", "RECV_F stage=0 mb=1 pipe=0 peer=0", "STEP"]


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.booleans()), max_size=60))
def test_the_array_order_is_the_list_order(ops):
    """_order_arrays (lowering's form past ARRAY_ITEMS) against _order, with ties in time and instant ops."""
    starts = [float(start) for start, _, _ in ops]
    ends = [float(start + took) for start, took, _ in ops]
    sending = [sends for _, _, sends in ops]
    assert lower_module._order_arrays(starts, ends, sending).tolist() == lower_module._order(starts, ends, sending)


@pytest.mark.parametrize("name,params", [("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}), ("zbv", {"p": 4, "m": 8}),
                                         ("1f1b", {"p": 3, "m": 7}), ("chimera", {"p": 4, "m": 8}),
                                         ("dualpipe", {"p": 4, "m": 8}), ("pipefisher", {"p": 4, "m": 8}),
                                         ("looped_bfs", {"p": 4, "v": 2, "m": 8})])
def test_lowering_through_the_arrays_writes_the_same_plan(name, params, monkeypatch):
    plain = compile_library(name, **params).plan
    monkeypatch.setattr(lower_module, "ARRAY_ITEMS", 0)
    monkeypatch.setattr(lower_module, "PIECE", 7)
    assert compile_library(name, **params).plan.ranks == plain.ranks
