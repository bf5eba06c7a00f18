"""check_channels: library plans pass the rendezvous replay; hand-made plans with mismatched or
hanging channels are refused."""
from __future__ import annotations

import random

import pytest

from conftest import compile_exchanging, compile_library
from schedc.checks.channels import _units as units, check_channels
from schedc.checks.channels.certificate import _zeros, certify
from schedc.checks.channels.pairs import sync_errors
from schedc.checks.channels.replay import replay
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


OVERLAPPED = [(name, p, m) for name in ("dualpipe", "dualpipev") for p in (2, 4, 8) for m in (2 * p, 2 * p + 2)] + \
    [("dualpipev", p, 2 * p + 1) for p in (3, 5)]


@pytest.mark.parametrize("name,p,m", OVERLAPPED, ids=[f"{n}-p{p}-m{m}" for n, p, m in OVERLAPPED])
def test_plans_with_overlapped_instructions_pass_check(name, p, m):
    result = compile_library(name, p=p, m=m)
    assert any(i.op == "OVERLAP_F_B" for steps in result.plan.ranks for i in steps[0])
    assert result.ok, "\n".join(d.message for d in result.diagnostics)


def test_an_overlapped_instruction_waits_for_the_inputs_of_both_halves():
    """Rank 0's RECV_B for the backward half of an OVERLAP_F_B moved after it: the rank blocks at that
    half (its forward half's input is there), its peer at the SEND_B whose receive is not posted."""
    good_plan = compile_library("dualpipev", p=2, m=4).plan
    stream = list(good_plan.ranks[0][0])
    n = next(n for n, i in enumerate(stream) if i.op == "OVERLAP_F_B" and i.halves[1].short() == "B(0,0)")
    assert stream[n - 1].short() == "RECV_B(1,0)<1"
    stream[n - 1], stream[n] = stream[n], stream[n - 1]
    (diag,) = check_channels(Plan(good_plan.meta, ((tuple(stream),), good_plan.ranks[1])))
    assert "rank 0 blocks at B(0,0)" in diag.message and "has not received" in diag.message, diag.message
    assert "rank 1 blocks at SEND_B(1,0)>0" in diag.message, diag.message


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


def test_sync_grad_for_different_stages_is_refused():
    rank0, rank1 = good()
    rank0.insert(-1, Instr("SYNC_GRAD", 0, None, group=(0, 1)))
    rank1.insert(-1, Instr("SYNC_GRAD", 1, None, group=(0, 1)))
    hand = plan(rank0, rank1)
    streams = [r[0] for r in hand.ranks]
    assert not replay(streams, [[0, 1]]).clean and not certify(streams, [[0, 1]], 2)
    (diag,) = check_channels(hand)
    assert "SYNC_GRAD #0 of group [0, 1] is issued by ranks [0, 1] for stages [0, 1]" in diag.message


# The static certificate agrees with the replay ------------------------------------------------------

FIXTURE_PLANS = ("explicit.sched", "greedy.sched", "split_backward.sched")
LIBRARY_PLANS = ([("1f1b", dict(p=p, m=m)) for p, m in ((2, 2), (4, 8), (8, 16))]
                 + [("gpipe", dict(p=p, m=m)) for p, m in ((2, 4), (4, 8))]
                 + [("chimera", dict(p=p, m=m)) for p, m in ((2, 4), (4, 8), (8, 16))]
                 + [("interleaved_1f1b", dict(p=p, v=v, m=m)) for p, v, m in ((2, 2, 4), (4, 3, 8), (4, 2, 12))]
                 + [("pipefisher", {}), ("pipefisher_1f1b", {})])


def programs(compiled) -> list[tuple[list, list, int]]:
    """(streams, placement, microbatch bound) of every step program, as check_channels builds them."""
    plan_ = compiled.plan
    pipes = plan_.meta.get("pipelines", ())
    place = [list(p["placement"]) for p in pipes]
    bound = 1 + max(mb for p in pipes for mb in p["microbatches"])
    return [([list(plan_.ranks[r][step]) if step < len(plan_.ranks[r]) else [] for r in range(plan_.devices)],
             place, bound) for step in range(plan_.cycle_steps)]


@pytest.fixture(scope="module")
def library_programs():
    from conftest import FIXTURES
    from schedc.driver import compile_source, read_source
    from schedc.frontend.elaborate import Options
    compiled = [compile_library(name, **params) for name, params in LIBRARY_PLANS]
    compiled += [compile_source(read_source(FIXTURES / name), Options({})) for name in FIXTURE_PLANS]
    assert all(c.ok and c.plan is not None for c in compiled)
    return [program for c in compiled for program in programs(c)]


def test_certificate_clears_every_library_plan(library_programs):
    for streams, place, bound in library_programs:
        assert replay(streams, place).clean
        assert certify(streams, place, bound)


