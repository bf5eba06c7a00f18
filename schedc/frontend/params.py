"""Params: a declaration's `param`s bound to their values (defaults, then -D overrides, each a number or
an expression of the params before it), and the rule that each name is declared once."""
from __future__ import annotations

import math
from typing import Any

from ..diagnostics import SCHEDULE, USAGE, SchedError, Source, Span, error
from ..ops import cost_range, in_cost_range
from . import ast
from .expr import MAX_INT, EvalError, evaluate, evaluate_int, free_names


def _integral(value: Any) -> Any:
    """A declared param's value: a number with an integral value within +-MAX_INT (4.0, 1e3) is that
    integer, as it is given with -D (_parse_override), so `param p = 4.0` is a device count as -D p=4.0
    is; a larger one (1e300) stays a float (a cost may be one), refused where it would size something."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
        return int(value)
    return value


def _parse_override(name: str, text: str) -> int | float:
    """A -D value: an integer, or a finite number (one with an integral value, like 1e3, becomes an
    integer), within +-MAX_INT; anything else is refused, naming the param."""
    try:
        value: int | float = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"-D {name}={text}: value must be a number") from None
        if not math.isfinite(value):
            raise ValueError(f"-D {name}={text}: value must be a finite number") from None
        value = int(value) if value.is_integer() else value  # 1e3 is 1000; 1e300 an integer too large, below
    if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
        raise ValueError(f"-D {name}={text[:24]}{'...' * (len(text) > 24)}: value is too large (at most {MAX_INT})")
    return value


def _declares(d: ast.Decl, split: bool) -> tuple | None:
    """What a declaration defines, as a key two of them must not share (None: it may repeat, like
    `require`, or repeats are merged, like `fill bubbles with` lists and `backward split`). With a split
    backward, `memory B` is I's (see memory_of)."""
    match d:
        case ast.Param(name=name) | ast.PipelineDecl(name=name) | ast.TaskDecl(name=name):
            return (type(d).__name__, f"{_WHAT[type(d)]} '{name}'")
        case ast.MemoryDecl(kind="B" | "I") if split:
            return (type(d).__name__, "the memory of I (`memory B` with a split backward)")
        case ast.CostDecl(kind=kind) | ast.MemoryDecl(kind=kind):
            return (type(d).__name__, f"{_WHAT[type(d)]} of {kind}")
        case ast.QueueDecl(kind=kind, pipe=pipe):
            return (type(d).__name__, f"the queue of {kind}{'.' + pipe if pipe else ''}")
        case ast.Program(device=device):
            return (type(d).__name__, "the program for every device" if device is None
                    else f"the program for device {device}")
        case ast.Devices() | ast.Limit() | ast.HostLimit() | ast.Greedy():
            return (type(d).__name__, _WHAT[type(d)])
    return None


def declared_key(d: ast.Decl) -> tuple | None:
    """What a declaration defines, as composition (compose.py) compares them: _declares' key."""
    return _declares(d, False)


_WHAT = {ast.Param: "param", ast.PipelineDecl: "pipeline", ast.TaskDecl: "task", ast.CostDecl: "the cost",
         ast.MemoryDecl: "the memory", ast.Devices: "`devices`", ast.Limit: "`limit memory`",
         ast.HostLimit: "`limit host_memory`",
         ast.Greedy: "`greedy`"}


def check_declared_once(decl: ast.ScheduleDecl, source: Source) -> None:
    """A name, a cost, a queue, a device's program, a setting is declared once: a second declaration
    would silently win (or lose). Every repeat is reported, at the repeat, naming the first's line."""
    first: dict[tuple, ast.Node] = {}
    diags = []
    split = any(isinstance(d, ast.SplitBackward) for d in decl.decls)
    items = [*decl.decls, *(item for d in decl.decls if isinstance(d, ast.Fill) for item in d.items)]
    for d in items:
        key = (("FillItem", f"task '{d.task}' in `fill bubbles with`") if isinstance(d, ast.FillItem)
               else _declares(d, split))
        if key is None:
            continue
        if key in first:
            diags.append(error(f"{key[1]} is declared twice (first at line {first[key].span.line})", d.span))
        else:
            first[key] = d
    if diags:
        raise SchedError(diags, source)


