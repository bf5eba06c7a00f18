"""Measured costs: the runtime's costs.json and PipeFisher's profile CSVs, as per-stage cost tables, and
the profile's memory columns as `memory K(s)` in activation units (a costs file's "memory" object).

Measured costs are never mixed with the unit defaults (F=1, B=2, I=W=1) or a schedule's declared
costs: they must give every kind the schedule runs (F, then B or I and W, its tasks), and a costs
file names no other kind (check_measured_kinds; a profile row's K-FAC columns are used only by a
schedule with those tasks)."""
from __future__ import annotations

import csv
import json
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..diagnostics import USAGE, SchedError, Source, Span, error
from ..inputs import MAX_DESCRIPTION_BYTES, load_json, read_source
from ..ops import OVERLAP, OpKind, absent_kind, cost_range, in_cost_range


def read_text(path: str | Path, what: str = "costs") -> str:
    """A profile or costs file's text (through schedc.inputs: a regular file, its size capped), a
    leading byte-order mark dropped (spreadsheets write one)."""
    return read_source(path, what, MAX_DESCRIPTION_BYTES).text


def read_json(path: str | Path, what: str = "costs"):
    """A costs file's JSON value, its nesting and integers capped, errors located (schedc.inputs)."""
    return load_json(read_source(path, what, MAX_DESCRIPTION_BYTES), what)


def _usage(message: str, path: str) -> SchedError:
    return SchedError(error(message), Source(str(path), ""), kind=USAGE)


def _measured(value, what: str, path: str) -> float:
    """A measured figure: a finite number >= 0. Negative, NaN or infinite costs (JSON allows NaN and
    Infinity) and cells that are not numbers are refused, naming the file."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not in_cost_range(number):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise _usage(f"{what} must be {cost_range()}, got {shown}", path)
    return number


_SILENT = ("unit", "microbatch_size", "source", "schedule", "memory")  # keys that name no op kind


def measured_microbatch_size(path: str) -> int | None:
    """The microbatch size a costs file was measured at (the runtime's --profile-out records it as
    "microbatch_size"), or None when it does not say."""
    data = read_json(path)
    value = data.get("microbatch_size") if isinstance(data, dict) else None
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise _usage(f'"microbatch_size" must be a positive integer, got {value!r}', path)
    return value


def load_costs(path: str) -> dict[str, tuple[float, ...] | float]:
    """Read costs: JSON {"F": [per stage...] or number, "B": ..., "<task>": ...} ("unit" is ignored)."""
    if str(path).endswith(".csv"):
        raise _usage("a profile CSV is read with --profile FILE --microbatch-size B, not --costs", path)
    source = read_source(path, "costs", MAX_DESCRIPTION_BYTES)
    text = source.text
    data = load_json(source, "costs")
    if not isinstance(data, dict):
        raise _usage("costs must be a JSON object of op kind to cost", path)
    keys: dict[str, int] = {}  # each top-level key's offset, for the errors at it
    for key, offset in _json_key_offsets(text)[1]:  # JSON keeps the last of a repeated key, unsaid
        if key in keys:
            raise SchedError(error(f"{key!r} is given twice; give each kind once",
                                   _span_at(source, offset, len(key) + 2)), source, kind=USAGE)
        keys[key] = offset
    out = {}
    for kind, value in data.items():
        if kind in _SILENT:
            continue
        try:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[kind] = _measured(value, f"cost of {kind!r}", path)
            elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
                out[kind] = tuple(_measured(v, f"cost of {kind!r} at stage {s}", path) for s, v in enumerate(value))
            else:
                raise _usage(f"cost of {kind!r} must be a number or a list of numbers per stage", path)
        except SchedError as exc:  # at the key
            at = _span_at(source, keys[kind], len(kind) + 2) if kind in keys else None
            raise SchedError(error(exc.diagnostics[0].message, at), source, kind=USAGE) from None
    return out


def load_memory(path: str) -> dict[str, tuple[float, ...] | float]:
    """The "memory" object of a costs file: {"B": units or [per stage], "<task>": ...}; {} without one."""
    if str(path).endswith(".csv"):
        return {}
    data = read_json(path)
    data = data.get("memory", {}) if isinstance(data, dict) else {}
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise _usage('"memory" must be an object of op kind to non-negative activation units', path)
    return {kind: _measured(v, f"memory of {kind!r}", path) for kind, v in data.items()}


def read_profile_memory(path: str, microbatch_size: int | None) -> dict[str, float]:
    """A profile row's memory in activation units (mem_act = 1): B's saved output gradient
    (mem_save_err), and the K-FAC factors with their inverses (mem_kron), half with each curvature task.
    {} when the profile has no mem_act column."""
    row = _profile_row(path, microbatch_size)
    act = _measured(row.get("mem_act") or 0, "profile column mem_act", path)
    if act <= 0:
        return {}
    memory = {}
    if row.get("mem_save_err"):
        memory[OpKind.B.value] = _measured(row["mem_save_err"], "profile column mem_save_err", path) / act
    if row.get("mem_kron"):
        memory["curvature_A"] = memory["curvature_B"] = _measured(row["mem_kron"], "profile column mem_kron",
                                                                  path) / act / 2
    return memory


def read_profile(path: str, microbatch_size: int | None) -> dict[str, float]:
    """One row of a PipeFisher profile (times in ms) as costs: F, B, curvature, inversion, precondition,
    and `piece`, what cutting a task's unit into one more piece costs (piece_overhead)."""
    row = _profile_row(path, microbatch_size)
    time = {column: _measured(row[column], f"profile column {column}", path)
            for column in ("time_f", "time_b", "time_kron", "time_inv", "time_prec") if column in row}
    costs = {OpKind.F.value: time["time_f"], OpKind.B.value: time["time_b"]}
    if "time_kron" in time:
        costs["curvature_A"] = costs["curvature_B"] = time["time_kron"] / 2
    if "time_inv" in time:
        costs["inversion"] = time["time_inv"]
    if "time_prec" in time:
        costs["precondition"] = time["time_prec"]
    if "time_kron" in time:
        costs["piece"] = piece_overhead(path)
    return costs


