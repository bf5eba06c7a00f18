"""The queues programs pop from: a program's `queue` of ops sorted by its key (the key names, the columns
a key reads, chunk indices of V shapes), each device's queues (DeviceQueues, each made when a cursor first
asks for it), and the per-step budget of an interpreted
program."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import compress, groupby
from operator import attrgetter
from collections.abc import Sequence
from typing import Any, Callable

from ..budget import PROGRAM_STATEMENTS
from ..ir import Op, Pipeline
from ..ops import SPLIT, OpKind, split_unit
from . import ast
from .expr import EvalError, PipeRef, compile_expr, fold_constants, free_names

@dataclass
class StepBudget:
    """Statements the programs of all devices may still run (shared, so a runaway loop stops once)."""

    total: int
    left: int = -1

    def __post_init__(self) -> None:
        self.left = self.total

    def refusal(self) -> str:
        return f"programs run more than {self.total:,} statements (a runaway loop?){PROGRAM_STATEMENTS.why}"


KIND_RANK = {"F": 0, "I": 1, "B": 1, "W": 2}


KEY_NAMES = ("s", "i", "d", "c", "kind", "pipe", "j")


def bind_names(scope: dict[str, Any], op: Op, pipe: PipeRef, chunk: dict[tuple[int, int], int],
               chunks: int = 1) -> dict:
    """Bind the names a key or greedy priority may read: s, i, d, c, kind, pipe, and j, the sequence
    chunk (i is then the unit's microbatch, ops.split_unit)."""
    mb, j = split_unit(op.mb, chunks) if op.mb is not None else (-1, 0)
    scope["s"], scope["i"], scope["d"], scope["j"] = op.stage, mb, op.device, j
    scope["c"], scope["kind"], scope["pipe"] = chunk[(op.pipe, op.stage)], op.kind, pipe
    return scope


def key_functions(key: tuple[ast.Expr, ...], env: dict[str, Any]) -> list:
    """Compile a key, folding in the params (every name but the per-op ones is constant)."""
    constants = {k: v for k, v in env.items() if k not in KEY_NAMES}
    return [compile_expr(e, constants) for e in key]


def chunk_index(pipelines: tuple[Pipeline, ...]) -> dict[tuple[int, int], int]:
    """c: the index of stage s among the stages its pipeline places on the same device."""
    out = {}
    for k, pipe in enumerate(pipelines):
        seen: dict[int, int] = {}
        for s, device in enumerate(pipe.placement):
            out[(k, s)] = seen.get(device, 0)
            seen[device] = out[(k, s)] + 1
    return out


def sort_queue(ops: list[Op], key: QueueKey | None, pipelines, chunk) -> list[Op]:
    """The ops of one queue (all of one kind) in pop order: by the queue's key, ties broken by pipe, stage,
    microbatch and part; without a key by microbatch then stage (descending for backwards), pipe, part.
    Sorts plain tuples zipped from columns of the ops' values (see _Columns)."""
    if not ops:
        return []
    return list(map(ops.__getitem__, queue_order(ops, key, pipelines, chunk)))


def queue_order(ops: Sequence[Op], key: QueueKey | None, pipelines, chunk, fields: dict[str, list] | None = None
                ) -> list[int]:
    """sort_queue's pop order as positions in `ops`; `fields`: the Op fields the caller has as columns
    already (the kind, stage, mb, pipe and part of each op: then no op is read)."""
    columns = _Columns(ops, pipelines, chunk, fields)
    if key is None and _one_home(columns):  # the stage, pipe and part tie: by the unit alone, stable
        units = columns.name("i")
        return sorted(range(len(units)), key=units.__getitem__)
    if key is None:
        by = zip(zip(columns.name("i"), _default_stages(columns)), columns.field("pipe"), columns.field("part"))
    else:
        try:
            values = key.columns(columns)
        except EvalError:  # evaluate op by op, so the error is the first op's (then the first key part's)
            values = list(zip(*_key_rows(key.key, key.env, columns)))
        by = zip(*values, columns.field("pipe"), columns.field("stage"), _none_as(columns.field("mb"), 0),
                 columns.field("part"))
    keys = list(by)
    return sorted(range(len(keys)), key=keys.__getitem__)


def _one_home(columns: _Columns) -> bool:
    """Whether the queue's ops share one stage of one pipeline and one part (a device of 1F1B, GPipe):
    then the default order's ties after the unit are all equal."""
    return all(len(set(columns.field(name))) <= 1 for name in ("stage", "pipe", "part"))


def _default_stages(columns: _Columns) -> list[int]:
    """The stage, negated for backwards: later stages run their backward first."""
    backward = ("B", "I", "W")
    return [-s if kind in backward else s for kind, s in zip(columns.field("kind"), columns.field("stage"))]


def _none_as(values: list, default: Any) -> list:
    """`values` with None replaced (ops of per-stage tasks have no microbatch)."""
    return [default if v is None else v for v in values] if None in values else values


class _Columns:
    """A queue's ops as columns, each made on first use by one pass: Op fields, and what a key reads
    as each of KEY_NAMES (the values bind_names gives them). `fields`: Op fields the caller already
    has as columns (prefix.py's ops, made only when a program reads them)."""

    def __init__(self, ops: Sequence[Op], pipelines: tuple[Pipeline, ...], chunk: dict[tuple[int, int], int],
                 fields: dict[str, list] | None = None):
        self.ops, self.pipelines, self.chunk = ops, pipelines, chunk
        self.fields: dict[str, list] = dict(fields or {})
        self.names: dict[str, list] = {}

    def field(self, name: str) -> list:
        """An Op field of every op."""
        if name not in self.fields:
            self.fields[name] = list(map(attrgetter(name), self.ops))
        return self.fields[name]

    def name(self, name: str) -> list:
        """What a key reads as `name` (one of KEY_NAMES) for every op."""
        if name not in self.names:
            self.names[name] = self.NAMES[name](self)
        return self.names[name]

    def _chunks(self) -> list[int]:
        return list(map(self.chunk.__getitem__, zip(self.field("pipe"), self.field("stage"))))

    def _pipe_refs(self) -> list[PipeRef]:
        return list(map([PipeRef(p.name) for p in self.pipelines].__getitem__, self.field("pipe")))

    def _units(self, which: int) -> list[int]:
        """The microbatch (which=0) or sequence chunk (1) of every op's unit (ops.split_unit)."""
        mbs = _none_as(self.field("mb"), -1)
        if all(p.chunks == 1 for p in self.pipelines):
            return mbs if which == 0 else [0] * len(mbs)
        chunks = [self.pipelines[k].chunks for k in self.field("pipe")]
        return [-1 if mb < 0 else split_unit(mb, n)[which] for mb, n in zip(mbs, chunks)]

    NAMES: dict[str, Callable[[_Columns], list]] = {
        "s": lambda self: self.field("stage"), "i": lambda self: self._units(0),
        "d": lambda self: self.field("device"), "c": _chunks, "kind": lambda self: self.field("kind"),
        "pipe": _pipe_refs, "j": lambda self: self._units(1)}


def _key_rows(key: tuple[ast.Expr, ...], env: dict[str, Any], columns: _Columns) -> list[tuple]:
    fns, scope, rows = key_functions(key, env), dict(env), []
    for values in zip(*map(columns.name, KEY_NAMES)):
        scope.update(zip(KEY_NAMES, values))
        rows.append(tuple(fn(scope) for fn in fns))
    return rows


class QueueKey:
    """A queue's key, `queue F by (i // p, s)`, for all the devices' queues it sorts: each part compiled
    once with the params folded in, and evaluated once per distinct value of the names it reads (`i // p`
    once per microbatch, not once per op)."""

    def __init__(self, key: tuple[ast.Expr, ...], env: dict[str, Any]):
        self.key, self.env, self.scope = key, env, dict(env)
        self.parts: list[tuple[Callable, list[str], dict]] | None = None  # (function, names read, memo)

    def columns(self, columns: _Columns) -> list[list]:
        """The value of each key part per op."""
        if self.parts is None:
            constants = {k: v for k, v in self.env.items() if k not in KEY_NAMES}
            folded = [fold_constants(expr, constants) for expr in self.key]
            self.parts = [(compile_expr(expr), [name for name in KEY_NAMES if name in free_names(expr)], {})
                          for expr in folded]
        return [self._column(*part, columns) for part in self.parts]

    def _column(self, fn: Callable, names: list[str], memo: dict, columns: _Columns) -> list:
        read = list(map(columns.name, names))
        picked = read[0] if len(read) == 1 else list(zip(*read)) if read else [()] * len(columns.ops)
        try:
            return list(map(memo.__getitem__, picked))  # every value met in an earlier queue
        except KeyError:
            pass
        first = dict(zip(reversed(picked), reversed(range(len(picked)))))  # a representative op per value
        for value, n in first.items():
            if value not in memo:
                self.scope.update(zip(names, [column[n] for column in read]))
                memo[value] = fn(self.scope)
        return list(map(memo.__getitem__, picked))


@dataclass
class Queue:
    """The ops of one kind on one device, sorted; pops skip ops already taken by another cursor."""

    ops: list[Op]
    position: int = 0

    def peek_run(self, count: int, taken: set[int]) -> list[Op]:
        """The next `count` ops if they are all there and none is taken yet (one C-level test), else []."""
        ops = self.ops[self.position:self.position + count]
        return ops if len(ops) == count and taken.isdisjoint(map(id, ops)) else []

    def pop(self, taken: set[int]) -> Op | None:
        """peek(), and the op it finds popped."""
        ops, position = self.ops, self.position
        while position < len(ops) and id(ops[position]) in taken:
            position += 1
        self.position = position + (position < len(ops))
        return ops[position] if position < len(ops) else None

    def peek(self, taken: set[int]) -> Op | None:
        """The next op not taken yet (skipping the taken ones for good), or None."""
        while self.position < len(self.ops) and id(self.ops[self.position]) in taken:
            self.position += 1
        return self.ops[self.position] if self.position < len(self.ops) else None


def by_device(ops: list[Op], devices: int) -> list[list[Op]]:
    """Each device's ops in their order in `ops` (taken a run of one device's ops at a time)."""
    per_device: list[list[Op]] = [[] for _ in range(devices)]
    for device, run in groupby(ops, key=attrgetter("device")):
        per_device[device] += run
    return per_device


def _by_kind(device_ops: list[Op], mixed: bool) -> dict[str, list[Op]]:
    """The device's ops by kind, kinds in the order their first op comes (with a mixed backward, no I, W);
    one pass over the ops per kind."""
    kinds = list(map(attrgetter("kind"), device_ops))
    return {kind: list(compress(device_ops, map(kind.__eq__, kinds))) for kind in dict.fromkeys(kinds)
            if not (mixed and kind in SPLIT)}


def _kind_key(keys: dict, kind: str, mixed: bool) -> QueueKey | None:
    """The key of a kind's whole queue: its own, or with a mixed backward I's for B's (the backward queue)."""
    return keys.get((kind, None)) or (keys.get((OpKind.I.value, None)) if mixed and kind == OpKind.B.value else None)


def _pipe_ops(ordered: list[Op], k: int, key: QueueKey | None, pipelines, chunk) -> list[Op]:
    """Pipeline k's ops of a kind's whole queue, in its order or by the pipeline's own key."""
    mine = [op for op in ordered if op.pipe == k]
    return sort_queue(mine, key, pipelines, chunk) if key is not None else mine


def _chunk_queues(queues: dict, kind: str, pipe: str | None, ordered: list[Op], chunk) -> None:
    """A queue per local chunk, in the order of the whole queue (made only for devices with chunks)."""
    by_chunk: dict[int, list[Op]] = {}
    for op in ordered:
        by_chunk.setdefault(chunk[(op.pipe, op.stage)], []).append(op)
    for c, ops in by_chunk.items():
        queues[(kind, pipe, c)] = Queue(ops)


class DeviceQueues(dict):
    """The device's queues: (kind, pipeline name or None, local chunk or None) -> its ops in pop order
    (with a mixed backward, I and W are not queued: B's queue is the backward queue, see
    order._MixedBackward), each made when a cursor first asks for it (`queues[key]`, at a plain dict
    lookup's cost once made; None where the device has no such queue): a program that pops only F and one
    backward (prefix.order_starts) splits no chunk and sorts no unkeyed queue it never pops. Exact: a queue's ops do not depend on
    when it is made, and a queue no cursor asked for yet is as it was made (nothing popped). A key's
    error is raised when the device's queues are made: every queue a key sorts (a kind's or a
    pipeline's) is sorted then, kinds in the order their first op comes; only the unkeyed sorts and the
    pipeline and chunk splits wait. all() makes every queue (an empty pop's report lists the chunks)."""

    queue = Queue  # what holds a whole queue of a kind (or of a pipeline's ops of it)

    def __init__(self, device_ops: list[Op], keys: dict[tuple[str, str | None], QueueKey], pipelines, chunk,
                 mixed: bool = False):
        super().__init__()
        self.keys, self.pipelines, self.chunk, self.mixed = keys, pipelines, chunk, mixed
        self.by_kind = _by_kind(device_ops, mixed)
        self.pipes = {p.name: k for k, p in enumerate(pipelines)}
        self.ordered: dict[tuple[str, str | None], list[Op]] = {}  # (kind, pipeline) -> its ops in pop order
        self.split: dict[tuple[str, str | None], list[int]] = {}  # (kind, pipeline) -> its chunks, once split
        self._sort_keyed()

    def _sort_keyed(self) -> None:
        """Sort every queue a key sorts now, kinds in the order their first op comes (a key's error is
        raised when the device's queues are made)."""
        for kind in self.by_kind:
            for pipe in (None, *self.pipes):
                if (_kind_key(self.keys, kind, self.mixed) if pipe is None else self.keys.get((kind, pipe))) is not None:
                    self._ops(kind, pipe)

    def __missing__(self, key: tuple[str, str | None, int | None]) -> Queue | None:
        kind, pipe, chunk = key
        if chunk is None:
            ops = self._ops(kind, pipe)
            self[key] = self.queue(ops) if ops else None
        elif key not in self._split(kind, pipe):
            self[key] = None
        return self[key]

    def _ops(self, kind: str, pipe: str | None) -> list[Op]:
        """The ops of a kind's queue (of one pipeline, or all) in pop order."""
        found = self.ordered.get((kind, pipe))
        if found is None:
            if pipe is None:
                found = self._sorted(kind, _kind_key(self.keys, kind, self.mixed))
            else:
                k = self.pipes.get(pipe)
                found = [] if k is None else _pipe_ops(self._ops(kind, None), k, self.keys.get((kind, pipe)),
                                                       self.pipelines, self.chunk)
            self.ordered[(kind, pipe)] = found
        return found

    def _sorted(self, kind: str, key: QueueKey | None) -> Sequence[Op]:
        """A kind's whole queue in pop order."""
        return sort_queue(self.by_kind.get(kind, []), key, self.pipelines, self.chunk)

    def _split(self, kind: str, pipe: str | None) -> dict[tuple, Queue]:
        """The chunk queues of a kind's queue (of one pipeline, or all), made now if new."""
        if (kind, pipe) not in self.split:
            made: dict = {}
            _chunk_queues(made, kind, pipe, self._ops(kind, pipe), self.chunk)
            self.update(made)
            self.split[(kind, pipe)] = [c for (_, _, c) in made]
        return {(kind, pipe, c): self[(kind, pipe, c)] for c in self.split[(kind, pipe)]}

    def all(self) -> dict[tuple[str, str | None, int | None], Queue]:
        """Every queue, made now: by kind, each kind's whole queue, then its chunks, then each pipeline's."""
        out = {}
        for kind in self.by_kind:
            for pipe in (None, *self.pipes):
                whole = self[(kind, pipe, None)]
                if whole is not None:
                    out[(kind, pipe, None)] = whole
                    out.update(self._split(kind, pipe))
        return out
