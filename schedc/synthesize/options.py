"""synthesis_options: the synthesize side of `schedc tune --synthesize` — command-line options to a
Problem, the orders to a checked .sched text and a report (schedc/synthesize/scheduler.py does the work).

    -D p=4 -D m=8 --cost I=1 --cost W=1 --latency 0.5 --activation-limit 4 -o zb.sched
    -> zb.sched: makespan 33 (lower bound 28.5), peak activations 4 4 4 4 within 4; greedy variant ...

The costs come from `--cost KIND=VALUE` and, under them, a measured costs file (`--costs FILE`, the
JSON `schedc run --profile-out` writes, as `simulate --costs` reads it).
"""
from __future__ import annotations

import math

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..diagnostics import Source
from ..text import gib
from ..ops import OpKind, builtin_kinds
from .problem import UNITS, Problem, make_problem, option_error
from .scheduler import synthesize
from .sched_text import count, listed, peaks_text, to_sched

COST_KINDS = tuple(kind.value for kind in OpKind)


def _numbers(name: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise option_error(f"{name}: expected a number or comma-separated numbers, got {text!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise option_error(f"{name}: expected finite numbers >= 0, got {text!r}")
    return values


def _measured(path: str) -> tuple[dict[str, tuple[float, ...]], list[str]]:
    """The op kinds' costs of a measured costs file (--costs FILE), and the other kinds it times (a
    K-FAC run's tasks), which a synthesized order does not run: left out, and said so."""
    from ..interop.profiles import load_costs
    table, other = {}, []
    for kind, value in load_costs(path).items():
        if kind not in COST_KINDS:
            other.append(kind)
            continue
        table[kind] = value if isinstance(value, tuple) else (value,)
    if OpKind.B.value in table and (OpKind.I.value in table or OpKind.W.value in table):
        del table[OpKind.B.value]  # a profile of a split backward also times the whole B: order I and W
    return table, other


@dataclass(frozen=True)
class InBytes:
    """`--model M --microbatch-size b [--recompute R] --memory-limit 3GiB`: memory in the cost model's
    bytes (a deferred W's inputs included), the limit in bytes per device."""

    model: str
    microbatch_size: str | None
    recompute: str | None
    memory_limit: str | None


def problem_from_options(defines: dict[str, str], costs: tuple[str, ...], latency: float,
                         activation_limit: str | None, costs_file: str | None = None,
                         measured: dict[str, tuple[float, ...]] | None = None,
                         in_bytes: InBytes | None = None) -> Problem:
    """`-D p=4 -D m=8`, `--cost F=1 --cost I=1,1,2,2` (over `--costs FILE`, read here unless its op
    kinds' costs are given as `measured`), `--activation-limit 4` (or `in_bytes`) -> a Problem
    (errors: exit 2)."""
    sizes = _sizes(defines)
    table: dict[str, tuple[float, ...]] = {}
    where: dict[str, str] = {}
    for item in costs:
        kind, sep, text = item.partition("=")
        kind = kind.strip()
        if not sep or kind not in COST_KINDS:
            raise option_error(f"--cost {item!r}: expected KIND=VALUE with KIND one of {', '.join(COST_KINDS)}")
        if kind in where:
            raise option_error(f"--cost {kind} given twice")
        where[kind] = f"--cost {kind}"
        table[kind] = _numbers(f"--cost {kind}", text)
    if costs_file is not None:
        if measured is None:
            measured = _measured(costs_file)[0]
        backward = set(where) & {OpKind.B.value, OpKind.I.value, OpKind.W.value}  # a --cost of F says nothing of it
        split = bool(backward & {OpKind.I.value, OpKind.W.value}) if backward else \
            bool({OpKind.I.value, OpKind.W.value} & set(measured))
        drop = {OpKind.B.value} if split else {OpKind.I.value, OpKind.W.value}
        dropped = sorted(drop & set(measured), key=COST_KINDS.index)
        if dropped and not split:  # the file's measured split backward would be thrown away unsaid
            raise option_error(f"--cost B with --costs {costs_file}, which times the backward split as "
                               f"{' and '.join(dropped)}: give --cost I and --cost W instead, or a costs file of F and B")
        if dropped:  # and its measured whole backward
            given = " and ".join(f"--cost {k}" for k in sorted(backward, key=COST_KINDS.index))
            raise option_error(f"{given} with --costs {costs_file}, which times the backward whole as B: give "
                               f"--cost B instead, or a costs file of F, I and W")
        for kind, row in measured.items():
            if kind not in where and kind not in drop:
                table[kind], where[kind] = row, f"--costs {costs_file}, {kind}"
        missing = [k for k in builtin_kinds(split) if k not in table]
        if missing:
            raise option_error(f"--costs {costs_file}: no measured cost for {missing[0]}, which the order runs "
                               f"(measured costs are not mixed with the unit defaults; give it with --cost "
                               f"{missing[0]}=...)")
    return _limited(sizes["p"], sizes["m"], table, latency, activation_limit, where, in_bytes)


def _sizes(defines: dict[str, str]) -> dict[str, int]:
    """-D p=N and -D m=N, the only defines --synthesize takes."""
    unknown = sorted(set(defines) - {"p", "m"})
    if unknown:
        raise option_error(f"-D {unknown[0]}: tune --synthesize takes only p (devices) and m (microbatches)")
    sizes = {}
    for name in ("p", "m"):
        if name not in defines:
            raise option_error(f"give -D {name}=N ({'devices' if name == 'p' else 'microbatches'})")
        try:
            sizes[name] = int(defines[name])
        except ValueError:
            raise option_error(f"-D {name}: expected an integer, got {defines[name]!r}") from None
    return sizes


def cluster_problem_from_options(defines: dict[str, str], costs: tuple[str, ...], costs_file: str | None,
                                 activation_limit: str | None, on_cluster) -> Problem:
    """With --cluster: the Problem of the row's own costs (cluster.OnCluster `on_cluster`),
    the limit in activations (--activation-limit: p for ZB-1p, 2p for ZB-2p)."""
    from .cluster import problem_on_cluster
    if costs or costs_file is not None:
        raise option_error("--cost and --costs give the costs; with --cluster the cost model gives them: give one or "
                           "the other")
    if activation_limit is None:
        raise option_error("with --cluster give --activation-limit N (activations per device: p for ZB-1p, 2p for ZB-2p)")
    sizes = _sizes(defines)
    return problem_on_cluster(on_cluster, sizes["p"], sizes["m"], _numbers("--activation-limit", activation_limit))


def _limited(p: int, m: int, table, latency: float, activation_limit: str | None, where: dict[str, str],
             in_bytes: InBytes | None) -> Problem:
    """The Problem under --activation-limit, or with --model in bytes under --memory-limit."""
    if in_bytes is None:
        if activation_limit is None:
            raise option_error("give --activation-limit N (activations per device; one value or one per device)")
        return make_problem(p, m, table, latency, _numbers("--activation-limit", activation_limit), where)
    if activation_limit is not None:
        raise option_error("--activation-limit counts activations; with --model the limit is --memory-limit "
                           "(bytes per device, e.g. 3GiB)")
    limit, bytes_of = _bytes_of(in_bytes, p)
    return make_problem(p, m, table, latency, limit, where, bytes_of=bytes_of)


def _bytes_of(given: InBytes, p: int):
    """(the limit per device in bytes, (model, layout)) of --model, --microbatch-size, --recompute and
    --memory-limit (one value or one per device)."""
    from ..checks.memory import parse_bytes
    from ..costmodel.specs import check_layout, load_model_spec
    from ..layout import Layout
    if given.memory_limit is None:
        raise option_error("with --model give --memory-limit (bytes of activations per device, e.g. 3GiB)")
    try:
        size = int(given.microbatch_size or "")
    except ValueError:
        raise option_error("with --model give --microbatch-size b (one size, the sequences per microbatch)") from None
    recompute = given.recompute or "none"
    if recompute not in ("none", "selective", "full"):
        raise option_error(f"--recompute {recompute!r}: with --synthesize one of none, selective, full")
    model = load_model_spec(given.model)
    layout = Layout(microbatch_size=size, recompute=recompute)
    check_layout(model, layout, given.model)
    if model.layers % p:
        raise option_error(f"--model {given.model}: its {model.layers} layers do not divide over p={p} stages")
    return tuple(parse_bytes(text) for text in given.memory_limit.split(",")), (model, layout)


def check_text(text: str, path: str, latency: float = 0.0):
    """Compile the written schedule as any schedule is compiled (with the latency it was made for);
    the Compiled result: its diagnostics, and the compiler's own makespan and memory peaks."""
    from ..driver import compile_source
    return compile_source(Source(path, text), latency=latency)


@dataclass(frozen=True)
class Synthesized:
    """What `tune --synthesize` made: the .sched text, the report for the terminal, whether the
    compiler accepts it, and the same as JSON (--json)."""

    text: str
    report: str
    ok: bool
    summary: dict[str, Any]


def run_tune(defines: dict[str, str], costs: tuple[str, ...], latency: float, activation_limit: str | None,
             out: str | None, progress: Callable[[int, int], None] | None = None,
             costs_file: str | None = None, in_bytes: InBytes | None = None, on_cluster=None) -> Synthesized:
    """`schedc tune --synthesize`: the order as checked .sched text and its report. The text is compiled
    before it is written; a refused one is written too, for study. With `on_cluster`
    (cluster.OnCluster) the costs are the cost model's for that row."""
    if on_cluster is not None:
        measured, left_out = {}, []
        problem = cluster_problem_from_options(defines, costs, costs_file, activation_limit, on_cluster)
    else:
        measured, left_out = _measured(costs_file) if costs_file is not None else ({}, [])
        problem = problem_from_options(defines, costs, latency, activation_limit, costs_file, measured, in_bytes)
    result = synthesize(problem, progress)
    shown = out if out not in (None, "-") else "the order"
    text = to_sched(result)
    compiled = check_text(text, out if out not in (None, "-") else "<synthesized>", problem.latency)
    if out is not None:
        from ..outputs import write_output
        write_output(out, text)  # through a symlink, atomically; `-` prints it
    lines = [d.format(compiled.schedule.source) for d in compiled.diagnostics]
    if left_out:
        lines.insert(0, f"schedc tune: note: --costs {costs_file}: {', '.join(left_out)} left out (not op kinds: "
                        f"a synthesized order runs {', '.join(COST_KINDS)})")
    stats = compiled.stats
    # the compile counts whole units; the synthesis's own peaks where it counts otherwise (bytes, or a
    # deferred W's share of an activation: --cluster)
    peaks = stats["peak_memory"] if problem.unit == UNITS and problem.deferred == 1.0 else result.peak
    shown_peaks = peaks if problem.deferred == 1.0 else [float(f"{x:.4g}") for x in peaks]  # shares: 4 digits
    held = (f"activations {peaks_text(shown_peaks)} within {listed(problem.limit)}" if problem.unit == UNITS else
            f"memory {' '.join(gib(x) for x in peaks)} GiB within {','.join(gib(x) for x in dict.fromkeys(problem.limit))} GiB")
    lines.append(f"{shown}: makespan {stats['makespan']:g} (lower bound {problem.lower_bound():g}), peak {held}; "
                 f"{result.found_by}; {count(result.timed, 'order')} timed"
                 + ("" if compiled.ok else "; the compiler refuses it"))
    summary = {"valid": compiled.ok, "out": out, "p": problem.p, "m": problem.m,
               "costs": dict(zip(builtin_kinds(problem.split), map(list, problem.costs))),
               "latency": problem.latency, "activation_limit": list(problem.limit),
               "makespan": stats["makespan"], "lower_bound": problem.lower_bound(),
               "peak_activations": list(peaks), "memory_unit": problem.unit, "found_by": result.found_by,
               "orders_timed": result.timed, "costs_left_out": left_out,
               "errors": [d.format(compiled.schedule.source)
                                                        for d in compiled.diagnostics]}
    return Synthesized(text, "\n".join(lines), compiled.ok, summary)


__all__ = ["problem_from_options", "check_text", "run_tune", "InBytes", "Synthesized"]
