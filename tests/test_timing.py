"""timing: a Timing's per-device figures read from simulate's lists agree with the op-by-op reading."""
from __future__ import annotations

import random

import pytest

from conftest import compile_library
from schedc.passes.simulate import simulate
from schedc.passes.timing import OpTimes, StartOrder, Timing, _device_runs, _device_spans


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 4, "m": 8}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}),
                                         ("chimera", {"p": 4, "m": 8}), ("offload_1f1b", {"p": 4, "m": 8}),
                                         ("dualpipe", {"p": 4, "m": 8}), ("zb_h1", {"p": 4, "m": 8})])
def test_idle_inside_from_the_lists_is_the_op_by_op_reading(name, params):
    timing = simulate(compile_library(name, **params).schedule, 0.25)
    assert _device_runs(timing.start, timing.end) == _device_spans(timing)
    plain = Timing(dict(timing.start), dict(timing.end), timing.makespan, timing.busy, (), 0.25, True)
    assert _device_runs(plain.start, plain.end) is None  # not simulate's lists: op by op
    assert timing.idle_inside == plain.idle_inside


def test_a_device_in_several_runs_takes_its_first_start_and_last_end():
    """Ops not grouped by device (a device's ops in several runs, in no order of time)."""
    timing = simulate(compile_library("1f1b", p=3, m=4).schedule, 0.5)
    ops = list(timing.start)
    random.Random(7).shuffle(ops)
    shuffled = Timing(OpTimes(ops, [timing.start[op] for op in ops]), OpTimes(ops, [timing.end[op] for op in ops]),
                      timing.makespan, timing.busy, (), 0.5, True)
    first, last = _device_runs(shuffled.start, shuffled.end)
    assert (first, last) == _device_spans(timing) == _device_spans(shuffled)
    assert first == {0: 0.0, 1: 1.5, 2: 3.0}  # F takes 1, each message 0.5: device d starts at 1.5 d


@pytest.mark.parametrize("seed", range(5))
def test_the_start_order_is_the_sorted_tuple(seed):
    """StartOrder against sorted() written out: by start, a tie in the lists' order; equal both ways."""
    rng = random.Random(seed)
    count = rng.randrange(0, 30)
    starts = [float(rng.randrange(0, 6)) for _ in range(count)]  # many ties
    ends = [s + rng.choice((0.5, 1.0, 2.0)) for s in starts]
    ops = [f"op{n}" for n in range(count)]
    plain = []
    for s in sorted(set(starts)):
        plain += [(s, e, op) for s2, e, op in zip(starts, ends, ops) if s2 == s]
    order = StartOrder(starts, ends, ops)
    assert len(order) == count and bool(order) == bool(count)  # before any sort
    assert order == tuple(plain) and tuple(plain) == order and list(order) == plain
    assert order[1:3] == tuple(plain[1:3]) and len(order) == count
    assert order != tuple(plain[:-1]) or not plain
