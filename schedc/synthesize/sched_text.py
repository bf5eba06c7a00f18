"""A synthesized order in words: the .sched file it is written as (to_sched) and the numbers of its report."""
from __future__ import annotations

from ..text import plural
from .problem import BYTES, FULL_NAMES, KIND_NAMES, Synthesis


def number(x: float) -> str:
    """x as the .sched file writes it: short where that is exact (`1`, `0.5`, `1e+06`), else Python's
    shortest round-trip form, so that the file times exactly what was searched (2.011054 was written
    2.01105, and the file's makespan fell below the search's lower bound)."""
    short = f"{x:g}"
    return short if float(short) == float(x) else repr(float(x))


def listed(row: tuple[float, ...]) -> str:
    """One value, or the values per device comma-separated (as --memory-limit takes them)."""
    return number(row[0]) if len(set(row)) == 1 else ",".join(map(number, row))


def count(n: int, what: str) -> str:
    return plural(n, what)


def _per_stage_expr(row: tuple[float, ...], var: str = "s") -> str:
    """One value, or a chain over the runs of equal values: `1 if s < 2 else 2` for 1, 1, 2, 2."""
    runs: list[tuple[int, float]] = []  # (first index, value) of each run
    for i, x in enumerate(row):
        if not runs or runs[-1][1] != x:
            runs.append((i, x))
    expr = number(runs[-1][1])
    for (_, x), (end, _) in zip(reversed(runs[:-1]), reversed(runs[1:])):
        expr = f"{number(x)} if {var} < {end} else {expr}"
    return expr


def peaks_text(peaks) -> str:
    """Activation peaks per device, or past 16 devices the first and last few and the largest."""
    shown = [number(x) for x in peaks]
    if len(shown) <= 16:
        return " ".join(shown)
    return " ".join(shown[:8]) + " ... " + " ".join(shown[-2:]) + f" (at most {number(max(peaks))})"


def _listed_row(row: tuple[float, ...]) -> str:
    """The command line's form of per-stage values: `1` or `1,1,2,2`."""
    return number(row[0]) if len(set(row)) == 1 else ",".join(map(number, row))


def to_sched(result: Synthesis, name: str = "synthesized", width: int = 100) -> str:
    """The .sched text: literal per-device lists, the costs and the memory limit, with a header comment
    saying what was asked and found (the latency is a command-line option, noted in the comment)."""
    pr = result.problem
    names = KIND_NAMES if pr.split else FULL_NAMES
    costs = ", ".join(f"{n}={_listed_row(row)}" for n, row in zip(names, pr.costs))
    limit = _per_stage_expr(pr.limit, "d")
    in_bytes = pr.unit == BYTES
    what = "bytes of activations and deferred W inputs" if in_bytes else "activations"
    lines = [
        f"# Synthesized by `schedc tune --synthesize`: p={pr.p}, m={pr.m}, {costs}, latency {number(pr.latency)},",
        f"# {'memory' if in_bytes else 'activation'} limit {_listed_row(pr.limit)}{' bytes' * in_bytes} per device"
        f"{_deferred_text(pr)}. "
        f"Makespan {number(result.makespan)} (lower bound {number(pr.lower_bound())}), peak "
        f"{'memory' if in_bytes else 'activations'} {peaks_text(result.peak)};",
        f"# found by {result.found_by}, {count(result.timed, 'order')} timed.",
        f"# Simulate with the same latency: schedc simulate FILE --latency {number(pr.latency)}",
        *(["# The limit is the cost model's bytes (I frees a forward's activations but for what its W reads,",
           "# held until W), which `limit memory` (activation units) cannot say: simulate with --model and",
           "# --cluster to see them."] if in_bytes else []),
        f'schedule {name} "order synthesized under a limit of {_listed_row(pr.limit)} {what} per device"',
        f"devices {pr.p}",
        f"pipeline main {{ stages {pr.p}; device s -> s; microbatches {pr.m} }}",
    ]
    if pr.split:
        lines.append("backward split")
    lines += [f"cost {n}(s) = {_per_stage_expr(row)}" if len(set(row)) > 1 else f"cost {n} = {number(row[0])}"
              for n, row in zip(names, pr.costs)]
    if pr.deferred < 1:  # `limit memory` counts a unit until W: what a deferred W frees at I it cannot say
        lines.append(f"# limit memory <= {limit}, a deferred W holding {number(pr.deferred)} of its activation "
                     "from its I: not written, as a unit holds all of it until W")
    elif not in_bytes:
        lines.append(f"limit memory <= {limit}")
    for d, order in enumerate(result.orders):
        lines += _device_block(d, order, width)
    return "\n".join(lines) + "\n"


def _deferred_text(pr) -> str:
    return f" (a deferred W holding {number(pr.deferred)} of one)" if pr.deferred < 1 else ""


def _device_block(d: int, order, width: int) -> list[str]:
    items = [f"{kind}({s}, {i})" for kind, s, i in order]
    out, line = [f"on device {d} {{"], "  "
    for item in items:
        if len(line) + len(item) + 1 > width and line.strip():
            out.append(line.rstrip())
            line = "  "
        line += item + " "
    if line.strip():
        out.append(line.rstrip())
    out.append("}")
    return out
