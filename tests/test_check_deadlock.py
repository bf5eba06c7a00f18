"""check_deadlock: soundness against a deliberately simple replay over hundreds of random mutations of
library schedules, and the shape of its diagnostics."""
from __future__ import annotations

import dataclasses
import random

import pytest

from conftest import compile_library
from schedc.checks.deadlock import check_deadlock
from schedc.checks.structure import check_structure
from schedc.passes.simulate import simulate

LIBRARY = [("1f1b", dict(p=4, m=8)), ("gpipe", dict(p=3, m=4)), ("interleaved_1f1b", dict(p=2, v=2, m=4)),
           ("chimera", dict(p=4, m=8))]
MUTATIONS = 80  # per schedule


def simple_verdict(schedule, orders) -> bool:
    """Independent of the checker: every expected op placed once on its stage's device, and a
    round-robin replay (an op runs once F(s-1,i), or F(s,i) and B(s+1,i), of its pipeline are done)
    runs every op."""
    expected = {(kind, s, mb, k) for k, pipe in enumerate(schedule.pipelines) for s in range(pipe.stages)
                for mb in pipe.microbatches for kind in ("F", "B")}
    placed = [(op.kind, op.stage, op.mb, op.pipe) for order in orders for op in order]
    if len(placed) != len(set(placed)) or set(placed) != expected:
        return False
    if any(schedule.pipelines[op.pipe].placement[op.stage] != d for d, order in enumerate(orders) for op in order):
        return False
    done, position = set(), [0] * len(orders)
    progress = True
    while progress:
        progress = False
        for d, order in enumerate(orders):
            while position[d] < len(order):
                op = order[position[d]]
                last = schedule.pipelines[op.pipe].stages - 1
                if op.kind == "F":
                    ready = op.stage == 0 or ("F", op.stage - 1, op.mb, op.pipe) in done
                else:
                    ready = ("F", op.stage, op.mb, op.pipe) in done and (
                        op.stage == last or ("B", op.stage + 1, op.mb, op.pipe) in done)
                if not ready:
                    break
                done.add((op.kind, op.stage, op.mb, op.pipe))
                position[d] += 1
                progress = True
    return len(done) == len(expected)


def checker_verdict(schedule) -> bool:
    diagnostics = check_structure(schedule) + check_deadlock(schedule, simulate(schedule))
    return not diagnostics


def mutate(orders: list[list], rng: random.Random) -> list[list]:
    orders = [list(o) for o in orders]
    if rng.random() < 0.5:                       # swap two ops of one device
        order = orders[rng.randrange(len(orders))]
        a, b = rng.randrange(len(order)), rng.randrange(len(order))
        order[a], order[b] = order[b], order[a]
    else:                                        # move an op to another device
        source, target = rng.randrange(len(orders)), rng.randrange(len(orders))
        op = orders[source].pop(rng.randrange(len(orders[source])))
        orders[target].insert(rng.randrange(len(orders[target]) + 1), op)
    return orders


@pytest.mark.parametrize("name,params", LIBRARY, ids=[n for n, _ in LIBRARY])
def test_verdict_agrees_with_a_simple_replay_on_random_mutations(name, params):
    schedule = compile_library(name, **params).schedule
    rng = random.Random(f"{name}-{sorted(params.items())}")
    assert checker_verdict(schedule) and simple_verdict(schedule, schedule.orders)
    refused = 0
    for _ in range(MUTATIONS):
        orders = mutate(schedule.orders, rng)
        if rng.random() < 0.3:
            orders = mutate(orders, rng)
        mutated = dataclasses.replace(schedule, orders=tuple(map(tuple, orders)))
        expected = simple_verdict(schedule, orders)
        assert checker_verdict(mutated) == expected, [[str(op) for op in o] for o in orders]
        refused += not expected
    assert refused > MUTATIONS // 4  # the mutations do exercise refusals


def test_cycle_names_devices_ops_and_lines():
    schedule = compile_library("1f1b", p=2, m=2).schedule
    d0, d1 = list(schedule.orders[0]), list(schedule.orders[1])
    d1[0], d1[1] = d1[1], d1[0]   # device 1: B(1,0) before F(1,0)
    mutated = dataclasses.replace(schedule, orders=(tuple(d0), tuple(d1)))
    (diag,) = check_deadlock(mutated, simulate(mutated))
    assert diag.message.startswith("deadlock: device ")
    assert "which device 1 runs later" in diag.message and "1f1b.sched:" in diag.message
    assert "[B(1,0)]" in diag.detail and "step" in diag.detail
    assert diag.span is not None


def test_big_schedule_check_is_fast():
    import time
    schedule = compile_library("interleaved_1f1b", p=8, v=4, m=64).schedule
    timing = simulate(schedule)
    start = time.process_time()
    assert check_structure(schedule) == [] and check_deadlock(schedule, timing) == []
    assert time.process_time() - start < 1.0
