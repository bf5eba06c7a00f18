"""AST of the .sched language: frozen dataclasses, each carrying the source span it came from."""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..diagnostics import Span


@dataclass(frozen=True, slots=True)
class Node:
    span: Span


# Expressions ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Num(Node):
    value: int | float


@dataclass(frozen=True, slots=True)
class Name(Node):
    id: str


@dataclass(frozen=True, slots=True)
class Star(Node):
    """`*` in a dependency: every microbatch."""


@dataclass(frozen=True, slots=True)
class Unary(Node):
    op: str  # "-" or "not"
    operand: Expr


@dataclass(frozen=True, slots=True)
class Binary(Node):
    op: str  # + - * / // % ** == != < <= > >= and or
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Cond(Node):
    test: Expr
    then: Expr
    orelse: Expr


@dataclass(frozen=True, slots=True)
class Call(Node):
    func: str  # min max ceil floor abs
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Kinds(Node):
    """`[I, F, W]` in a queue key or greedy priority: the position of the op's kind in the list (kinds
    not listed come after)."""

    names: tuple[str, ...]


Expr = Num | Name | Star | Unary | Binary | Cond | Call | Kinds


# Programs ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Cursor(Node):
    """`F`, `F.up`, `F[1]`, `F(0, 3)`, `curvature_A`: pop the next (or the named) op of a kind from a
    queue; `[c]` restricts it to the device's local chunk c."""

    kind: str
    pipe: str | None
    args: tuple[Expr, ...] | None
    chunk: Expr | None = None


@dataclass(frozen=True, slots=True)
class Group(Node):
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class Overlap(Node):
    """`F[0] & B[1]`: a forward and a backward popped together, run as one op."""

    forward: Cursor
    backward: Cursor


@dataclass(frozen=True, slots=True)
class Choice(Node):
    """`(W[1] | W[0])`: the first of these cursors whose queue has an op."""

    options: tuple[Cursor, ...]


Unit = Cursor | Group | Overlap | Choice


@dataclass(frozen=True, slots=True)
class Item(Node):
    unit: Unit
    repeat: Expr | None
    when: Expr | None
    optional: bool = False  # `F?`: a pop from an empty queue places nothing
    slot: Expr | None = None  # `F at t`: the unit slot of the item's first op (see frontend/squeeze.py)


@dataclass(frozen=True, slots=True)
class Let(Node):
    name: str
    value: Expr


@dataclass(frozen=True, slots=True)
class Loop(Node):
    var: str
    start: Expr
    stop: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class When(Node):
    test: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...]


Stmt = Item | Let | Loop | When


# Declarations --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Param(Node):
    name: str
    default: Expr
    doc: str


@dataclass(frozen=True, slots=True)
class Require(Node):
    test: Expr
    message: str


@dataclass(frozen=True, slots=True)
class Devices(Node):
    count: Expr


@dataclass(frozen=True, slots=True)
class PipelineDecl(Node):
    name: str
    stages: Expr | None
    stage_var: str
    placement: Expr | None
    placement_span: Span | None
    mb_start: Expr | None
    mb_stop: Expr | None
    chunks: Expr | None = None  # `microbatches m chunks k`: sequence chunks per microbatch


@dataclass(frozen=True, slots=True)
class Replicate(Node):
    pipelines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CostDecl(Node):
    kind: str
    stage_var: str | None
    value: Expr


@dataclass(frozen=True, slots=True)
class MemoryDecl(Node):
    kind: str
    stage_var: str | None
    value: Expr


@dataclass(frozen=True, slots=True)
class Limit(Node):
    value: Expr


@dataclass(frozen=True, slots=True)
class HostLimit(Node):
    value: Expr  # `limit host_memory <= e`: per device, what its offloaded state may hold on the host


@dataclass(frozen=True, slots=True)
class Offload(Node):
    kind: str  # the kind whose saved state O and L may take to the host and back: F


@dataclass(frozen=True, slots=True)
class SplitBackward(Node):
    pass


@dataclass(frozen=True, slots=True)
class Recompute(Node):
    kind: str  # the kind whose saved state is dropped and rebuilt by R: F


@dataclass(frozen=True, slots=True)
class MixedBackward(Node):
    """`backward mixed`: each backward runs whole (B) or as I then W, as the program pops it."""


@dataclass(frozen=True, slots=True)
class Squeeze(Node):
    """`squeeze`: the programs' ops, in their unit slots, compacted (frontend/squeeze.py)."""


@dataclass(frozen=True, slots=True)
class QueueDecl(Node):
    kind: str
    pipe: str | None
    key: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Program(Node):
    device_var: str | None  # `on device d { ... }`
    device: int | None      # `on device 0 { ... }`
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class Greedy(Node):
    key: tuple[Expr, ...] | None
    inflight: Expr | None


@dataclass(frozen=True, slots=True)
class Dep(Node):
    kind: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class TaskDecl(Node):
    name: str
    params: tuple[str, ...]
    cost: Expr | None
    after: tuple[Dep, ...]
    keeps: tuple[Dep, ...]
    split: Expr | None
    at_end: bool


@dataclass(frozen=True, slots=True)
class FillItem(Node):
    task: str
    split: Expr | None


@dataclass(frozen=True, slots=True)
class Fill(Node):
    items: tuple[FillItem, ...]


@dataclass(frozen=True, slots=True)
class Extends(Node):
    """`extends base`: the base schedule's declarations, then this file's (which override them)."""
    base: str


@dataclass(frozen=True, slots=True)
class Use(Node):
    """`use addon [as ns]`: an add-on's declarations, its params named `ns.name`."""
    addon: str
    namespace: str


Decl = (Param | Require | Devices | PipelineDecl | Replicate | CostDecl | MemoryDecl | Limit
        | HostLimit | SplitBackward | MixedBackward | Recompute | Offload | Squeeze | QueueDecl | Program | Greedy | TaskDecl | Fill | Extends | Use)


@dataclass(frozen=True, slots=True)
class ScheduleDecl(Node):
    name: str
    doc: str
    decls: tuple[Decl, ...]
    addon: bool = False  # `addon NAME`: declarations to `use`, not a schedule of its own


def contains(node: object, cls: type) -> bool:
    """Whether `node` or any node inside it (its fields, tuples of nodes) is a `cls`.

        contains(<on device d { F[0] & B[1] }>, Overlap) -> True
    """
    if isinstance(node, cls):
        return True
    if isinstance(node, tuple):
        return any(contains(n, cls) for n in node)
    if isinstance(node, Node):
        return any(contains(getattr(node, f.name), cls) for f in fields(node))
    return False
