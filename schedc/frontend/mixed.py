"""`backward mixed` on one device: each backward popped as a whole B or as its I (its W then pending,
popped by a later W cursor), chosen by the program (order.py's cursors)."""
from __future__ import annotations

from operator import attrgetter

from ..ir import Op
from ..ops import GRADIENT, SPLIT, OpKind

_B, _I, _W = OpKind.B.value, OpKind.I.value, OpKind.W.value
BACKWARDS = GRADIENT | SPLIT  # B, I, W: what a mixed backward chooses among
_KEY = attrgetter("kind", "stage", "mb", "pipe")


class MixedBackward:
    """`backward mixed` on one device: the backward queue holds one op per (stage, microbatch), the B;
    popping it as I places the I instead and makes its W pending; a W pops the oldest pending one (of a
    chunk or pipeline, when the cursor names one). The halves not chosen count as taken."""

    def __init__(self, device_ops: list[Op]):
        # every op by (kind, stage, mb, pipe): the backwards' are what is read (F's are there, unread)
        self.halves = dict(zip(map(_KEY, device_ops), device_ops))
        self.pending: list[Op] = []  # W ops of the I's placed so far, oldest first

    def choose(self, backward: Op, kind: str, taken: set[int]) -> Op:
        at = (backward.stage, backward.mb, backward.pipe)
        i, w = self.halves[(_I, *at)], self.halves[(_W, *at)]
        if kind == _B:
            taken.update((id(i), id(w)))
            return backward
        taken.add(id(backward))
        self.pending.append(w)
        return i

    def _find(self, pipelines, pipe: str | None, chunk: int | None, chunks) -> int | None:
        for n, w in enumerate(self.pending):
            if (pipe is None or pipelines[w.pipe].name == pipe) and (chunk is None or chunks[(w.pipe, w.stage)] == chunk):
                return n
        return None

    def name(self, op: Op, taken: set[int]) -> None:
        """An op named in an explicit list (`I(0, 3)`): the halves it excludes count as taken."""
        at = (op.stage, op.mb, op.pipe)
        if op.kind == _B:
            taken.update(id(self.halves[(k, *at)]) for k in SPLIT)
        elif op.kind == _I:
            taken.add(id(self.halves[(_B, *at)]))
        elif op in self.pending:
            self.pending.remove(op)

    def peek_weight(self, pipelines, pipe, chunk, chunks) -> Op | None:
        n = self._find(pipelines, pipe, chunk, chunks)
        return None if n is None else self.pending[n]

    def pop_weight(self, pipelines, pipe, chunk, chunks) -> Op | None:
        n = self._find(pipelines, pipe, chunk, chunks)
        return None if n is None else self.pending.pop(n)
