"""torch.distributed.pipelining's compute_comms CSV: a rank's whole program, as torch's runtime runs it.

Beside the compute cells of the compute-only format (torch_csv) a row holds the messages
(`0SEND_F1`, `1RECV_F1`, ...) and torch's three actions, which its own lowering of a compute-only CSV
adds and which its runtime needs, for torch does not add them to a compute_comms CSV:

    UNSHARD   `1UNSHARD`: all-gather stage 1's FSDP-sharded weights before it computes (a no-op
              without FSDP). torch prefetches the next FSDP_PREFETCH distinct stages of the row.
    RESHARD   `1RESHARD`: free them again when stage 1 leaves that window, and at the row's end.
    REDUCE_GRAD `1REDUCE_GRAD`: right after the stage's last backward (the m-th B or W): gradients
              divided by m under `scale_grads=True`, and FSDP's reduce-scatter over data parallelism.

Without REDUCE_GRAD torch's runtime never scales the gradients, which then come out m times too
large under its default `scale_grads=True`; without UNSHARD an FSDP stage fails at its first
forward. `torch_actions` is the one rule that places them, used by the export and by the check of an
imported CSV (`check_torch_actions`).

    0F0,0SEND_F0,0F1,0SEND_F1,1RECV_B0,0B0,...   ->   0UNSHARD,0F0,0SEND_F0,...,0B1,0REDUCE_GRAD,0RESHARD
"""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter

from ..diagnostics import SCHEDULE, Diagnostic, SchedError, Source, Span, error, warning
from ..ir import Schedule
from ..ops import BUILTIN, COMM, SENDS, Opcode, OpKind, carries, fed_by, feeds
from ..plan import Instr, Plan
from .torch_csv import ACTION_KINDS, MAX_SHOWN, REDUCE_GRAD, RESHARD, UNSHARD, Cell, _overlap_cell, parse_csv
from ..text import agree

FSDP_PREFETCH = 3  # stages kept unsharded ahead: torch's _add_unshard_reshard(max_active_stages=3)
REDUCING = frozenset({OpKind.B.value, OpKind.W.value})  # the backward ops torch counts to the last one

Unit = tuple[tuple[int, str], ...]  # a compute cell's (stage, kind) halves: one, or two when overlapped


def torch_actions(units: list[Unit], microbatches: int,
                  reshard_after_forward: bool | None = None) -> list[tuple[list[str], list[str]]]:
    """For each compute cell of a rank's row, in order, the actions torch runs (before it, after it):
    RESHARD of the unsharded stages that are not among the next FSDP_PREFETCH distinct stages from this
    cell on, UNSHARD of those that are not yet unsharded (in the order they come), and REDUCE_GRAD of a
    stage after its m-th B or W. The stages still unsharded at the row's end are resharded after its
    last cell (ascending). The window is found from each stage's next cell, so a row of n cells over S
    stages costs n·S, not n². With `reshard_after_forward` given, the window is the zero-3 runtime's
    instead (schedc/runtime/model/zero.py): True, a cell's own stages, unsharded before it and resharded after
    it; False, every stage from its first cell to the row's end."""
    positions: dict[int, list[int]] = {}
    for n, unit in enumerate(units):
        for stage, _ in unit:
            positions.setdefault(stage, []).append(n)
    active: list[int] = []
    backwards: Counter = Counter()
    out = []
    for n, unit in enumerate(units):
        window = _window(n, units, positions) if reshard_after_forward is None else \
            _own(unit, active if reshard_after_forward is False else [])
        before = [f"{s}{RESHARD}" for s in sorted(s for s in active if s not in window)]
        active = [s for s in active if s in window]
        before += [f"{s}{UNSHARD}" for s in window if s not in active]
        active += [s for s in window if s not in active]
        after = []
        for stage, kind in unit:
            if kind in REDUCING:
                backwards[stage] += 1
                if backwards[stage] == microbatches:
                    after.append(f"{stage}{REDUCE_GRAD}")
        if reshard_after_forward:
            after += [f"{s}{RESHARD}" for s in active]
            active = []
        if n == len(units) - 1:
            after += [f"{s}{RESHARD}" for s in sorted(active)]
        out.append((before, after))
    return out


def _own(unit: Unit, kept: list[int]) -> list[int]:
    """The stages held while a cell runs under the zero-3 runtime's rule: those kept so far, then the
    cell's own (in its order)."""
    return kept + [stage for stage, _ in unit if stage not in kept]


