# The host buffers offload (O, L) copies a forward's saved storages into: page-locked on CUDA (the copy
# engine reads and writes them while the GPU computes), plain on CPU. At most the plan's offload peak of
# forwards' states is in host memory at once (offload_peak: +1 at an O, -1 at its L, in the rank's step
# programs); a state's buffers are taken at its O and given back after its L's copies are through, for
# the next O to reuse (smallest that fits), so the pool's bytes stop growing once the peak has been
# reached: peak x the largest state's bytes at most. A state past the peak is refused (OffloadError).
from __future__ import annotations

from typing import Any, Callable

import torch

from schedc.plan import Instr, Opcode

Key = tuple[int, int]


def offload_peak(programs: list[tuple[Instr, ...]]) -> int:
    """The most forwards' states offloaded and not yet reloaded at once, over the step programs.

    >>> o, l = (lambda mb: Instr(Opcode.O, 0, mb)), (lambda mb: Instr(Opcode.L, 0, mb))
    >>> offload_peak([(o(0), o(1), l(0), o(2), l(1), l(2))])
    2
    """
    peak = 0
    for program in programs:
        out = 0
        for unit in (u for instr in program for u in instr.units()):
            out += (unit.op == Opcode.O) - (unit.op == Opcode.L)
            peak = max(peak, out)
    return peak


class OffloadError(RuntimeError):
    """Offload run against its plan: more forwards' states on the host at once than the plan's peak, or a
    backward reading a saved tensor that O moved to host memory and no L brought back (placed.py)."""


class PinnedPool:
    """Host buffers for at most `states` offloaded forwards at once. `allocate(nbytes)` makes a buffer
    (pinned on CUDA); a state's buffers come back with `release(key, event)`, reusable once `event` (its
    L's copies; None: at once) has completed."""

    def __init__(self, states: int, allocate: Callable[[int], torch.Tensor]):
        self.states, self.allocate = states, allocate
        self.free: list[torch.Tensor] = []
        self.held: dict[Key, list[torch.Tensor]] = {}
        self.pending: list[tuple[Any, list[torch.Tensor]]] = []  # (event, buffers) until their copies are done
        self.bytes = 0  # all buffers made, in use or free

    def take(self, key: Key, nbytes: int) -> torch.Tensor:
        """A buffer of `nbytes` bytes for the state `key` (a view of a pooled one, or a new one)."""
        if key not in self.held and len(self.held) >= self.states:
            raise OffloadError(f"offloading stage {key[0]} microbatch {key[1]} would hold {len(self.held) + 1} forwards' "
                            f"states in host memory at once; the plan's offload peak on this rank is {self.states}")
        self._collect()
        fits = [i for i, b in enumerate(self.free) if b.numel() >= nbytes]
        if fits:
            buffer = self.free.pop(min(fits, key=lambda i: self.free[i].numel()))  # the smallest that fits
        else:
            buffer = self.allocate(nbytes)
            self.bytes += buffer.numel()
        self.held.setdefault(key, []).append(buffer)
        return buffer[:nbytes]

    def release(self, key: Key, event: Any = None) -> None:
        """The state's buffers back, for reuse once `event` has completed."""
        self.pending.append((event, self.held.pop(key, [])))
        self._collect()

    def _collect(self) -> None:
        waiting = []
        for event, buffers in self.pending:
            if event is None or event.query():
                self.free += buffers
            else:
                waiting.append((event, buffers))
        self.pending = waiting


def host_buffers(cuda: bool) -> Callable[[int], torch.Tensor]:
    """How the pool makes a buffer: pinned on CUDA, plain on CPU."""
    return lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