LINEAR_FACTORS = 12  # K-FAC calls per profiled layer: 2 factors of its 6 nn.Linear (BERT's query, key,
# value, attention output and two feed-forward; the modules PipeFisher's profiling gives K-FAC)


def piece_overhead(path: str) -> float:
    """What one more piece of K-FAC work costs, in ms: the fixed part of one call on one factor of one
    nn.Linear. Curvature's time grows linearly with the micro-batch size b (GEMMs over b x seq rows)
    plus a constant, the launches and synchronisations of its calls whatever their size: the intercept
    of a least-squares line through time_kron over the rows with b >= 8 (below, the GPU is not
    saturated and the time is flat), over the LINEAR_FACTORS calls it makes; >= 0. V100: BERT-Large
    1.69 ms / 12 = 0.14 ms, BERT-Base 1.01 / 12 = 0.084 ms."""
    rows = _profile_rows(path)
    points = [(float(r["bs"]), float(r["time_kron"])) for r in rows if float(r["bs"]) >= 8] or \
        [(float(r["bs"]), float(r["time_kron"])) for r in rows]
    if len(points) < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return max(0.0, (mean_y - slope * mean_x) / LINEAR_FACTORS)


def _profile_rows(path: str) -> list[dict[str, str]]:
    try:
        rows = list(csv.DictReader(read_text(path, "profile").splitlines()))
    except csv.Error as exc:
        raise _usage(f"cannot read profile: {exc}", path) from None
    need = {"bs", "time_f", "time_b"}
    if not rows or not need <= set(rows[0]):
        raise _usage(f"profile needs columns {', '.join(sorted(need))}", path)
    for r in rows:
        for column in ("bs", "time_kron"):
            if column in r:
                _measured(r[column], f"profile column {column}", path)
    return rows


def _profile_row(path: str, microbatch_size: int | None) -> dict[str, str]:
    rows = _profile_rows(path)
    sizes = [int(_measured(r["bs"], "profile column bs", path)) for r in rows]
    if microbatch_size is None:
        raise _usage(f"--microbatch-size is needed (profile rows: {', '.join(map(str, sizes))})", path)
    if microbatch_size not in sizes:
        raise _usage(f"no row for microbatch size {microbatch_size} (rows: {', '.join(map(str, sizes))})", path)
    return rows[sizes.index(microbatch_size)]