def test_the_certificates_positions_are_32_bit_items_while_they_fit():
    assert (_zeros(3, 2 ** 31 - 1).typecode, list(_zeros(3, 7))) == ("i", [0, 0, 0])
    big = _zeros(2, 2 ** 31)
    big[1] = 2 ** 31
    assert big.typecode == "q" and list(big) == [0, 2 ** 31]


def verdicts(streams, place, bound) -> tuple[bool, bool]:
    """(certified, clean): clean means the replay completes without faults and SYNC_GRAD groups agree."""
    try:
        clean = replay(streams, place).clean and not sync_errors(streams, 0, 1)
    except Exception:   # noqa: BLE001 - a mutant the replay cannot even read is not clean
        clean = False
    return certify(streams, place, bound), clean


ODD = [None, -1, 0.0, 1.0, True, "1", (0,), 10 ** 6]
OTHER_OP = {"SEND_F": "SEND_B", "SEND_B": "SEND_F", "RECV_F": "RECV_B", "RECV_B": "RECV_F", "F": "B", "B": "I",
            "I": "F", "W": "F", "SYNC_GRAD": "STEP"}


def swap(rng, streams, r, n, bound):
    """With the next instruction, or any of the rank's, or another message of the same channel."""
    stream = streams[r]
    same = [k for k, other in enumerate(stream) if other.op == stream[n].op and other.peer == stream[n].peer]
    k = rng.choice([min(len(stream) - 1, n + 1), rng.randrange(len(stream)), rng.choice(same)])
    stream[n], stream[k] = stream[k], stream[n]


def drop_copy_or_move(rng, streams, r, n, bound):
    """Deletes the instruction, copies it (to any rank) or moves it within its rank."""
    stream = streams[r]
    ins, how = stream[n], rng.randrange(3)
    if how != 1:
        del stream[n]
    if how:
        where = stream if how == 2 else streams[rng.randrange(len(streams))]
        where.insert(rng.randrange(len(where) + 1), ins)


def change_field(rng, streams, r, n, bound):
    ins = streams[r][n]
    name = rng.choice(["stage", "mb", "pipe", "peer"])
    value = getattr(ins, name)
    choices = ODD + [bound, bound - 1, rng.randrange(len(streams))]
    if isinstance(value, int) and not isinstance(value, bool):
        choices += [value + 1, value - 1, -value - 1, value - bound]
    streams[r][n] = ins._replace(**{name: rng.choice(choices)})


def change_op(rng, streams, r, n, bound):
    ins = streams[r][n]
    streams[r][n] = ins._replace(op=OTHER_OP.get(ins.op, rng.choice(["W", "X", "STEP", "F"])))


def add_sync(rng, streams, r, n, bound):
    """A SYNC_GRAD on every rank of a group (its order or stage perhaps wrong), or on one rank only."""
    group = tuple(rng.sample(range(len(streams)), rng.randint(1, len(streams))))
    stage = rng.choice([streams[r][n].stage, 0, 1, None])
    if rng.random() < 0.5:
        for member in group:
            streams[member].insert(len(streams[member]) - 1, Instr("SYNC_GRAD", stage, None, group=group))
    else:
        streams[r].insert(n, Instr("SYNC_GRAD", stage, None, group=rng.choice([group, None, (), [r]])))


def change_sync(rng, streams, r, n, bound):
    syncs = [k for k, other in enumerate(streams[r]) if other.op == "SYNC_GRAD"]
    if syncs:
        k = rng.choice(syncs)
        ins = streams[r][k]
        group = tuple(ins.group or ())
        streams[r][k] = ins._replace(stage=rng.choice([0, 1, 2, None, ins.stage]),
                                     group=rng.choice([group[::-1], group[1:], group + (r,), None, group]))


MUTATIONS = [swap, swap, drop_copy_or_move, drop_copy_or_move, change_field, change_op, add_sync, change_sync]


@pytest.mark.slow
def test_certificate_never_clears_what_the_replay_refuses(library_programs):
    """Mutants of the library plans: whenever the certificate clears one, the replay does too (and it
    clears most of the clean ones)."""
    _certificate_against_replay(library_programs, random.Random(20240601), MUTATIONS, [1, 1, 2, 3])


def _certificate_against_replay(library_programs, rng, mutations, counts) -> None:
    """3,000 mutants of the library plans (each a choice of `counts` mutations): a mutant the
    certificate clears is clean by the replay, and the certificate clears at least half of the clean."""
    clean_refused = clean_total = 0
    for round_ in range(3000):
        streams, place, bound = library_programs[round_ % len(library_programs)]
        mutant = [list(stream) for stream in streams]
        for _ in range(rng.choice(counts)):
            r = rng.randrange(len(mutant))
            if mutant[r]:
                rng.choice(mutations)(rng, mutant, r, rng.randrange(len(mutant[r])), bound)
        certified, clean = verdicts(mutant, place, bound)
        assert clean or not certified, (round_, mutant)
        clean_total += clean
        clean_refused += clean and not certified
    assert clean_total > 100 and clean_refused <= clean_total // 2, (clean_refused, clean_total)


