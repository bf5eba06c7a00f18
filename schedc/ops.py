"""The op and instruction kinds, and the one rule of what feeds what.

Every pass, the lowering, the checks and the runtime ask this module; none writes the rule again
(tests/test_ops.py greps the tree for a second copy).

    F(s, i) feeds F(s+1, i)           its activation, a SEND_F / RECV_F message when s+1 is on another rank
    B(s, i), I(s, i) feed s-1         the input gradient, SEND_B / RECV_B
    B(s, i), I(s, i) wait for F(s, i) their own forward; W(s, i) waits for I(s, i) (same stage, no message)

A message is named by the stage that produced it: SEND_F stage=1 goes from stage 1 to stage 2, and
RECV_F stage=1 is posted by the rank of stage 2.

Kinds are str Enums whose text, hash and equality are the code's own ("F" == OpKind.F, f"{OpKind.F}" is
"F"), so plain strings read from a plan or built by elaboration compare and look up alike.
"""
from __future__ import annotations

from enum import Enum


class _Code(str, Enum):
    """A str Enum that formats, hashes and compares as its code (hashing stays in C)."""

    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__


class OpKind(_Code):
    """The built-in compute ops of a (stage, microbatch); anything else is a user task."""

    F = "F"  # forward
    B = "B"  # full backward
    I = "I"  # noqa: E741 - backward for the input gradient (split backward)
    W = "W"  # backward for the weight gradient (split backward)
    R = "R"  # recompute: with `recompute F`, the forward run again before its backward, for the state it dropped
    O = "O"  # noqa: E741 - offload: with `offload F`, a forward's saved state copied to host memory (the copy engine)
    L = "L"  # reload: the offloaded state copied back before its backward (the copy engine)


class Opcode(_Code):
    """The built-in instruction kinds of a plan; anything else in a plan is a user task."""

    F = "F"
    B = "B"
    I = "I"  # noqa: E741 - the papers' name for the input-gradient half of B
    W = "W"
    R = "R"  # recompute a forward's saved state (placed by the schedule, between its F and its backward)
    O = "O"  # noqa: E741 - offload a forward's saved state to host memory, on the rank's copy stream
    L = "L"  # reload it to the device, on the copy stream, before the backward that reads it
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    SYNC_GRAD = "SYNC_GRAD"
    STEP = "STEP"
    OVERLAP_F_B = "OVERLAP_F_B"  # a forward and a backward run as one instruction (its two halves)
    # Collectives an op issues inside the step (declared after the op, over `group`): the expert-parallel
    # all-to-alls of an MoE layer, ZeRO's gathers and reduce-scatters, context parallelism's K/V gathers.
    ALL_TO_ALL = "ALL_TO_ALL"
    ALL_GATHER = "ALL_GATHER"
    REDUCE_SCATTER = "REDUCE_SCATTER"
    ALL_REDUCE = "ALL_REDUCE"


# Groups, as frozensets of plain strings (they test strings read from anywhere, hashed in C).
BUILTIN = frozenset(k.value for k in OpKind)               # F, B, I, W, R, O, L
COPY = frozenset({OpKind.O.value, OpKind.L.value})         # the ops a device's copy engine runs, beside compute
GRADIENT = frozenset({OpKind.B.value, OpKind.I.value})     # the ops that send an input gradient upstream
COMPUTE = frozenset(k.value for k in OpKind)               # compute instructions
SENDS = frozenset({Opcode.SEND_F.value, Opcode.SEND_B.value})
RECVS = frozenset({Opcode.RECV_F.value, Opcode.RECV_B.value})
COMM = SENDS | RECVS
LINKED = frozenset({OpKind.F.value}) | GRADIENT               # the ops whose output goes to another stage
SPLIT = frozenset({OpKind.I.value, OpKind.W.value})        # the halves of a split backward
# the collectives an op declares (plan version 2); SYNC_GRAD is the gradients' all-reduce of a replicated stage
DECLARED = frozenset({Opcode.ALL_TO_ALL.value, Opcode.ALL_GATHER.value, Opcode.REDUCE_SCATTER.value,
                      Opcode.ALL_REDUCE.value})
COLLECTIVE = DECLARED | {Opcode.SYNC_GRAD.value}
NOT_COMPUTE = COMM | COLLECTIVE | {Opcode.STEP.value}

MAX_COST = 1e15  # per op, message or memory effect: 2e6 ops of it sum to 2e21, far from overflow


def in_cost_range(value: float, positive: bool = False) -> bool:
    """The one range rule for a cost, latency or memory effect, declared or measured: a finite number
    >= 0 (> 0 where `positive`) and at most MAX_COST, so that sums over a schedule stay finite. NaN
    fails it."""
    return (value > 0 if positive else value >= 0) and value <= MAX_COST


def cost_range(positive: bool = False) -> str:
    """in_cost_range in words, for every message that refuses a value by it."""
    return f"a finite number {'>' if positive else '>='} 0 and at most {MAX_COST:g}"


