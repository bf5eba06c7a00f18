# When each instruction of a step ran, as host nanoseconds (time.perf_counter_ns): on the host, read as
# it runs; on CUDA, from events recorded on the device's stream as the host issues the instructions and
# read once, at the step's end, so measuring does not serialize the step (a synchronize per instruction
# would put every send and receive in series and describe another run).
#
# A clock gives a mark before and after each instruction and turns a step's marks into events
# (step, index, start, end, wait_ns). On the host an instruction that blocked on a receive starts where
# that wait ended less the wait (executor.waited_until); on CUDA an instruction's span includes its
# stream's wait for a receive, and wait_ns is 0.
from __future__ import annotations

import time
from typing import Any, Callable


class HostClock:
    """Host timestamps, read as the instructions run."""

    mark = staticmethod(time.perf_counter_ns)

    def begin_step(self) -> None:
        pass

    def events(self, step: int, marks: list[tuple[int, Any, Any, int, int]]) -> list[tuple[int, int, int, int, int]]:
        """marks: (index, start, end, wait_ns, waited_until) per instruction."""
        out = []
        for index, start, end, wait, until in marks:
            begun = until - wait if wait else start  # a wait ends where the compute begins
            out.append((step, index, max(start, begun), end, wait))
        return out


class DeviceClock:
    """CUDA events on the current stream, anchored to the host clock once per step (one synchronize at
    the step's start, one read at its end)."""

    def __init__(self, event: Callable[[], Any] | None = None, synchronize: Callable[[], None] | None = None):
        if event is None:
            import torch
            event, synchronize = (lambda: torch.cuda.Event(enable_timing=True)), torch.cuda.synchronize
        self.new_event, self.synchronize = event, synchronize
        self.anchor, self.anchor_ns = None, 0

    def begin_step(self) -> None:
        self.synchronize()
        self.anchor_ns, self.anchor = time.perf_counter_ns(), self.mark()

    def mark(self) -> Any:
        event = self.new_event()
        event.record()
        return event

    def at(self, event: Any) -> int:
        return self.anchor_ns + round(self.anchor.elapsed_time(event) * 1e6)  # elapsed_time is in ms

    def events(self, step: int, marks: list[tuple[int, Any, Any, int, int]]) -> list[tuple[int, int, int, int, int]]:
        if not marks:
            return []
        marks[-1][2].synchronize()  # the step's last event: every earlier one has completed too
        return [(step, index, self.at(start), self.at(end), 0) for index, start, end, _, _ in marks]


HOST = HostClock()