@pytest.mark.slow
def test_memory_stays_linear_in_the_device_count():
    """GPipe on 2,000 devices with one microbatch (4,000 ops): lowering and check_channels kept tables
    of ranks x ranks (p=2,000: 260 MB in lower; p=5,000: 2.4 GB in all); now the whole compile
    allocates a few MB per thousand devices."""
    import tracemalloc
    from schedc.driver import compile_file
    tracemalloc.start()
    try:
        result = compile_file("gpipe", ["p=2000", "m=1"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.ok and result.plan.devices == 2000
    assert peak < 64 * 2 ** 20, peak


# Collectives: replayed with the messages under NCCL's rules ------------------------------------------

A2A, GATHER = "ALL_TO_ALL", "ALL_GATHER"


def collective(op, stage, group, mb=0):
    return Instr(op, stage, mb, 0, group=group)


def test_the_fixtures_all_to_all_hang_is_reported_at_both_ranks():
    """tests/fixtures/collectives/a2a_hang.json, made by hand: an expert group {0, 1} across stages 0
    and 1. Rank 0's F(0,0) enters its all-to-all before its SEND_F; rank 1 waits in F(1,0) for that send,
    so it never reaches the all-to-all rank 0 waits in (torchtitan#2209)."""
    from conftest import FIXTURES
    from schedc.plan import load_plan
    hang = load_plan(FIXTURES / "collectives" / "a2a_hang.json")
    streams = [r[0] for r in hang.ranks]
    assert not certify(streams, [[0, 1]], 1)
    (diag,) = check_channels(hang)
    assert "hangs under blocking sends and collectives" in diag.message
    assert ("rank 0 blocks at ALL_TO_ALL(0,0) (instruction 1) until every rank of group [0, 1] reaches it "
            "(rank 1 has not)") in diag.message
    assert "rank 1 blocks at F(1,0) (instruction 1) until rank 0 sends it" in diag.message
    assert diag.at == (0, 0, 1)
    rows = diag.detail.splitlines()
    assert "[ALL_TO_ALL(0,0)]" in rows[1] and "[F(1,0)]" in rows[2]


def test_the_same_plan_completes_when_each_rank_exchanges_with_its_own_lane():
    from conftest import FIXTURES
    from schedc.plan import load_plan
    hang = load_plan(FIXTURES / "collectives" / "a2a_hang.json")
    lanes = [[i._replace(group=(r,)) if i.op == A2A else i for i in hang.ranks[r][0]] for r in range(2)]
    assert check_channels(plan(*lanes)) == []
    assert certify(lanes, [[0, 1]], 1) and replay(lanes, [[0, 1]]).clean


def test_a_group_across_stages_completes_when_the_send_comes_first():
    """Rank 0 sends before it enters the all-to-all: rank 1 gets its input, runs F(1,0) and meets it."""
    rank0, rank1 = good()
    rank0.insert(2, collective(A2A, 0, (0, 1)))        # after SEND_F(0,0)>1
    rank1.insert(2, collective(A2A, 1, (0, 1)))        # after F(1,0)
    assert check_channels(plan(rank0, rank1)) == []
    assert certify([rank0, rank1], [[0, 1]], 2)


def test_members_must_reach_a_groups_collectives_in_one_order():
    rank0, rank1 = good()
    rank0[-1:-1] = [collective(A2A, 0, (0, 1)), collective(GATHER, 0, (0, 1))]
    rank1[-1:-1] = [collective(GATHER, 1, (0, 1)), collective(A2A, 1, (0, 1))]
    streams = [rank0, rank1]
    assert not certify(streams, [[0, 1]], 2)
    messages = [d.message for d in check_channels(plan(rank0, rank1))]
    assert any("collective #0 of group [0, 1]: rank 0 ALL_TO_ALL, rank 1 ALL_GATHER" in m for m in messages), messages
    faults = [fault for fault, _ in replay(streams, [[0, 1]]).faults]
    assert any("rank 0: ALL_TO_ALL(0,0) is collective #0 of group [0, 1], where rank 1 issued ALL_GATHER" in f
               for f in faults), faults


def test_a_collective_missing_on_one_member_hangs_there():
    rank0, rank1 = good()
    rank0.insert(-1, collective(A2A, 0, (0, 1)))
    messages = [d.message for d in check_channels(plan(rank0, rank1))]
    assert any("collective #0 of group [0, 1]: rank 0 ALL_TO_ALL" in m for m in messages), messages


def test_declared_collectives_and_sync_grad_are_matched_in_their_own_orders():
    """SYNC_GRAD's all-reduce and the declared collectives of one group are on different communicators,
    so their orders are not compared; but a rank waiting in one cannot enter the other: rank 0 in its
    SYNC_GRAD and rank 1 in its ALL_TO_ALL wait for each other, a hang at both."""
    rank0, rank1 = good()
    rank0[-1:-1] = [Instr("SYNC_GRAD", 0, None, group=(0, 1)), collective(A2A, 0, (0, 1))]
    rank1[-1:-1] = [collective(A2A, 1, (0, 1)), Instr("SYNC_GRAD", 0, None, group=(0, 1))]
    (diag,) = check_channels(plan(rank0, rank1))
    assert "rank 0 blocks at SYNC_GRAD(0) (instruction 4)" in diag.message
    assert "rank 1 blocks at ALL_TO_ALL(1,0) (instruction 4)" in diag.message
    assert not sync_errors([rank0, rank1], 0, 1)
    rank1[-3:-1] = rank1[-2], rank1[-3]               # the same order on both: it completes
    assert check_channels(plan(rank0, rank1)) == []


EXPERT_PAIRS = [("1f1b", dict(p=4, m=8)), ("gpipe", dict(p=4, m=8)), ("zb_h1", dict(p=4, m=8)),
                ("zb_h2", dict(p=4, m=8)), ("interleaved_1f1b", dict(p=4, v=2, m=8)), ("dualpipe", dict(p=4, m=8)),
                ("dualpipev", dict(p=4, m=8)), ("chimera", dict(p=4, m=8)), ("zbv", dict(p=4, m=8)),
                ("v_half", dict(p=4, m=8)), ("v_min", dict(p=4, m=8)), ("seq1f1b", dict(p=4, m=4)),
                ("interleaved_zb", dict(p=4, m=8)), ("looped_bfs", dict(p=4, m=8)), ("zb_2p", dict(p=4, m=8)),
                ("interleaved_1f1b_recompute", dict(p=4, v=2, m=8)), ("offload_1f1b", dict(p=4, m=8)),
                ("pipefisher", {}), ("pipefisher_1f1b", {})]


@pytest.mark.parametrize("replicas", [False, True], ids=["lane", "replicas"])
@pytest.mark.parametrize("name,params", EXPERT_PAIRS, ids=[name for name, _ in EXPERT_PAIRS])
def test_every_library_schedule_passes_with_expert_all_to_alls(name, params, replicas):
    """Each op of a kind that exchanges is followed by its two all-to-alls, over its own rank (the lane
    --ep's groups are carved from), or over the ranks holding its stage in its replica group (two ranks
    in Chimera and DualPipe, whose copies of a stage sit on different ranks: collectives across pipeline
    ranks that wait for each other); the plan passes the check, and the certificate clears it without
    the replay."""
    compiled = compile_exchanging(name, replicas, **params)
    assert compiled.ok, [d.message for d in compiled.diagnostics]
    streams = [ins for r in compiled.plan.ranks for step in r for ins in step]
    exchanging = sum(1 for ins in streams for unit in ins.units() if unit.op in ("F", "B", "I", "R"))
    assert sum(ins.op == A2A for ins in streams) == 2 * exchanging > 0
    pair = 2 if replicas and compiled.schedule.replicas else 1
    assert {len(ins.group) for ins in streams if ins.op == A2A} == {pair}
    for streams_, place, bound in programs(compiled):
        streams_ = [units(stream) for stream in streams_]   # OVERLAP_F_B as its halves, as the check runs it
        assert certify(streams_, place, bound) and replay(streams_, place).clean


def add_collective(rng, streams, r, n, bound):
    """A declared collective after an instruction of every member of a group (wherever each member's
    falls, so perhaps in a cycle with the messages), or on one rank only, or of another kind on one."""
    group = tuple(sorted(rng.sample(range(len(streams)), rng.randint(1, len(streams)))))
    op = rng.choice([A2A, A2A, GATHER])
    for member in group if rng.random() < 0.7 else (r,):
        where = streams[member]
        k = rng.randrange(len(where)) if where else 0
        stage = where[k].stage if where and rng.random() < 0.9 else rng.choice(ODD)
        where.insert(k, Instr(op if member != r or rng.random() < 0.9 else GATHER, stage, 0, 0, group=group))


@pytest.mark.slow
def test_certificate_never_clears_what_the_replay_refuses_with_collectives(library_programs):
    """As above, with declared collectives added among the mutations: a cleared mutant is clean."""
    _certificate_against_replay(library_programs, random.Random(20261207), MUTATIONS + [add_collective] * 4,
                                [1, 2, 3])
