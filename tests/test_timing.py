"""timing: a Timing's per-device figures read from simulate's lists agree with the op-by-op reading."""
from __future__ import annotations

import random

import pytest

from conftest import compile_library
from schedc.passes.simulate import simulate
from schedc.passes.timing import OpTimes, Timing, _device_runs, _device_spans


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