def _window(n: int, units: list[Unit], positions: dict[int, list[int]]) -> list[int]:
    """The next FSDP_PREFETCH distinct stages from cell n on, in the order their cells come (an
    overlapped cell's two halves in its order), stopping at the cell that reaches the count."""
    upcoming = sorted({row[i] for row in positions.values() for i in [bisect_left(row, n)] if i < len(row)})
    window: list[int] = []
    for at in upcoming:
        for stage, _ in units[at]:
            if stage not in window:
                window.append(stage)
        if len(window) >= FSDP_PREFETCH:
            break
    return window


# Export ---------------------------------------------------------------------------------------------

def export_comms_csv(plan: Plan, reshard_after_forward: bool | None = None) -> str:
    """A one-step plan's rank streams as torch's compute_comms CSV: compute cells (an OVERLAP_F_B as
    torch's overlapped cell), SEND_*/RECV_* cells named torch's way (a receive by its receiving stage)
    in the plan's order, which the channel check proved, and torch's UNSHARD, RESHARD and REDUCE_GRAD
    placed by torch_actions (FSDP's where `reshard_after_forward` puts them, as --zero 3 does, when it
    is given); SYNC_GRAD and STEP are left out."""
    if plan.cycle_steps != 1 or len(plan.meta.get("pipelines", ())) != 1:
        raise SchedError(error("torch's compute_comms CSV holds one step program of one pipeline"),
                         Source(plan.meta.get("source", "plan"), ""), kind=SCHEDULE)
    microbatches = len(plan.meta["pipelines"][0]["microbatches"])
    rows = []
    for (program,) in plan.ranks:
        computes = [ins for ins in program if ins.op in BUILTIN or ins.halves is not None]
        actions = iter(torch_actions([tuple((half.stage, half.op) for half in ins.units()) for ins in computes],
                                     microbatches, reshard_after_forward))
        cells = []
        for ins in program:
            if ins.op in BUILTIN or ins.halves is not None:
                before, after = next(actions)
                cells += [*before, _compute_cell(ins), *after]
            elif ins.op in COMM:
                stage = ins.stage if ins.op in SENDS else feeds(carries(ins.op), ins.stage)
                cells.append(f"{stage}{ins.op}{ins.mb}")
        rows.append(",".join(cells) + "\n")
    return "".join(rows)


def _compute_cell(ins: Instr) -> str:
    halves = [f"{half.stage}{half.op}{half.mb}" for half in ins.units()]
    return halves[0] if len(halves) == 1 else _overlap_cell(*halves)


# Import ---------------------------------------------------------------------------------------------

def comms_rows(source: Source) -> list[list[Cell]] | None:
    """The CSV's rows with its message and action cells when it is in torch's compute_comms format
    (it has either), else None."""
    rows = parse_csv(source, comms=True)
    return rows if any(cell[0] in COMM or cell[0] in ACTION_KINDS for row in rows for cell in row) else None


def comms_streams(rows: list[list[Cell]], schedule: Schedule) -> tuple[tuple[tuple[Instr, ...], ...],
                                                                       tuple[tuple[Span, ...], ...]]:
    """A compute_comms CSV's own instruction streams (rows from comms_rows), each ending with STEP,
    and the cell each instruction
    came from (spans[r][n] for streams[r][n]; STEP has none). torch names a send by the stage that
    sends and a receive by the stage that receives (`2RECV_F0` is received by stage 2); a plan names
    both by the producing stage (RECV_F stage=1). An overlapped cell is one OVERLAP_F_B instruction;
    torch's actions are no instructions of a plan (check_torch_actions checks them)."""
    place = schedule.pipelines[0].placement
    streams, spans = [], []
    for row in rows:
        stream, where, first = [], [], None
        for kind, stage, mb, span, overlapped in row:
            if kind in ACTION_KINDS:
                continue
            if kind in BUILTIN and overlapped:  # the first half of an OVERLAP_F_B cell; the next is its second
                first = Instr(kind, stage, mb, 0)
                continue
            if kind in BUILTIN:
                second = Instr(kind, stage, mb, 0)
                stream.append(second if first is None else Instr(Opcode.OVERLAP_F_B.value, halves=(first, second)))
                first = None
            else:
                tensor = carries(kind)
                producer = stage if kind in SENDS else fed_by(tensor, stage)[1]
                peer_stage = feeds(tensor, stage) if kind in SENDS else producer
                peer = place[peer_stage] if 0 <= peer_stage < len(place) else -1
                stream.append(Instr(kind, producer, mb, 0, peer))
            where.append(span)
        stream.append(Instr(Opcode.STEP.value))
        streams.append(tuple(stream))
        spans.append(tuple(where))
    return tuple(streams), tuple(spans)


