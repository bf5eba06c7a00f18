# Tests of the instruction clocks (runtime/execution/clocks.py): host timestamps with a receive's wait moved to the
# compute's start, and device events anchored once per step and read at its end (here with stand-in
# events whose elapsed times are set by hand: the arithmetic a CUDA run uses).
from __future__ import annotations

from schedc.runtime.execution.clocks import DeviceClock, HostClock


def test_the_host_clock_starts_a_waiting_instruction_where_its_wait_ended():
    marks = [(0, 100, 180, 0, 0), (1, 200, 500, 250, 420)]  # the second waited 250 ns, until 420
    assert HostClock().events(3, marks) == [(3, 0, 100, 180, 0), (3, 1, 200, 500, 250)]
    late = [(0, 100, 600, 100, 550)]  # blocked from 450: drawn from there, not from 100
    assert HostClock().events(0, late) == [(0, 0, 450, 600, 100)]


class Stand:
    """A stand-in for torch.cuda.Event: its time from the step's anchor set by hand (ms)."""

    made: list = []

    def __init__(self):
        self.ms, self.recorded, self.waited = None, False, False
        Stand.made.append(self)

    def record(self):
        self.recorded = True

    def synchronize(self):
        self.waited = True

    def elapsed_time(self, other: "Stand") -> float:
        return other.ms - self.ms


def test_the_device_clock_reads_its_events_once_at_the_step_end():
    syncs = []
    Stand.made = []
    clock = DeviceClock(Stand, lambda: syncs.append(1))
    clock.begin_step()
    anchor = Stand.made[0]
    anchor.ms = 0.0
    marks = []
    for index, (begin, end) in enumerate([(0.5, 1.25), (1.25, 4.0)]):
        start, stop = clock.mark(), clock.mark()
        start.ms, stop.ms = begin, end
        marks.append((index, start, stop, 999, 0))
    assert syncs == [1] and not any(e.waited for e in Stand.made)  # nothing waited for while issuing
    got = clock.events(7, marks)
    base = clock.anchor_ns
    assert got == [(7, 0, base + 500_000, base + 1_250_000, 0), (7, 1, base + 1_250_000, base + 4_000_000, 0)]
    assert marks[-1][2].waited and all(e.recorded for e in Stand.made)
    assert syncs == [1]  # one synchronize a step, at its start
    assert clock.events(8, []) == []