DEFAULT_COSTS = {OpKind.F.value: 1.0, OpKind.B.value: 2.0, OpKind.I.value: 1.0, OpKind.W.value: 1.0}
RELEASES = frozenset({OpKind.B.value, OpKind.W.value})  # what frees a forward's activation (one per backward)
OVERLAP = "FB"  # the cost kind of an overlapped forward + backward (`F & B`), by default their sum
MIXED_KINDS = (OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value)  # `backward mixed`: all four,
# of which a program runs F and either B or I and W per (stage, microbatch)


def absent_kind(kind: str, kinds, split: bool) -> str:
    """Why `kind`, named by a cost (declared or measured) or a queue, is none of a schedule's `kinds`
    (split: its backward is split into I and W): one wording for every front end."""
    if kind == OpKind.B and split:
        return "this schedule splits its backward: B does not run (give I and W)"
    if kind in SPLIT:
        return "I and W run only with a split backward ('backward split' or 'backward mixed')"
    if kind == OVERLAP:
        return "no program overlaps a forward and a backward (F & B)"
    if kind == OpKind.R:
        return "this schedule's forwards keep their state: R recomputes only after 'recompute F'"
    if kind in COPY:
        return f"this schedule's forwards keep their state on the device: {kind} copies only after 'offload F'"
    return f"unknown kind '{kind}' (kinds: {', '.join(sorted(kinds))})"


def builtin_kinds(split: bool, recompute: bool = False) -> tuple[str, ...]:
    """The built-in ops every (stage, microbatch) has: F, I, W with a split backward, else F, B; with
    `recompute F` an R after the F."""
    first = (OpKind.F.value, OpKind.R.value) if recompute else (OpKind.F.value,)
    return (*first, OpKind.I.value, OpKind.W.value) if split else (*first, OpKind.B.value)


def gradient_kind(split: bool) -> str:
    """The op whose output is a stage's input gradient: I with a split backward, else B."""
    return OpKind.I.value if split else OpKind.B.value


def release_kind(split: bool) -> str:
    """The op that frees a forward's activation: W with a split backward, else B."""
    return OpKind.W.value if split else OpKind.B.value


# The link rule --------------------------------------------------------------------------------------

# kind -> (the step from the producing stage to the consuming one, the message's send and receive)
_LINKS = {OpKind.F.value: (1, Opcode.SEND_F.value, Opcode.RECV_F.value),
          OpKind.B.value: (-1, Opcode.SEND_B.value, Opcode.RECV_B.value),
          OpKind.I.value: (-1, Opcode.SEND_B.value, Opcode.RECV_B.value)}
# a message opcode -> the kind its tensor is named by in a rank's buffers and in a message ("F" or "B")
_CARRIES = {Opcode.SEND_F.value: OpKind.F.value, Opcode.RECV_F.value: OpKind.F.value,
            Opcode.SEND_B.value: OpKind.B.value, Opcode.RECV_B.value: OpKind.B.value}


def feeds(kind: str, stage: int) -> int | None:
    """The stage that consumes the output of `kind` at `stage` (stage + 1 for F, stage - 1 for B and
    I), or None for an op whose output stays on its stage (W, tasks). The stage may be out of range:
    the last stage's F and the first stage's B feed nothing."""
    link = _LINKS.get(kind)
    return None if link is None else stage + link[0]


def message(kind: str) -> tuple[str, str] | None:
    """(send, receive) opcodes of the message that carries the output of `kind` to another rank."""
    link = _LINKS.get(kind)
    return None if link is None else link[1:]


def carries(opcode: str) -> str:
    """The kind a message's tensor is named by: F for SEND_F/RECV_F, B for SEND_B/RECV_B (a B and an I
    both send the input gradient)."""
    return _CARRIES[opcode]


def link_ends(opcode: str, stage: int) -> tuple[int, int]:
    """(producing stage, consuming stage) of a message named by its producing stage."""
    return stage, stage + _LINKS[_CARRIES[opcode]][0]


def own_stage(opcode: str, stage: int) -> int:
    """The stage held by the rank that issues a message instruction: the producer for a send, the
    consumer for a receive."""
    return link_ends(opcode, stage)[opcode in RECVS]


def peer_stage(opcode: str, stage: int) -> int:
    """The stage at the other end of a message instruction."""
    return link_ends(opcode, stage)[opcode in SENDS]


# a built-in op -> the op of its own (stage, microbatch) that must have run before it
_AFTER = {OpKind.B.value: OpKind.F.value, OpKind.I.value: OpKind.F.value, OpKind.W.value: OpKind.I.value,
          OpKind.R.value: OpKind.F.value, OpKind.O.value: OpKind.F.value, OpKind.L.value: OpKind.O.value}


def follows(kind: str, recompute: bool = False, offloaded: bool = False) -> str | None:
    """The op of the same stage and microbatch that must run first: F for B, I, R and O, O for L, I for W;
    None for F and tasks. With `recompute F` a forward drops its state and B and I read what R rebuilt:
    R; when the forward's state was offloaded (an O and an L placed for it), what L brought back: L."""
    if offloaded and kind in GRADIENT:
        return OpKind.L.value
    if recompute and kind in GRADIENT:
        return OpKind.R.value
    return _AFTER.get(kind)


