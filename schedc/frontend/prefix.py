"""The start of a schedule's order without the rest of it: each device's program run only until it
places its first backward (B, I or W), over the ops elaboration would give it. `schedc tune` bounds a
candidate's memory by it before elaborating the whole order (schedc/search/searcher.py): the
activations alive along a start of an order never exceed those alive at the order's peak.

    1f1b p=4 m=8: device 0 -> F(0,0) F(0,1) F(0,2) F(0,3) B(0,0)   (its whole order: 16 ops)

The starts are those of elaborate's orders only where the programs alone give the order; elsewhere
there is none (None): `order greedy` (the costs choose), `squeeze` (it moves ops after the programs
ran), tasks and fills, `recompute F` and `offload F` (the ops they add), `memory` declarations.

A start reads few of the ops (1F1B's device d: p - d of its 2m), so none is built ahead: each
device's ops are columns of integers (_DeviceOps), a queue is its order over them (queues.queue_order,
the sort elaborate's queues make), and an Op is made when a program reads it, once.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain, repeat

from . import ast
from ..diagnostics import SchedError, Source, has_errors
from ..ir import Op, Pipeline, ops_from_columns
from ..ops import GRADIENT, MIXED_KINDS, SPLIT, OpKind, builtin_kinds
from .elaborate import shape_of
from .expr import EvalError, PipeRef
from .order import run_programs
from .queues import DeviceQueues, Queue, QueueKey, queue_order

BACKWARDS = frozenset(GRADIENT | SPLIT)  # where a device's start ends: its first B, I or W
WEIGHTS = frozenset({OpKind.W.value})  # or, a longer start, its first W (the W's deferred until then held)
# what makes the programs' orders other than elaborate's (or memory other than the order walk's)
_REORDERED = (ast.Greedy, ast.Squeeze, ast.TaskDecl, ast.Fill, ast.Recompute, ast.Offload, ast.MemoryDecl)


def order_starts(decl: ast.ScheduleDecl, source: Source, overrides: dict[str, str],
                 until: frozenset[str] = BACKWARDS) -> tuple[tuple[Op, ...], ...] | None:
    """Per device, its order up to and including its first op of the `until` kinds, its first backward
    by default (the whole order where it has none), as elaborate(decl, source, Options(overrides))
    orders it; None where the programs alone do not give that order, or the schedule cannot be built
    (elaborate says why)."""
    programs = [d for d in decl.decls if isinstance(d, ast.Program)]
    if not programs or any(isinstance(d, _REORDERED) for d in decl.decls):
        return None
    queue_decls = [d for d in decl.decls if isinstance(d, ast.QueueDecl)]
    split = any(isinstance(d, ast.SplitBackward) for d in decl.decls)
    mixed = any(isinstance(d, ast.MixedBackward) for d in decl.decls)
    try:
        env, devices, pipelines = shape_of(decl, source, overrides)
        kinds = MIXED_KINDS if mixed else builtin_kinds(split)
        ascending = [all(a <= b for a, b in zip(p.microbatches, p.microbatches[1:])) for p in pipelines]
        per_device = [_DeviceOps(dev, pipelines, kinds, ascending) for dev in range(devices)]
        env = {**env, **{p.name: PipeRef(p.name) for p in pipelines}}
        orders, diags = run_programs(programs, queue_decls, [], pipelines, devices, env, source, mixed,
                                     until=until, per_device=per_device, queues=_LazyQueues)
    except (SchedError, EvalError):
        return None
    return None if has_errors(diags) else orders


class _DeviceOps(Sequence):
    """One device's built-in ops as build_ops makes them (its pipelines' stages in order, microbatch by
    microbatch, kind by kind), as columns of integers: its stages, microbatches and pipelines, one row
    per (stage, microbatch). Each Op is made the first time it is read and kept, so that every queue
    and every program reads the same object (programs mark what they took by identity)."""

    def __init__(self, device: int, pipelines: tuple[Pipeline, ...], kinds: tuple[str, ...], ascending: list[bool]):
        blocks = [(k, s) for k, pipe in enumerate(pipelines) for s, at in enumerate(pipe.placement) if at == device]
        self.device, self.pipelines, self.kinds = device, pipelines, kinds
        self.stage = list(chain.from_iterable(repeat(s, len(pipelines[k].microbatches)) for k, s in blocks))
        self.pipe = list(chain.from_iterable(repeat(k, len(pipelines[k].microbatches)) for k, _ in blocks))
        self.mb = list(chain.from_iterable(pipelines[k].microbatches for k, _ in blocks))
        self.made: dict[str, dict[int, Op]] = {kind: {} for kind in kinds}  # kind -> row -> its op
        self.parts = [pipe.chunks for pipe in pipelines]
        # one stage of one pipeline, its units ascending: the rows are in the order a queue without key pops
        self.in_order = len(blocks) == 1 and ascending[blocks[0][0]]

    def op(self, kind: str, row: int) -> Op:
        """The op of `kind` in this row (what build_ops makes: part 0, cost 0, no span yet)."""
        op = self.made[kind].get(row)
        return op if op is not None else self.ops(kind, [row])[0]

    def ops(self, kind: str, rows: Sequence[int]) -> list[Op]:
        """The ops of `kind` in these rows, those not made yet made together (ir.ops_from_columns)."""
        made = self.made[kind]
        new = [row for row in rows if row not in made]
        if new:
            pipes = list(map(self.pipe.__getitem__, new))
            made.update(zip(new, ops_from_columns(
                len(new), repeat(kind), map(self.stage.__getitem__, new), map(self.mb.__getitem__, new), pipes,
                repeat(0), repeat(self.device), repeat(0.0), repeat(None), map(self.parts.__getitem__, pipes))))
        return list(map(made.__getitem__, rows))

    def __len__(self) -> int:
        return len(self.stage) * len(self.kinds)

    def __getitem__(self, n: int) -> Op:
        if not 0 <= n < len(self):
            raise IndexError(n)
        row, kind = divmod(n, len(self.kinds))
        return self.op(self.kinds[kind], row)

    def __iter__(self) -> Iterator[Op]:
        rows = range(len(self.stage))
        return chain.from_iterable(zip(*(self.ops(kind, rows) for kind in self.kinds)))

    def by_kind(self, mixed: bool) -> dict[str, _KindOps]:
        """The device's ops by kind in build order (queues._by_kind's: no I or W with a mixed backward)."""
        rows = range(len(self.stage))
        return {kind: _KindOps(self, kind, rows) for kind in self.kinds if rows and not (mixed and kind in SPLIT)}

    def columns(self, kind: str) -> dict[str, list]:
        """The Op fields a queue's sort reads of the kind's ops (queues.queue_order), row by row."""
        n = len(self.stage)
        return {"kind": [kind] * n, "stage": self.stage, "mb": self.mb, "pipe": self.pipe, "part": [0] * n,
                "device": [self.device] * n}


class _KindOps(Sequence):
    """Ops of one kind of a device, as rows of its _DeviceOps in some order (a queue's), made as read."""

    def __init__(self, ops: _DeviceOps, kind: str, rows: Sequence[int]):
        self.ops, self.kind, self.rows = ops, kind, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, n):
        if isinstance(n, slice):
            return _KindOps(self.ops, self.kind, self.rows[n])
        return self.ops.op(self.kind, self.rows[n])

    def __iter__(self) -> Iterator[Op]:
        """The ops in order, made in batches that double (a reader that stops early makes few)."""
        start, size = 0, 1
        while start < len(self.rows):
            yield from self.ops.ops(self.kind, self.rows[start:start + size])
            start, size = start + size, size * 2

    def meets(self, taken: set[int]) -> bool:
        """Whether one of these ops is taken (only ops made so far can be)."""
        made = self.ops.made[self.kind]
        return any(id(made[row]) in taken for row in made.keys() & self.rows)


