# The watchdog: a thread that ends this process when an instruction makes no progress for --timeout
# seconds (a peer died or hangs), naming the instruction and the rank it waits for. The process group
# carries the same timeout, so a blocked collective or receive normally fails first with its own error.
from __future__ import annotations

import os
import sys
import threading
import time

from schedc.plan import Opcode

from .failures import record_error

GRACE = 2.0  # let the process group's own timeout fire first
EXIT_STUCK = 3


class Watchdog:
    def __init__(self, executor, timeout: float):
        self.executor, self.limit = executor, timeout + GRACE
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="schedc-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()

    def _watch(self) -> None:
        period = min(1.0, self.limit / 4)
        while not self.done.wait(period):
            ex = self.executor
            instr, started = ex.current, ex.started
            if instr is not None and time.monotonic() - started > self.limit:
                line = (f"error: rank {ex.rank}: no progress for {self.limit:.0f} s while executing "
                        f"{instr} (step {ex.step_no}); {self._suspect(instr)}")
                print(line, file=sys.stderr, flush=True)
                record_error(line)
                os._exit(EXIT_STUCK)

    def _suspect(self, instr) -> str:
        ex = self.executor
        if ex.waiting_on is not None:
            return f"waiting for rank {ex.waiting_on}, which is lost or stuck"
        if instr.op == Opcode.SYNC_GRAD and instr.group:
            ranks = [ex.world.global_rank(r) for r in instr.group]
            return f"one of ranks {ranks} is lost or stuck"
        if instr.op in (Opcode.STEP, Opcode.SEND_F, Opcode.SEND_B):
            return "another rank is lost or stuck"
        return "this rank is stuck in the instruction itself"