def fed_by(kind: str, stage: int) -> tuple[str, int] | None:
    """(kind, stage) of the neighbouring op whose output an op reads, in the tensor's name (F or B):
    F(s) reads F(s-1)'s activation, B(s) and I(s) the gradient of s+1. None for W and tasks. As
    with `feeds`, the stage may be out of range (the first F and the last B read no neighbour)."""
    if kind == OpKind.F.value:
        return kind, stage - 1
    if kind in GRADIENT:
        return OpKind.B.value, stage + 1
    return None


def builtin_deps(kind: str, stage: int, stages: int, split: bool,
                 recompute: bool = False, offloaded: bool = False) -> tuple[tuple[str, int], ...]:
    """(kind, stage) of the ops a built-in op waits for, in this order: for B and I their own forward,
    for W its I; then the neighbour that feeds it, when that stage exists. `split` says whether that
    neighbour's backward is split (with a mixed backward the schedule's choice for it, see ir.Dependencies);
    `recompute`: whether forwards drop their state for an R to rebuild; `offloaded`: whether this op's
    forward state went to host memory (its backward reads it after the L).

        F(2) -> F(1);  B(1) of 3 stages -> F(1), B(2);  I(2) of 3 -> F(2);  W(1) -> I(1)
        recompute: R(1) -> F(1);  B(1) of 3 -> R(1), B(2)
        offloaded: O(1) -> F(1);  L(1) -> O(1);  B(1) of 3 -> L(1), B(2)
    """
    before = follows(kind, recompute, offloaded)
    own = () if before is None else ((before, stage),)
    producer = fed_by(kind, stage)
    if producer is None or not 0 <= producer[1] < stages:
        return own
    name, s = producer
    return (*own, (gradient_kind(split) if name == OpKind.B.value else name, s))


# Sequence chunks (Seq1F1B) ----------------------------------------------------------------------------

# With `microbatches m chunks k` every microbatch i is cut into k sequence chunks j, and an op's
# microbatch slot holds its unit i * k + j (the IR, the checks and the plan count units; `unit_of` and
# `split_unit` are the one conversion). Chunk j's forward attends to the keys and values of chunks < j
# on its stage, so a microbatch's forwards run in chunk order and its backwards in reverse.

def unit_of(mb: int, chunk: int, chunks: int) -> int:
    """The unit of chunk `chunk` of microbatch `mb`: mb * chunks + chunk."""
    return mb * chunks + chunk


def split_unit(unit: int, chunks: int) -> tuple[int, int]:
    """(microbatch, chunk) of a unit."""
    return divmod(unit, chunks)


def chunk_step(kind: str, chunk: int, chunks: int) -> int | None:
    """The unit offset of the op of the same stage, microbatch and kind family that a built-in op of
    sequence chunk `chunk` waits for: F of chunk j waits for F of chunk j-1 (-1: it reads their keys
    and values); B and I of chunk j for the backward of chunk j+1 (+1: that one accumulated the
    gradient of j's keys and values). None for the first forward, the last backward, W and tasks.

        chunks 3: F chunk 0 -> None, F chunk 2 -> -1, B chunk 0 -> +1, B chunk 2 -> None
    """
    if kind == OpKind.F.value:
        return -1 if chunk > 0 else None
    if kind in GRADIENT:
        return 1 if chunk < chunks - 1 else None
    return None


# The text form ---------------------------------------------------------------------------------------

def label(code: str, stage: int | None = None, mb: int | None = None, peer: int | None = None,
          part: int = 0, parts: int | None = 1, halves: tuple[str, str] | None = None) -> str:
    """The one compact text of an op or instruction, as diagnostics, grids and drawings show it:
    F(1,2), W(0,3), curvature(1)[2/4] (part 2 of 4), SEND_F(0,3)>1 (to rank 1), RECV_B(2,0)<2 (from
    rank 2), SYNC_GRAD(1), STEP; a built-in op of k sequence chunks (parts=k, mb its unit) by
    microbatch.chunk, F(1,3.1); an overlapped op or OVERLAP_F_B instruction by the labels of its
    halves, in their order: F(0,3) & B(7,1). A rank's plan text (rank*.txt) is the parseable
    `Instr.__str__`."""
    if halves is not None:
        return " & ".join(halves)
    if code in BUILTIN and parts is not None and parts > 1 and mb is not None:  # a unit of sequence chunks
        return f"{code}({stage},{mb // parts}.{mb % parts})"
    args = "" if stage is None else f"({stage})" if mb is None else f"({stage},{mb})"
    if peer is not None and code in SENDS:
        return f"{code}{args}>{peer}"
    if peer is not None and code in RECVS:
        return f"{code}{args}<{peer}"
    return f"{code}{args}[{part + 1}/{parts}]" if parts is not None and parts > 1 else code + args