def check_torch_actions(rows: list[list[Cell]], schedule: Schedule) -> list[Diagnostic]:
    """What torch's runtime asserts or silently gets wrong about a compute_comms CSV's actions, each at
    its cell: a stage's gradients never reduced (no REDUCE_GRAD after its last backward: m times too
    large under scale_grads=True), reduced twice or before its last backward, an action on a stage the
    rank does not hold; and, where the CSV uses FSDP's cells at all, a compute on a stage not unsharded,
    an UNSHARD twice, a RESHARD without an UNSHARD, a stage left unsharded at the end of the step. A CSV
    with none of torch's actions gets one warning (it runs only without FSDP, and its gradients are
    never scaled or reduced)."""
    m = schedule.microbatches
    place = schedule.pipelines[0].placement
    diags: list[Diagnostic] = []
    uses_fsdp = any(cell[0] in (UNSHARD, RESHARD) for row in rows for cell in row)
    if not any(cell[0] in ACTION_KINDS for row in rows for cell in row):
        return [warning("no UNSHARD, RESHARD or REDUCE_GRAD cells: torch's runtime will neither scale the "
                        f"gradients by 1/m nor reduce them over data parallelism (they come out {m} times too "
                        "large under scale_grads=True), and an FSDP stage fails at its first forward; "
                        "`schedc export --format torch-comms` writes them", Span(1, 1, 1, 2))]
    for rank, row in enumerate(rows):
        diags += _check_row(rank, row, m, place, uses_fsdp)
    if len(diags) > MAX_SHOWN:
        rest = len(diags) - MAX_SHOWN
        diags = diags[:MAX_SHOWN] + [error(f"and {rest:,} more errors in torch's actions like these",
                                           diags[MAX_SHOWN].span)]
    return diags


def _check_row(rank: int, row: list[Cell], m: int, place: tuple[int, ...], uses_fsdp: bool) -> list[Diagnostic]:
    diags = []
    backwards: Counter = Counter()
    last: dict[int, Span] = {}
    reduced: dict[int, Span] = {}
    unsharded: set[int] = set()
    for kind, stage, mb, span, _ in row:
        if kind in ACTION_KINDS and not (0 <= stage < len(place) and place[stage] == rank):
            diags.append(error(f"{stage}{kind} on rank {rank}: stage {stage} is "
                               + (f"on rank {place[stage]}" if 0 <= stage < len(place) else
                                  f"not a stage of the schedule (stages 0..{len(place) - 1})"), span))
        elif kind == REDUCE_GRAD:
            if stage in reduced:
                diags.append(error(f"{stage}{kind} again: stage {stage}'s gradients were reduced already "
                                   f"(at {reduced[stage].line}:{reduced[stage].column}); torch would scale them "
                                   "twice", span))
            elif backwards[stage] < m:
                diags.append(error(f"{stage}{kind} after {backwards[stage]} of stage {stage}'s {m} backwards: "
                                   "torch reduces and scales the gradients there, so the later backwards' part "
                                   "would be left out", span))
            else:
                reduced[stage] = span
        elif kind == UNSHARD:
            if stage in unsharded:
                diags.append(error(f"{stage}{kind}: stage {stage} is unsharded already (torch asserts "
                                   "'Unsharding the same stage twice')", span))
            unsharded.add(stage)
        elif kind == RESHARD:
            if stage not in unsharded:
                diags.append(error(f"{stage}{kind}: stage {stage} is not unsharded (torch asserts 'Resharding "
                                   "without unsharding')", span))
            unsharded.discard(stage)
        elif kind in BUILTIN:
            if uses_fsdp and stage not in unsharded:
                diags.append(error(f"{stage}{kind}{mb} computes on stage {stage} while its FSDP weights are "
                                   f"sharded: an {stage}{UNSHARD} must come first (torch: 'Attempted to compute "
                                   "on sharded stage')", span))
            if kind in REDUCING:
                backwards[stage] += 1
                last[stage] = span
    for stage, span in sorted(last.items()):
        if stage not in reduced:
            diags.append(error(f"stage {stage}'s gradients are never reduced: a compute_comms CSV needs "
                               f"{stage}{REDUCE_GRAD} after the stage's last backward (here), where torch "
                               f"divides them by m={m} under scale_grads=True and reduces them over data "
                               f"parallelism; without it they come out {m} times too large", span))
    if uses_fsdp and unsharded and row:
        end = row[-1][3]
        names = ", ".join(map(str, sorted(unsharded)))
        diags.append(error(f"rank {rank} ends the step with {agree(len(unsharded), 'stage', 'stages')} {names} unsharded: "
                           f"a RESHARD must follow (torch's next step would unshard {'them' if len(unsharded) > 1 else 'it'} "
                           "twice)", end))
    return diags
