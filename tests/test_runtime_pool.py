# Tests of offload's host buffers (runtime/execution/pool.py): the plan's offload peak per rank, counted
# by hand from the compiled programs, and the pool's arithmetic: buffers reused by size once their L's
# copies are through, its bytes bounded by the peak times the largest state, a state past the peak refused.
from __future__ import annotations

import pytest
import torch

from schedc.plan import Instr, Opcode, load_plan
from schedc.runtime.execution.pool import OffloadError, PinnedPool, offload_peak
from test_runtime import plans  # noqa: F401 (fixture)


def test_the_offload_peak_of_1f1b_is_its_forwards_in_flight_less_one(plans):  # noqa: F811
    """offload_1f1b at p = 4, m = 8, read off the rank programs by hand: rank 0 runs O0 O1 O2 L0 O3 L1 ...
    (three states on the host), rank 1 O0 O1 L0 ... (two), rank 2 O0 L0 ... (one), the last stage none:
    p - 1 - r, 1F1B's forwards in flight on rank r less the one whose backward comes at once."""
    ranks = load_plan(plans("offload_1f1b", p=4, m=8)).ranks
    assert [offload_peak(list(programs)) for programs in ranks] == [3, 2, 1, 0]


class Event:
    def __init__(self):
        self.through = False

    def query(self) -> bool:
        return self.through


def test_buffers_are_reused_by_size_once_their_copies_are_through():
    made = []

    def allocate(nbytes: int) -> torch.Tensor:
        made.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    pool = PinnedPool(2, allocate)
    a, b = pool.take((0, 0), 100), pool.take((0, 1), 80)
    assert (a.numel(), b.numel(), made, pool.bytes) == (100, 80, [100, 80], 180)
    pool.release((0, 0))  # CPU: no event, free at once
    c = pool.take((0, 2), 90)  # the 100-byte buffer, a 90-byte view of it
    assert c.numel() == 90 and c.data_ptr() == a.data_ptr() and made == [100, 80]
    copies = Event()
    pool.release((0, 1), copies)  # L's copies still running: not reused yet
    d = pool.take((0, 3), 70)
    assert made == [100, 80, 70] and d.data_ptr() != b.data_ptr()
    pool.release((0, 2))
    pool.release((0, 3))
    copies.through = True
    e = pool.take((0, 4), 75)  # the smallest that fits: 80 (through now), not 100
    assert e.data_ptr() == b.data_ptr() and pool.bytes == 250 <= 2 * 100 + 70  # the peak's bytes and one more


def test_a_state_past_the_peak_is_refused_naming_it():
    pool = PinnedPool(1, lambda n: torch.empty(n, dtype=torch.uint8))
    pool.take((0, 0), 8)
    pool.take((0, 0), 8)  # the same state's second storage
    with pytest.raises(OffloadError, match="offloading stage 2 microbatch 1 would hold 2 forwards' states in host "
                                        "memory at once; the plan's offload peak on this rank is 1"):
        pool.take((2, 1), 8)


def test_a_program_without_offload_has_no_peak():
    assert offload_peak([(Instr(Opcode.F, 0, 0), Instr(Opcode.B, 0, 0), Instr(Opcode.STEP))]) == 0
