"""The IR: ops, pipelines and a schedule's per-device orders, as frozen dataclasses.

An op is identified by (kind, stage, mb, pipe, part); its device, cost and source span ride along
without taking part in equality, so ops can key dicts cheaply.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from functools import lru_cache
from collections.abc import Iterable, Iterator, Mapping
from itertools import repeat
from operator import attrgetter
from typing import Any

from .diagnostics import Source, Span
from .ops import BUILTIN, RELEASES, OpKind, builtin_deps, chunk_step, fed_by, gradient_kind, label, release_kind


@dataclass(frozen=True, slots=True)
class Op:
    kind: str
    stage: int
    mb: int | None
    pipe: int = 0
    part: int = 0
    device: int = field(default=0, compare=False)
    cost: float = field(default=1.0, compare=False)
    span: Span | None = field(default=None, compare=False, repr=False)
    parts: int = field(default=1, compare=False)

    def __str__(self) -> str:
        return label(self.kind, self.stage, self.mb, part=self.part, parts=self.parts)

    @property
    def is_task(self) -> bool:
        return self.kind not in BUILTIN

    @property
    def key(self) -> tuple:
        """The identity as a plain tuple (cheap to hash): (kind, stage, mb, pipe, part)."""
        return (self.kind, self.stage, self.mb, self.pipe, self.part)


OP_KEY = attrgetter("kind", "stage", "mb", "pipe", "part")  # Op.key, read in C
OP_FIELDS = tuple(f.name for f in fields(Op))  # kind, stage, mb, pipe, part, device, cost, span, parts
consume = deque(maxlen=0).extend  # runs an iterator for its effects (a C-level map of setters, appends)


def ops_from_columns(count: int, *columns) -> list[Op]:
    """`count` Ops built field by field: one iterable per field of OP_FIELDS, each stored into every op
    by one C-level map over the field's slot. The per-op dataclass __init__ (a Python call and nine
    object.__setattr__) costs twice as much, which adds up over the 10^5 ops of a big schedule. The
    result is ordinary frozen Ops, equal and hashed as ever (Op has no __post_init__ to skip)."""
    ops = list(map(object.__new__, repeat(Op, count)))
    for name, column in zip(OP_FIELDS, columns, strict=True):
        consume(map(getattr(Op, name).__set__, ops, column))
    return ops


_SET_SPAN = Op.span.__set__  # the slot's own setter (Op is frozen: its __setattr__ refuses)


def set_spans(ops: list[Op], spans: Iterable[Span | None]) -> None:
    """Give each op, in place, the span of the cursor that placed it: `[replace(op, span=s) for ...]`
    without a second copy of 10^5 ops, in one C-level pass. Only for the ops elaboration has just made
    (build_ops, tasks) and places once, while it still owns them: no op is changed after its Schedule
    is made. (tests/test_ir.py holds both tricks to the plain forms.)"""
    consume(map(_SET_SPAN, ops, spans))


@dataclass(frozen=True, slots=True)
class Pipeline:
    name: str
    stages: int
    placement: tuple[int, ...]  # placement[s] = device of stage s
    microbatches: tuple[int, ...]  # its units: the microbatches, or with chunks k their i * k + j
    span: Span | None = field(default=None, compare=False)
    chunks: int = 1  # sequence chunks per microbatch (ops.unit_of)


def builtin_dep_keys(kind: str, s: int, mb: int | None, k: int, stages: int,
                     split: bool | frozenset, chunks: int = 1, recompute: bool = False,
                     offloaded: frozenset = frozenset()) -> tuple[tuple, ...]:
    """The identity tuples (see Op.key) of what a built-in op of pipeline k waits for (ops.builtin_deps),
    then with sequence chunks the neighbouring chunk's op of its stage (ops.chunk_step). `split`: whether
    backwards are split, or (a mixed backward) the (pipe, stage, mb) that run split; `offloaded`: the
    (pipe, stage, mb) whose forward state a placed O and L take to host memory and back."""
    mixed = isinstance(split, frozenset)
    step = None if chunks == 1 or mb is None else chunk_step(kind, mb % chunks, chunks)
    chunked = () if step is None else ((kind if kind == OpKind.F or not mixed else
                                        gradient_kind((k, s, mb + step) in split), s, mb + step, k, 0),)
    if mixed:  # B and I read their neighbour's gradient: I's if that one runs split
        producer = _fed_by(kind, s)
        split = producer is not None and (k, producer[1], mb) in split
    away = (k, s, mb) in offloaded if offloaded else False
    found = _builtin_deps(kind, s, stages, bool(split), recompute, away)
    return tuple([(dep, stage, mb, k, 0) for dep, stage in found]) + chunked


# pure functions of few values (split as the bool the rule reads), asked once per op of a schedule
_builtin_deps = lru_cache(maxsize=4096)(builtin_deps)
_fed_by = lru_cache(maxsize=4096)(fed_by)


class Dependencies(Mapping):
    """The data dependencies of every op: built-in ones derived on demand (no storage for the 10^5-10^6
    ops of a big schedule), tasks' declared ones stored. A read-only Mapping Op -> tuple of Ops.
    `split` is a bool, or with a mixed backward the frozenset of (pipe, stage, mb) whose backward is
    split (then `mixed` is true)."""

    __slots__ = ("stages", "placements", "costs", "split", "explicit", "ops", "chunks", "recompute", "offloaded")

    def __init__(self, pipelines: tuple[Pipeline, ...], costs: dict[str, tuple[float, ...]], split: bool,
                 explicit: dict, ops: tuple, recompute: bool = False, offloaded: frozenset = frozenset()):
        self.stages = tuple(p.stages for p in pipelines)
        self.placements = tuple(p.placement for p in pipelines)
        self.chunks = tuple(p.chunks for p in pipelines)
        self.recompute = recompute  # `recompute F`: backwards read what an R rebuilt
        self.offloaded = offloaded  # `offload F`: the (pipe, stage, mb) whose backward reads what an L reloaded
        self.costs, self.split, self.explicit, self.ops = costs, split, explicit, ops

    @property
    def mixed(self) -> bool:
        return isinstance(self.split, frozenset)

    @property
    def per_microbatch(self) -> bool:
        """Whether a built-in op's dependencies vary with its microbatch, not only its kind and stage:
        across sequence chunks, or to the L of an offloaded forward (a mixed backward is `mixed`)."""
        return max(self.chunks, default=1) > 1 or bool(self.offloaded)

    def keys_of(self, op: Op) -> tuple[tuple, ...]:
        """Dependencies as identity tuples (see Op.key)."""
        if op.kind in BUILTIN:
            return builtin_dep_keys(op.kind, op.stage, op.mb, op.pipe, self.stages[op.pipe], self.split,
                                    self.chunks[op.pipe], self.recompute, self.offloaded)
        return tuple(dep.key for dep in self.explicit.get(op, ()))

    def __getitem__(self, op: Op) -> tuple[Op, ...]:
        if op.kind in BUILTIN:
            return tuple(Op(kind, s, mb, k, part, self.placements[k][s], self.costs[kind][s],
                            parts=self.chunks[k]) for kind, s, mb, k, part in self.keys_of(op))
        return self.explicit[op]

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    name: str
    params: tuple[str, ...]
    split: int
    at_end: bool
    span: Span | None = field(default=None, compare=False)
    auto: bool = False  # `split auto`: fill_bubbles chooses how finely to cut it


@dataclass(frozen=True, slots=True)
class Issued:
    """A collective (ops.DECLARED) that every op of `kind` on `stages` (every stage when None) issues
    inside itself: over the op's own rank (its lane of the layout's data, context and expert ranks, which
    run the same plan), or with `replicas` over the ranks holding the op's stage in its replica group
    (Chimera's and DualPipe's copies of a stage). The expert-parallel dispatch or combine of an MoE layer
    is Issued("F", "ALL_TO_ALL") (and its backward's in B and I): expert groups are carved from the data
    and context ranks, never across pipeline ranks."""

    kind: str
    collective: str
    stages: frozenset[int] | None = None
    replicas: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A schedule after elaboration: who runs what, in which order, and what waits on what. Built with
    keywords, once; a pass that changes it returns a new one (dataclasses.replace)."""

    name: str
    description: str
    source: Source
    params: dict[str, Any]
    devices: int
    pipelines: tuple[Pipeline, ...]
    replicas: tuple[tuple[int, ...], ...]
    orders: tuple[tuple[Op, ...], ...]       # orders[d] = device d's program
    deps: Dependencies                        # data dependencies of every op
    costs: dict[str, tuple[float, ...]]       # kind -> cost per stage
    activation: tuple[float, ...]             # activation units per stage, held from F to B (or W)
    memory_limit: tuple[float, ...] | None    # per device
    memory_limit_span: Span | None
    split_backward: bool
    tasks: tuple[TaskSpec, ...] = ()
    keeps: dict[Op, tuple[Op, ...]] = field(default_factory=dict)  # task -> outputs (F, B, ...) it keeps alive
    fill: tuple[tuple[str, int], ...] = ()    # tasks placed into bubbles, in priority order, with split
    unplaced: tuple[Op, ...] = ()             # ops created but left for fill_bubbles to place
    cycle: tuple[tuple[tuple[Op, ...], ...], ...] = ()  # K step programs per device, when bubbles are filled
    fill_span: Span | None = field(default=None, compare=False)  # the `fill bubbles with` statement
    memory: dict[str, tuple[float, ...]] = field(default_factory=dict)  # kind (not F) -> units per stage:
    # saved gradients (B, I, W: while a task keeps them) and tasks' persistent state (schedc/passes/memory.py)
    split_of: frozenset | None = None  # `backward mixed`: the (pipe, stage, mb) whose backward runs as I + W
    recompute: bool = False  # `recompute F`: a forward drops its state; an R rebuilds it before the backward
    offload: bool = False    # `offload F`: a program may place O and L for a forward (deps.offloaded: where it did)
    host_limit: tuple[float, ...] | None = None  # `limit host_memory <= e`, per device
    host_limit_span: Span | None = field(default=None, compare=False)
    fused: tuple[tuple[Op, Op], ...] = ()  # overlapped ops: a forward and a backward, each pair placed side by
    # side in this order (programs' `F & B` put the forward first; a torch CSV cell keeps its own order)
    collectives: tuple[Issued, ...] = ()  # what ops issue inside themselves, in order (an MoE layer's dispatch
    # and combine ALL_TO_ALL in F, B and I); the plan declares each after its op (lower.py)

    @property
    def title(self) -> str:
        """The schedule's name with its params, as headers print it: `1f1b (p=4 m=8)`, or the name alone."""
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.name} ({params})" if params else self.name

    @property
    def mixed_backward(self) -> bool:
        return self.split_of is not None

    @property
    def releases(self) -> frozenset[str]:
        """The kinds that free a forward's activation: B and W with a mixed backward (one of them runs
        per stage and microbatch), else `release`."""
        return RELEASES if self.split_of is not None else frozenset((self.release,))

    def release_of(self, op: Op) -> str:
        """The kind that frees the activation of op's (stage, microbatch): W when its backward is split."""
        if self.split_of is None:
            return self.release
        return release_kind((op.pipe, op.stage, op.mb) in self.split_of)

    @property
    def steps(self) -> tuple[tuple[tuple[Op, ...], ...], ...]:
        """The step programs: cycle[k][d], or the single step (orders) when nothing was filled."""
        return self.cycle or (self.orders,)

    @property
    def stages(self) -> int:
        return self.pipelines[0].stages if self.pipelines else 0

    @property
    def release(self) -> str:
        """The kind that frees a forward's activation: W with a split backward, else B."""
        return release_kind(self.split_backward)

    @property
    def microbatches(self) -> int:
        return sum(len(p.microbatches) // p.chunks for p in self.pipelines)

    @property
    def chunks(self) -> int:
        """Sequence chunks per microbatch (one for every pipeline: elaboration holds them equal)."""
        return self.pipelines[0].chunks if self.pipelines else 1

    def ops(self):
        for order in self.orders:
            yield from order

    def op_count(self) -> int:
        return sum(len(order) for order in self.orders)

    def pipeline_of_mb(self) -> dict[int, int]:
        return {mb: index for index, pipe in enumerate(self.pipelines) for mb in pipe.microbatches}
