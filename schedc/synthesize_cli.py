"""synthesize_cli: the synthesize side of `schedc tune --synthesize` — command-line options to a
Problem, the orders to a checked .sched text and a report (schedc/synthesize.py does the work).

    -D p=4 -D m=8 --cost I=1 --cost W=1 --latency 0.5 --memory-limit 4 -o zb.sched
    -> zb.sched: makespan 33 (lower bound 28.5), peak activations 4 4 4 4 within 4; greedy variant ...
"""
from __future__ import annotations

from collections.abc import Callable

from .diagnostics import Source
from .ops import OpKind
from .synthesize import Problem, count, listed, make_problem, option_error, synthesize, to_sched

COST_KINDS = tuple(kind.value for kind in OpKind)


def _numbers(name: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise option_error(f"{name}: expected a number or comma-separated numbers, got {text!r}") from None
    return values


def problem_from_options(defines: dict[str, str], costs: tuple[str, ...], latency: float,
                         memory_limit: str | None) -> Problem:
    """`-D p=4 -D m=8`, `--cost F=1 --cost I=1,1,2,2`, `--memory-limit 4` -> a Problem (errors: exit 2)."""
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
    table: dict[str, tuple[float, ...]] = {}
    for item in costs:
        kind, sep, text = item.partition("=")
        kind = kind.strip()
        if not sep or kind not in COST_KINDS:
            raise option_error(f"--cost {item!r}: expected KIND=VALUE with KIND one of {', '.join(COST_KINDS)}")
        if kind in table:
            raise option_error(f"--cost {kind} given twice")
        table[kind] = _numbers(f"--cost {kind}", text)
    if memory_limit is None:
        raise option_error("give --memory-limit N (activations per device; one value or one per device)")
    return make_problem(sizes["p"], sizes["m"], table, latency, _numbers("--memory-limit", memory_limit))


def check_text(text: str, path: str, latency: float = 0.0):
    """Compile the written schedule as any schedule is compiled (with the latency it was made for);
    the Compiled result: its diagnostics, and the compiler's own makespan and memory peaks."""
    from .compiler import compile_source
    return compile_source(Source(path, text), latency=latency)


def run_tune(defines: dict[str, str], costs: tuple[str, ...], latency: float, memory_limit: str | None,
             out: str | None, progress: Callable[[int, int], None] | None = None) -> tuple[str, str, bool]:
    """`schedc tune --synthesize`: (the .sched text, a report for the terminal, whether the compiler
    accepts it). The text is compiled before it is written; a refused one is written too, for study."""
    problem = problem_from_options(defines, costs, latency, memory_limit)
    result = synthesize(problem, progress)
    path = out or "synthesized.sched"
    text = to_sched(result)
    compiled = check_text(text, path, problem.latency)
    if out is not None:
        from .outputs import write_output
        write_output(out, text)  # through a symlink, atomically; `-` prints it
    lines = [d.format(compiled.schedule.source) for d in compiled.diagnostics]
    stats = compiled.stats
    lines.append(f"{path}: makespan {stats['makespan']:g} (lower bound {problem.lower_bound():g}), peak activations "
                 f"{' '.join(f'{x:g}' for x in stats['peak_memory'])} within {listed(problem.limit)}; "
                 f"{result.found_by}; {count(result.timed, 'order')} timed"
                 + ("" if compiled.ok else "; the compiler refuses it"))
    return text, "\n".join(lines), compiled.ok


__all__ = ["problem_from_options", "check_text", "run_tune"]
