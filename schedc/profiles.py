"""Measured costs: the runtime's costs.json and PipeFisher's profile CSVs, as per-stage cost tables."""
from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

from .diagnostics import SchedError, Source, error


def _usage(message: str, path: str) -> SchedError:
    return SchedError(error(message), Source(str(path), ""), exit_code=2)


def load_costs(path: str) -> dict[str, tuple[float, ...] | float]:
    """Read costs: JSON {"F": [per stage...] or number, "B": ..., "<task>": ...} ("unit" is ignored)."""
    if str(path).endswith(".csv"):
        raise _usage("a profile CSV needs `schedc simulate --profile FILE --microbatch-size B`", path)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _usage(f"cannot read costs: {exc}", path) from None
    if not isinstance(data, dict):
        raise _usage("costs must be a JSON object of op kind to cost", path)
    out = {}
    for kind, value in data.items():
        if kind in ("unit", "source", "schedule"):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[kind] = float(value)
        elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            out[kind] = tuple(float(v) for v in value)
        else:
            raise _usage(f"cost of {kind!r} must be a number or a list of numbers per stage", path)
    return out


def read_profile(path: str, microbatch_size: int | None) -> dict[str, float]:
    """One row of a PipeFisher profile (times in ms) as costs: F, B, curvature, inversion, precondition."""
    try:
        rows = list(csv.DictReader(Path(path).read_text().splitlines()))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise _usage(f"cannot read profile: {exc}", path) from None
    need = {"bs", "time_f", "time_b"}
    if not rows or not need <= set(rows[0]):
        raise _usage(f"profile needs columns {', '.join(sorted(need))}", path)
    sizes = [int(float(r["bs"])) for r in rows]
    if microbatch_size is None:
        raise _usage(f"--microbatch-size is needed (profile rows: {', '.join(map(str, sizes))})", path)
    if microbatch_size not in sizes:
        raise _usage(f"no row for microbatch size {microbatch_size} (rows: {', '.join(map(str, sizes))})", path)
    row = rows[sizes.index(microbatch_size)]
    costs = {"F": float(row["time_f"]), "B": float(row["time_b"])}
    if "time_kron" in row:
        costs["curvature_A"] = costs["curvature_B"] = float(row["time_kron"]) / 2
    if "time_inv" in row:
        costs["inversion"] = float(row["time_inv"])
    if "time_prec" in row:
        costs["precondition"] = float(row["time_prec"])
    return costs


def profile_to_costs_file(path: str, microbatch_size: int | None) -> str:
    """Write a profile row as a costs JSON (for the commands that take --costs); return its path."""
    costs = read_profile(path, microbatch_size)
    handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    with handle:
        json.dump({"unit": "ms", **costs}, handle)
    return handle.name
