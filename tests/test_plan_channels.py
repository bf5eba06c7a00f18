"""plan/channels: the one message matching, by hand, and its two users agreeing: the compiler's
check_channels (checks/channels/pairs.py) and the runtime's check before a run (runtime/model/train.py)
find the same mismatched pairs at the same message, on library plans with messages swapped, dropped
or renamed, and both agree with a plain matching written here."""
from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from conftest import compile_library
from schedc.checks.channels.pairs import pair_errors
from schedc.plan import Instr, PlanError
from schedc.plan.channels import Mismatch, by_pair, first_difference, message, mismatches


def test_matching_by_hand():
    rank0 = [Instr("F", 0, 0), Instr("SEND_F", 0, 0, peer=1), Instr("F", 0, 1), Instr("SEND_F", 0, 1, peer=1)]
    rank1 = [Instr("RECV_F", 0, 1, peer=0), Instr("RECV_F", 0, 0, peer=0), Instr("F", 1, 0)]
    assert list(mismatches([rank0, rank1])) == [
        Mismatch((0, 1), 0, [("F", 0, 0, 0), ("F", 0, 1, 0)], [("F", 0, 1, 0), ("F", 0, 0, 0)])]
    sent, received = by_pair([rank0, rank1])
    assert sent == {(0, 1): [rank0[1], rank0[3]]} and received == {(0, 1): rank1[:2]}
    rank1[:2] = rank1[1::-1]
    assert list(mismatches([rank0, rank1])) == []
    assert message(Instr("RECV_B", 2, 3, None, 1)) == message(Instr("SEND_B", 2, 3, 0, 0)) == ("B", 2, 3, 0)
    assert first_difference([1, 2], [1, 2, 3]) == 2 and first_difference([1], [2]) == 0
    assert first_difference([], []) is None


def _plain(streams) -> dict[tuple, int]:
    """(a, b) -> the first message that differs, matched plainly: each rank pair's sends and receives
    listed by scanning every stream for that pair."""
    ranks, found = len(streams), {}
    for a in range(ranks):
        for b in range(ranks):
            def named(stream, prefix, peer):
                return [(i.op.split("_")[1], i.stage, i.mb, i.pipe or 0) for i in stream
                        if i.op.startswith(prefix) and i.peer == peer]
            sent, got = named(streams[a], "SEND_", b), named(streams[b], "RECV_", a)
            if sent != got:
                found[(a, b)] = next((k for k in range(min(len(sent), len(got))) if sent[k] != got[k]),
                                     min(len(sent), len(got)))
    return found


def _mutate(rng, streams) -> None:
    r = rng.randrange(len(streams))
    comm = [n for n, i in enumerate(streams[r]) if i.op.startswith(("SEND_", "RECV_"))]
    n, m = rng.choice(comm), rng.choice(comm)
    how = rng.choice(["swap", "drop", "stage", "mb", "pipe"])
    if how == "swap":
        streams[r][n], streams[r][m] = streams[r][m], streams[r][n]
    elif how == "drop":
        del streams[r][n]
    else:
        ins = streams[r][n]
        streams[r][n] = ins._replace(**{how: (getattr(ins, how) or 0) + rng.choice([1, -1])})


PLANS = [("1f1b", 2, 4), ("1f1b", 4, 8), ("chimera", 4, 4), ("interleaved_1f1b", 2, 4), ("zb_h1", 3, 6)]


@pytest.mark.parametrize("name,p,m", PLANS, ids=[f"{n}-p{p}-m{m}" for n, p, m in PLANS])
def test_check_and_runtime_agree(name, p, m):
    from schedc.runtime.model.train import check_messages
    plan = compile_library(name, p=p, m=m).plan
    place = [list(q["placement"]) for q in plan.meta["pipelines"]]
    rng, refused = random.Random(f"{name}{p}{m}"), 0
    for _ in range(40):
        streams = [list(steps[0]) for steps in plan.ranks]
        for _ in range(rng.choice([0, 1, 1, 2])):
            _mutate(rng, streams)
        expected = _plain(streams)
        assert {m.pair: m.index for m in mismatches(streams)} == expected
        checked = {tuple(map(int, found.groups()[:2])): int(found.group(3)) for d in pair_errors(streams, place, 0, 1)
                   if (found := re.search(r"from rank (\d+) to rank (\d+) do not match.*at message (\d+)", d.message))}
        assert checked == expected
        mutated = replace(plan, ranks=tuple((tuple(stream),) for stream in streams))
        if not expected:
            check_messages(mutated)
            continue
        (a, b), k = min(expected.items(), key=lambda item: str(item[0]))
        with pytest.raises(PlanError, match=f"message #{k} from rank {a} to rank {b} "):
            check_messages(mutated)
        refused += 1
    assert 10 < refused < 40  # both kinds of program were tried
