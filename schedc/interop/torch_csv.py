"""torch.distributed.pipelining's compute-only CSV schedule: import to a Schedule, export from one.

Row r is rank r's order; a cell is `<stage><kind><microbatch>` (`2F0`, `3B1`, `0I2`, `0W2`), an empty
cell an idle slot. `REDUCE_GRAD`, `UNSHARD` and `RESHARD` cells (torch adds them) are not compute and
are skipped. A `(0F7;7B3)OVERLAP_F_B` cell is an overlapped op: its forward and its backward run as
one (Schedule.fused). B, I and W may be mixed: a stage and microbatch whose backward shows as I (and W)
runs it split, the others whole (a mixed backward, as torch's DualPipeV).

    2F0,2F1,2B0,2B1        ->   Schedule(orders=((F(2,0), F(2,1), B(2,0), B(2,1)), ...), ...)

Import keeps the CSV order exactly and infers the sizes: stages = the largest stage + 1, microbatches
= the count of distinct forwards most stages agree on (so one stray `3F8` is reported as out of
range at its cell, not taken as a ninth microbatch), stage s on the rank that runs most of its ops.
Every op carries its cell's line:column, so checks point into the CSV. Export refuses what torch
cannot represent.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ..frontend.parse import read_source
from ..diagnostics import SCHEDULE, USAGE, Diagnostic, SchedError, Source, Span, error
from ..frontend.elaborate import MAX_DEVICES, MAX_OPS
from ..ir import Dependencies, Op, Pipeline, Schedule
from ..ops import BUILTIN, DEFAULT_COSTS, GRADIENT, MIXED_KINDS, OVERLAP, SPLIT, Opcode, OpKind, builtin_kinds
from ..text import MAX_SHOWN, plural

CELL = re.compile(r"(\d+)(F|B|I|W)(\d+)")
UNSHARD, RESHARD, REDUCE_GRAD = "UNSHARD", "RESHARD", "REDUCE_GRAD"  # torch's FSDP and gradient-reduction cells
ACTION_KINDS = frozenset({UNSHARD, RESHARD, REDUCE_GRAD})
ACTIONS = re.compile(rf"(\d+)({'|'.join(sorted(ACTION_KINDS))})")
COMMS = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d+)")
OVERLAP_CELL = re.compile(r"\((.*)\)OVERLAP_F_B")
Cell = tuple[str, int, int, Span, bool]  # kind, stage, microbatch, where, overlapped with the next cell
MAX_DIGITS = 9          # a stage or microbatch number of more digits is refused where it is written
MAX_RANKS = MAX_DEVICES  # rows; a row is a rank, and every pass keeps something per rank


def schedule_from_csv(path, options=None) -> Schedule:
    """Read a torch CSV file into a Schedule (one pipeline, no replicas, default costs F=1, B=2).
    Unreadable files and bad cells raise SchedError with exit code 2, every bad cell located."""
    return schedule_from_csv_text(read_source(path), options)


def schedule_from_csv_text(source: Source, options=None) -> Schedule:
    rows = [[cell for cell in row if cell[0] in BUILTIN] for row in parse_csv(source, comms=True)]
    overrides = dict(getattr(options, "overrides", None) or {})
    microbatches = _microbatch_count(rows, overrides, source)
    cells = [cell for row in rows for cell in row]
    if not cells:  # message cells only (compute_comms without its compute)
        raise SchedError(error("no compute cells: only message cells (SEND_F, RECV_B, ...); a compute_comms "
                               "CSV holds the ranks' F, B, I and W cells too, like 0F0,0SEND_F0", Span(1, 1)),
                         source, kind=USAGE)
    kinds_seen = {kind for kind, *_ in cells}
    mixed = OpKind.B.value in kinds_seen and bool(kinds_seen & SPLIT)
    split = not mixed and bool(kinds_seen & SPLIT)
    stages = max(cell[1] for cell in cells) + 1
    _check_size(cells, stages, microbatches, 3 if mixed else len(builtin_kinds(split)), "m" in overrides,
                getattr(options, "max_ops", None) or MAX_OPS, source)
    placement = infer_placement(rows, stages)
    if getattr(options, "measured", None) is not None:  # measured costs give the kinds the CSV runs, no other
        from .profiles import check_measured_kinds
        fused_cells = any(cell[4] for cell in cells)
        kinds = [kind for kind in MIXED_KINDS if kind in kinds_seen]
        check_measured_kinds(options.measured, options.costs, kinds + [OVERLAP] * fused_cells, kinds, split or mixed)
    costs = _costs(getattr(options, "costs", None) or {}, stages, source)
    pipe = Pipeline("main", stages, placement, tuple(range(microbatches)), Span(1, 1, 1, 2))
    orders = tuple(tuple(Op(kind, s, mb, 0, 0, r, costs[kind][s], where) for kind, s, mb, where, _ in row)
                   for r, row in enumerate(rows))
    fused = tuple((order[n], order[n + 1]) for order, row in zip(orders, rows)
                  for n, cell in enumerate(row) if cell[4])
    split_of = frozenset((0, s, mb) for kind, s, mb, *_ in cells if kind == OpKind.I) if mixed else None
    grid = tuple(Op(kind, s, mb, 0, 0, placement[s], costs[kind][s]) for s in range(stages)
                 for mb in range(microbatches)
                 for kind in builtin_kinds(split if split_of is None else (0, s, mb) in split_of))
    deps = Dependencies((pipe,), costs, split if split_of is None else split_of, {}, grid)
    name = re.sub(r"\W", "_", Path(source.path).stem) or "torch_csv"
    return Schedule(name=name, description=f"imported from torch CSV {Path(source.path).name}", source=source,
                    params={"p": len(rows), "m": microbatches}, devices=len(rows), pipelines=(pipe,), replicas=(),
                    orders=orders, deps=deps, costs=costs, activation=(1.0,) * stages, memory_limit=None,
                    memory_limit_span=None, split_backward=split, split_of=split_of, fused=fused)


def _check_size(cells: list[Cell], stages: int, microbatches: int, kinds: int, given_m: bool, max_ops: int,
                source: Source) -> None:
    """The schedule a CSV implies (every stage x microbatch x kind, whether or not a cell runs it) must
    stay within the expansion limit; refused before anything that size is built, at the cell with the
    largest stage or microbatch (or naming -D m)."""
    implied = stages * microbatches * kinds
    if implied <= max_ops:
        return
    why = f"{stages:,} stages x {microbatches:,} microbatches x {kinds} kinds = {implied:,} ops, more than {max_ops:,}"
    if given_m and microbatches * kinds > max_ops // max(1, stages) and microbatches > stages:
        raise SchedError(error(f"-D m={microbatches}: the schedule would expand to {why}; refusing"), source,
                         kind=USAGE)
    by_stage = stages >= microbatches
    kind, stage, mb, span, *_ = max(cells, key=(lambda c: c[1]) if by_stage else (lambda c: c[2]))
    what = f"stage {stage}" if by_stage else f"microbatch {mb}"
    raise SchedError(error(f"{what} makes the schedule expand to {why}; refusing", span), source, kind=USAGE)


def parse_csv(source: Source, comms: bool = False) -> list[list[Cell]]:
    """Rows of compute cells with their spans (and, with `comms`, the SEND_F / RECV_F / SEND_B / RECV_B
    cells of torch's compute_comms format, kind = the opcode); every bad cell is reported (exit 2), the
    first MAX_SHOWN one by one and the rest counted."""
    lines = source.text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) > MAX_RANKS:
        raise SchedError(error(f"{len(lines):,} rows: a torch CSV schedule has one row per rank, at most "
                               f"{MAX_RANKS:,}", Span(MAX_RANKS + 1, 1, MAX_RANKS + 1, 2)), source, kind=USAGE)
    rows, diags = [], []
    for number, line in enumerate(lines, 1):
        row = []
        for column, text in split_line(line.rstrip("\r"), number, diags):
            span = Span(number, column, number, column + max(1, len(text)))
            message = (COMMS.fullmatch(text.strip()) or ACTIONS.fullmatch(text.strip())) if comms else None
            row.extend(_comm_cell(message, _stripped(text, span)) if message else _cell(text, span, diags))
        rows.append(row)
    if not diags and not any(rows):
        diags.append(error("no compute cells: expected rows of cells like 0F0,0B0 (one row per rank)",
                           Span(1, 1, 1, 2)))
    if len(diags) > MAX_SHOWN:
        rest = len(diags) - MAX_SHOWN
        diags = diags[:MAX_SHOWN] + [error(f"and {plural(rest, 'more bad cell')} like these",
                                           diags[MAX_SHOWN].span)]
    if diags:
        raise SchedError(diags, source, kind=USAGE)
    return rows


def split_line(line: str, number: int, diags: list[Diagnostic]) -> list[tuple[int, str]]:
    """Split one CSV line into (1-based column, cell text); double-quoted cells may hold commas."""
    out, n = [], len(line)
    start = 0
    while start <= n:
        if start < n and line[start] == '"':
            end = start + 1
            text = []
            while end < n and not (line[end] == '"' and line[end + 1:end + 2] != '"'):
                text.append(line[end])
                end += 2 if line[end] == '"' else 1
            if end >= n:
                diags.append(error("unterminated quoted cell", Span(number, start + 1, number, start + 2)))
                return out
            out.append((start + 2, "".join(text)))
            start = end + 1
            if start < n and line[start] != ",":
                diags.append(error("expected ',' after a quoted cell", Span(number, start + 1, number, start + 2)))
                return out
            start += 1
            continue
        end = line.find(",", start)
        end = n if end < 0 else end
        out.append((start + 1, line[start:end]))
        start = end + 1
    return out


def _stripped(text: str, span: Span) -> Span:
    """The span of a cell's text without its surrounding spaces."""
    offset = len(text) - len(text.lstrip())
    if not offset:
        return span
    return Span(span.line, span.column + offset, span.line, span.column + offset + len(text.strip()))


def _cell(text: str, span: Span, diags: list[Diagnostic]) -> list[Cell]:
    stripped = text.strip()
    span = _stripped(text, span)
    if not stripped or ACTIONS.fullmatch(stripped):
        return []
    match = CELL.fullmatch(stripped)
    if match:
        stage, mb = match.group(1), match.group(3)
        if max(len(stage), len(mb)) > MAX_DIGITS:
            which = "stage" if len(stage) > MAX_DIGITS else "microbatch"
            diags.append(error(f"bad cell {stripped[:24]!r}{'...' * (len(stripped) > 24)}: the {which} number "
                               f"has more than {MAX_DIGITS} digits", span))
            return []
        return [(match.group(2), int(stage), int(mb), span, False)]
    overlap = OVERLAP_CELL.fullmatch(stripped)
    if overlap:
        if "(" in overlap.group(1) or ")" in overlap.group(1):
            diags.append(error(f"bad cell {stripped[:24]!r}{'...' * (len(stripped) > 24)}: an OVERLAP_F_B cell "
                               "holds compute cells (a;b), not another OVERLAP_F_B", span))
            return []
        return _overlap(overlap.group(1), span, diags)
    if COMMS.fullmatch(stripped):
        why = "communication cells belong to torch's compute_comms format"
    elif any(word in stripped for word in ACTION_KINDS):
        why = "torch's UNSHARD, RESHARD and REDUCE_GRAD cells are <stage><action>, e.g. 0UNSHARD"
    else:
        why = "expected <stage><F|B|I|W><microbatch>, e.g. 2F0"
    shown = stripped if len(stripped) <= 24 else stripped[:24] + "..."  # a cell may hold a whole row
    diags.append(error(f"bad cell {shown!r}: {why}", span))
    return []


def _comm_cell(match: re.Match, span: Span) -> list[Cell]:
    """A message cell (2SEND_F0) or one of torch's actions (0UNSHARD: its microbatch -1)."""
    stage, opcode, mb = (match.groups() + ("",))[:3]
    return [(opcode, int(stage), int(mb) if mb else -1, span, False)]


def _overlap(inner: str, span: Span, diags: list[Diagnostic]) -> list[Cell]:
    """The two halves of an OVERLAP_F_B cell in the cell's order, the first marked as overlapped."""
    halves = [cell for part in inner.split(";") for cell in _cell(part, span, diags)]
    kinds = sorted(cell[0] for cell in halves)
    if len(halves) != 2 or kinds[1] != OpKind.F or kinds[0] not in GRADIENT:
        diags.append(error(f"bad cell '({inner})OVERLAP_F_B': an overlapped op holds one forward and one "
                           "backward (B or I), e.g. (0F7;7B3)OVERLAP_F_B", span))
        return []
    return [halves[0][:4] + (True,), halves[1]]


def _microbatch_count(rows: list[list[Cell]], overrides: dict[str, str], source: Source) -> int:
    """-D m=N if given; else the count of distinct forwards that most stages agree on (so a shifted or
    stray microbatch, 0F0,0F1,0F3, is out of range at its cell rather than taken as a fourth)."""
    unknown = sorted(set(overrides) - {"m"})
    if unknown:
        raise SchedError(error(f"unknown param '{unknown[0]}' given with -D (a torch CSV takes only m, the "
                               "microbatch count)"), source, kind=USAGE)
    if "m" in overrides:
        try:
            value = int(overrides["m"])
        except ValueError:
            value = 0
        if value < 1:
            raise SchedError(error(f"-D m={overrides['m']}: the microbatch count must be a positive integer"),
                             source, kind=USAGE)
        return value
    forwards: dict[int, set[int]] = {}
    for row in rows:
        for kind, stage, mb, *_ in row:
            if kind == OpKind.F:
                forwards.setdefault(stage, set()).add(mb)
    votes = Counter(len(mbs) for mbs in forwards.values())
    return max(votes.items(), key=lambda item: (item[1], -item[0]))[0] if votes else 1


def infer_placement(rows: list[list[Cell]], stages: int) -> tuple[int, ...]:
    """Stage s on the rank that runs most of its ops (the lowest such rank); a stage nobody runs goes
    to s % ranks, torch's default loop placement."""
    counts: dict[int, Counter] = {}
    for r, row in enumerate(rows):
        for _, stage, *_ in row:
            counts.setdefault(stage, Counter())[r] += 1
    return tuple(max(counts[s].items(), key=lambda item: (item[1], -item[0]))[0] if s in counts
                 else s % len(rows) for s in range(stages))


def _costs(given: dict, stages: int, source: Source) -> dict[str, tuple[float, ...]]:
    table = {kind: (value,) * stages for kind, value in DEFAULT_COSTS.items()}
    for kind, value in given.items():
        values = (float(value),) * stages if isinstance(value, (int, float)) else tuple(map(float, value))
        if len(values) != stages:
            raise SchedError(error(f"measured costs for {kind} have {len(values)} stages, the CSV has {stages}"),
                             source, kind=USAGE)
        table[kind] = values
    return table


# Export -----------------------------------------------------------------------------------------

def export_csv(schedule: Schedule) -> str:
    """The schedule's per-rank orders as torch's compute-only CSV (no idle cells). Refuses, with
    SchedError (exit code 1), what torch's format cannot hold: several pipelines or replicated
    stages (Chimera), and ops other than F, B, I, W."""
    refusal = _unrepresentable(schedule)
    if refusal:
        tasks = [spec.span for spec in schedule.tasks if spec.span is not None]
        at = tasks[0] if tasks and refusal.startswith(_TASKS) else (
            schedule.pipelines[-1].span if schedule.pipelines else None)  # the first task's declaration
        raise SchedError(error(refusal, at), schedule.source, kind=SCHEDULE)
    fused = {id(f): b for f, b in schedule.fused}
    second = {id(b) for b in fused.values()}
    rows = []
    for order in schedule.orders:
        cells = [_action(op) if id(op) not in fused else _overlap_cell(_action(op), _action(fused[id(op)]))
                 for op in order if id(op) not in second]
        rows.append(",".join(cells) + "\n")
    return "".join(rows)


def _action(op: Op) -> str:
    return f"{op.stage}{op.kind}{op.mb}"


def _overlap_cell(first: str, second: str) -> str:
    """torch's cell of an overlapped pair, its halves in their order: (0F7;7B3)OVERLAP_F_B."""
    return f"({first};{second}){Opcode.OVERLAP_F_B.value}"


_TASKS = "torch's CSV schedule holds only F, B, I and W; this schedule also runs the tasks"


def _unrepresentable(schedule: Schedule) -> str | None:
    if len(schedule.pipelines) > 1 or schedule.replicas:
        names = ", ".join(f"'{p.name}'" for p in schedule.pipelines)
        return (f"torch's CSV schedule cannot represent this schedule: it has {len(schedule.pipelines)} pipelines "
                f"({names}) holding replicated stages, and torch.distributed.pipelining runs one pipeline in "
                "which every stage has one rank")
    tasks = sorted({op.kind for step in schedule.steps for order in step for op in order if op.is_task}
                   | {op.kind for op in schedule.unplaced})
    if tasks:
        return f"{_TASKS} {', '.join(tasks)}"
    if schedule.chunks > 1:
        return (f"torch's CSV schedule cannot represent sequence chunks: this schedule cuts every microbatch "
                f"into {schedule.chunks} (its actions name a stage and a microbatch only)")
    placed = sorted({op.kind for op in schedule.ops()} - _TORCH_KINDS)
    if placed:
        return (f"torch's CSV schedule cannot represent {', '.join(placed)} ops (torch.distributed.pipelining "
                "has no placed recompute, offload or reload action)")
    return None


_TORCH_KINDS = frozenset({OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value})