def _set_elsewhere(params, overrides, req, source) -> list[str]:
    """Notes for a failed requirement: where the params it reads were set when that is another file
    (an `extends` base's require, the derived schedule's `param p = ...`), or that -D set them."""
    home = (req.span.source if req.span is not None and req.span.source is not None else source).path
    read = free_names(req.test)
    notes = []
    for param in (p for p in params if p.name in read):
        if param.name in overrides:
            notes.append(f"{param.name} was given with -D {param.name}={overrides[param.name]}")
            continue
        where = param.span.source if param.span is not None and param.span.source is not None else source
        if where.path != home and param.span is not None:
            notes.append(f"{param.name} is set at {where.path}:{param.span}")
    return notes


def bind_params(decl: ast.ScheduleDecl, source: Source, overrides: dict[str, str],
                requires: bool = True) -> dict[str, Any]:
    """Evaluate params in order, applying -D overrides; check the requires (unless told not to)."""
    params = [d for d in decl.decls if isinstance(d, ast.Param)]
    known = {p.name for p in params}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise fail_at(f"unknown param '{unknown[0]}' given with -D (params: {', '.join(sorted(known)) or 'none'})",
                    None, source, kind=USAGE)
    env: dict[str, Any] = {}
    for param in params:
        try:
            env[param.name] = (_parse_override(param.name, overrides[param.name]) if param.name in overrides
                               else _integral(evaluate(param.default, env)))
        except ValueError as exc:
            raise fail_at(str(exc), param.span, source, kind=USAGE) from None
        except EvalError as exc:
            raise fail_at(exc.message, exc.span, source) from None

    failures = []
    for req in (d for d in decl.decls if isinstance(d, ast.Require) and requires):
        try:
            ok = evaluate(req.test, env)
        except EvalError as exc:
            raise fail_at(exc.message, exc.span, source) from None
        if not ok:
            shown = ", ".join(f"{k}={v}" for k, v in env.items())
            failures.append(error(f"requirement failed: {req.message}", req.span,
                                  notes=(f"with {shown}", *_set_elsewhere(params, overrides, req, source))))
    if failures:
        raise SchedError(failures, source)
    return env


def int_values(start: ast.Expr | None, stop: ast.Expr, env: dict[str, Any]) -> range:
    lo = evaluate_int(start, env, "microbatch range start") if start is not None else 0
    hi = evaluate_int(stop, env, "microbatch count")
    return range(lo, hi)


def fail_at(message: str, span: Span | None, source: Source, kind: str = SCHEDULE, **kw) -> SchedError:
    return SchedError(error(message, span, **kw), source, kind)


def per_stage(decls, kind_default: dict[str, float], env, stages: int, source: Source,
               given: dict[str, Any], what: str = "cost", origin=None) -> dict[str, tuple[float, ...]]:
    """Evaluate `cost K = e` / `cost K(s) = e` (or `memory ...`, what="memory") per stage; measured
    values win (an error in one is located at its key in the costs file, `origin`, when known)."""
    table = {k: [float(v)] * stages for k, v in kind_default.items()}
    for d in decls:
        try:
            table[d.kind] = [float(evaluate(d.value, {**env, d.stage_var: s} if d.stage_var else env))
                             for s in range(stages)]
        except EvalError as exc:
            raise fail_at(exc.message, exc.span, source) from None
        bad = next((v for v in table[d.kind] if not in_cost_range(v)), None)
        if bad is not None:
            shown = ", ".join(f"{k}={v}" for k, v in env.items())
            raise fail_at(f"{what} of {d.kind} must be {cost_range()}, got {bad:g}", d.span, source,
                        notes=(f"with {shown}",) if shown else ())
    for kind, value in given.items():
        values = [float(value)] * stages if isinstance(value, (int, float)) else [float(v) for v in value]
        at = origin.spans.get(kind) if origin is not None else None  # the kind's key in a costs file
        if len(values) != stages:
            raise fail_at(f"measured costs for {kind} have {len(values)} stages (one value per stage), the schedule "
                        f"has {stages}", at, source, kind=USAGE)
        bad = next((v for v in values if not in_cost_range(v)), None)
        if bad is not None:
            raise fail_at(f"measured {what} of {kind} must be {cost_range()}, got {bad:g}", at, source, kind=USAGE)
        table[kind] = values
    return {k: tuple(v) for k, v in table.items()}