@dataclass(frozen=True, slots=True)
class Measured:
    """Where measured costs come from, for the errors about their kinds: the span of each kind a costs
    file gives, the span a missing kind is reported at (the file's object, a profile's header), and how
    a missing kind is given."""

    spans: dict[str, Span]
    at: Span
    how: str
    profile: bool = False  # a profile row: its optional K-FAC columns may name tasks a schedule lacks


MEASURE = "`schedc run PLAN --profile-out costs.json` measures every kind a plan runs"


def costs_origin(path: str) -> Measured:
    """The spans of a costs JSON's top-level keys (the file already read by load_costs)."""
    source = Source(str(path), read_text(path))
    start, spans = _json_keys(source.text)
    at = _span_at(source, start, 1)
    return Measured({key: _span_at(source, offset, len(key) + 2) for key, offset in spans.items()}, at,
                    "add {keys} to this file (a number, or a list of one per stage, in the file's unit); " + MEASURE)


def profile_origin(path: str) -> Measured:
    """A profile CSV's header line, where a kind its columns cannot give is reported."""
    source = Source(str(path), read_text(path, "profile"))
    return Measured({}, Span(1, 1, 1, 1, source),
                    "a profile row gives F (time_f), B (time_b) and the K-FAC tasks (time_kron, time_inv, "
                    "time_prec) only: give {keys} in a costs JSON with --costs instead; " + MEASURE, profile=True)


def check_measured_kinds(measured: Measured, given: Iterable[str], runs: Collection[str], needs: Iterable[str],
                         split: bool) -> None:
    """Measured costs (`given`, their kinds) name only kinds the schedule runs (`runs`; a profile's are
    not refused, its columns are fixed) and give every kind its ops need (`needs`): a missing one is an
    error, never the unit default next to milliseconds. Raises SchedError (exit 2), located in the file."""
    given = list(given)
    listed = [kind for kind in runs if kind != OVERLAP]  # FB is no kind of its own: F & B's cost
    errors = [] if measured.profile else [
        error(f"measured cost of '{kind}': {absent_kind(kind, listed, split)}", measured.spans.get(kind, measured.at))
        for kind in given if kind not in runs and kind != "piece"]
    missing = [kind for kind in needs if kind not in given]
    if missing:
        names = " and ".join(", ".join(missing).rsplit(", ", 1))
        keys = " and ".join(", ".join(f'"{kind}"' for kind in missing).rsplit(", ", 1))
        errors.append(error(f"no measured cost for {names}, which the schedule runs{_why(missing, split)}: "
                            + measured.how.format(keys=keys), measured.at,
                            notes=("measured costs are not mixed with the unit defaults (F=1, B=2, I=W=1) or "
                                   "declared costs",)))
    if errors:
        raise SchedError(errors, None, kind=USAGE)


def _why(missing: list[str], split: bool) -> str:
    if split and any(kind in (OpKind.I, OpKind.W) for kind in missing):
        return " (its backward is split into I and W)"
    return ""


def _json_keys(text: str) -> tuple[int, dict[str, int]]:
    """The offset of a JSON object's '{' and of each of its top-level keys (the first, if repeated)."""
    at, pairs = _json_key_offsets(text)
    keys: dict[str, int] = {}
    for key, offset in pairs:
        keys.setdefault(key, offset)
    return at, keys


def _json_key_offsets(text: str) -> tuple[int, list[tuple[str, int]]]:
    """The offset of a JSON object's '{' and each top-level key with its offset, in order, repeats
    too (text already parsed as one object)."""
    decoder = json.JSONDecoder()
    at = len(text) - len(text.lstrip())
    keys, offset = [], at + 1
    while True:
        offset += len(text[offset:]) - len(text[offset:].lstrip())
        if text[offset:offset + 1] != '"':
            return at, keys
        key, end = json.decoder.scanstring(text, offset + 1)
        keys.append((key, offset))
        end = text.index(":", end) + 1
        end += len(text[end:]) - len(text[end:].lstrip())
        _, end = decoder.raw_decode(text, end)
        end += len(text[end:]) - len(text[end:].lstrip())
        offset = end + 1 if text[end:end + 1] == "," else len(text)


def _span_at(source: Source, offset: int, width: int) -> Span:
    line = source.text.count("\n", 0, offset) + 1
    column = offset - (source.text.rfind("\n", 0, offset) + 1) + 1
    return Span(line, column, line, column + width, source)