class _LazyQueue(Queue):
    """A Queue over _KindOps: peek_run reads no op it does not return, and returns them unmade."""

    def peek_run(self, count: int, taken: set[int]) -> Sequence[Op]:
        ops = self.ops[self.position:self.position + count]
        return ops if len(ops) == count and not ops.meets(taken) else []


class _LazyQueues(DeviceQueues):
    """DeviceQueues over a _DeviceOps: a kind's whole queue sorted over its columns (queue_order, the
    sort of DeviceQueues) into _KindOps; the pipelines' and chunks' queues read it as DeviceQueues do."""

    def __init__(self, device_ops: _DeviceOps, keys: dict[tuple[str, str | None], QueueKey], pipelines, chunk,
                 mixed: bool = False):
        super().__init__([], keys, pipelines, chunk, mixed)
        self.device_ops, self.by_kind = device_ops, device_ops.by_kind(mixed)
        self._sort_keyed()

    def queue(self, ops: Sequence[Op]) -> Queue:
        return _LazyQueue(ops) if isinstance(ops, _KindOps) else Queue(ops)

    def _sorted(self, kind: str, key: QueueKey | None) -> Sequence[Op]:
        ops = self.by_kind.get(kind)
        if ops is None:
            return []
        if key is None and self.device_ops.in_order:  # queue_order's sort of rows already in order
            return ops
        rows = queue_order(ops, key, self.pipelines, self.chunk, self.device_ops.columns(kind))
        return _KindOps(self.device_ops, kind, rows)
