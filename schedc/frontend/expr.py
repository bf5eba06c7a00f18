"""Expressions: compile AST expressions into small closures and evaluate them (no Python eval).

    >>> fn = compile_expr(parse("min(p - 1 - d, m)"))   # doctest: +SKIP
    >>> fn({"p": 4, "d": 1, "m": 8})
    2
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

from . import ast
from ..diagnostics import Span

Env = dict[str, Any]
Fn = Callable[[Env], Any]


class EvalError(Exception):
    def __init__(self, message: str, span: Span):
        super().__init__(message)
        self.message = message
        self.span = span


@dataclass(frozen=True, slots=True)
class PipeRef:
    """A pipeline named in an expression (`let X = down if d < h else up`)."""

    name: str

    def __str__(self) -> str:
        return self.name


def _div(a, b):
    return a / b


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": _div, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow,
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
_FUNCS: dict[str, Callable[..., Any]] = {
    "min": min, "max": max, "abs": abs, "ceil": math.ceil, "floor": math.floor,
}
_ARITY = {"abs": 1, "ceil": 1, "floor": 1}
MAX_POWER = 64
MAX_INT = 2 ** 63 - 1  # no count, index or size of a schedule comes near; larger ones are refused


def _magnitude(value: int) -> str:
    """A big integer shown by its size: -1000 -> "-1000", 10**40 -> "of 41 digits"."""
    digits = len(str(abs(value)))
    return str(value) if digits <= 20 else f"of {digits} digits"


def _real(value: Any, span: Span) -> Any:
    """A computed value as the language has it: a finite real number of bounded size (or a bool or a
    pipeline, passed through). Python would go on with complex numbers (`(0 - 1) ** 0.5`), infinities
    and NaN (`1e308 * 10`), and integers of any length; the language refuses them where they arise."""
    kind = type(value)
    if kind is int:
        if -MAX_INT <= value <= MAX_INT:
            return value
        raise EvalError(f"integer result {_magnitude(value)} is too large (at most {MAX_INT})", span)
    if kind is float:
        if math.isfinite(value):
            return value
        raise EvalError("arithmetic overflow: the result is not a finite number", span)
    if kind is complex:
        raise EvalError("a negative number to a fractional power has no real value", span)
    return value


def _number(value: Any, span: Span) -> int | float:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    raise EvalError(f"expected a number, got pipeline '{value}'", span)


def _compile_num(node: ast.Num) -> Fn:
    value = node.value
    return lambda env: value


def _compile_name(node: ast.Name) -> Fn:
    name, span = node.id, node.span

    def get(env: Env) -> Any:
        try:
            return env[name]
        except KeyError:
            raise EvalError(f"unknown name '{name}'", span) from None
    return get


def _compile_star(node: ast.Star) -> Fn:
    def star(env: Env) -> Any:
        raise EvalError("'*' stands only as a dependency's argument", node.span)
    return star


def _compile_unary(node: ast.Unary) -> Fn:
    inner, span = compile_expr(node.operand), node.span
    if node.op == "not":
        return lambda env: not inner(env)
    return lambda env: _real(-_number(inner(env), span), span)


def _compile_binary(node: ast.Binary) -> Fn:
    left, right, span = compile_expr(node.left), compile_expr(node.right), node.span
    if node.op == "and":
        def both(env: Env) -> Any:
            return left(env) and right(env)
        return _conjunction(node, both) or both
    if node.op == "or":
        return lambda env: left(env) or right(env)
    fn = _ARITH[node.op]
    if node.op in ("==", "!=") and isinstance(node.right, ast.Num):  # `t % 6 == 2`: the number read once
        value = node.right.value
        return lambda env: fn(left(env), value)
    if node.op in ("==", "!="):
        return lambda env: fn(left(env), right(env))

    power = node.op == "**"
    if isinstance(node.left, ast.Name) and isinstance(node.right, ast.Num) and not power:
        return _name_by_number(node.left, node.right.value, fn, span)

    def apply(env: Env) -> Any:
        a, b = left(env), right(env)
        try:
            if power and abs(b) > MAX_POWER:
                raise EvalError(f"exponent {b} is too large (at most {MAX_POWER})", span)
            return _real(fn(a, b), span)
        except (ZeroDivisionError, TypeError, OverflowError, ValueError) as exc:
            raise _arith_error(exc, a, b, span) from None
    return apply


def _name_by_number(name: ast.Name, b: int | float, fn: Callable[[Any, Any], Any], span: Span) -> Fn:
    """`i // 4`, `s % 2`: a name and a number (what sort keys are made of once params are folded in),
    read in one closure."""
    key, name_span = name.id, name.span

    def apply(env: Env) -> Any:
        try:
            a = env[key]
        except KeyError:
            raise EvalError(f"unknown name '{key}'", name_span) from None
        try:
            return _real(fn(a, b), span)
        except (ZeroDivisionError, TypeError, OverflowError, ValueError) as exc:
            raise _arith_error(exc, a, b, span) from None

    def compare(env: Env) -> Any:  # `t < 26`: a bool, which _real would return as it is
        try:
            a = env[key]
        except KeyError:
            raise EvalError(f"unknown name '{key}'", name_span) from None
        try:
            return fn(a, b)
        except (ZeroDivisionError, TypeError, OverflowError, ValueError) as exc:
            raise _arith_error(exc, a, b, span) from None
    return compare if fn in _COMPARISONS else apply


_COMPARISONS = (operator.lt, operator.le, operator.gt, operator.ge)


def _conjunction(node: ast.Binary, general: Fn) -> Fn | None:
    """`t % 6 == 2 and t >= 2 and t < 26`: comparisons of one name (or its remainder by a number) with
    integers, read in one closure while the name holds an int (each comparison then a bool, as the
    general closures give it, and none can fail); anything else goes to `general`. None when the
    expression is not of that shape."""
    atoms = _atoms(node)
    if not atoms or len({name for name, _, _, _ in atoms}) != 1:
        return None
    key, checks = atoms[0][0], tuple((mod, compare, value) for _, mod, compare, value in atoms)

    def conjunction(env: Env) -> Any:
        a = env.get(key)
        if type(a) is not int:
            return general(env)
        for mod, compare, value in checks:
            if not compare(a if mod is None else a % mod, value):
                return False
        return True
    return conjunction


def _atoms(node: ast.Expr) -> list[tuple] | None:
    """The comparisons an `and` chain is made of, as (name, divisor or None, comparison, int), or None
    where one is of another shape."""
    if isinstance(node, ast.Binary) and node.op == "and":
        left, right = _atoms(node.left), _atoms(node.right)
        return None if left is None or right is None else left + right
    if not (isinstance(node, ast.Binary) and node.op in _COMPARED and type(getattr(node.right, "value", None)) is int
            and isinstance(node.right, ast.Num)):
        return None
    inner = node.left
    if isinstance(inner, ast.Name):
        return [(inner.id, None, _ARITH[node.op], node.right.value)]
    if (node.op in ("==", "!=") and isinstance(inner, ast.Binary) and inner.op == "%" and isinstance(inner.left, ast.Name)
            and isinstance(inner.right, ast.Num) and type(inner.right.value) is int and inner.right.value != 0):
        return [(inner.left.id, inner.right.value, _ARITH[node.op], node.right.value)]
    return None


_COMPARED = ("==", "!=", "<", "<=", ">", ">=")
conjunction_atoms = _atoms  # what _conjunction reads a chain as (frontend/loops.py inlines it)
ARITH = _ARITH


def _arith_error(exc: Exception, a: Any, b: Any, span: Span) -> Exception:
    """The error to raise for an arithmetic failure: division by zero, a pipeline used as a number, an
    overflow; any other TypeError as it was."""
    if isinstance(exc, ZeroDivisionError):
        return EvalError("division by zero", span)
    if isinstance(exc, OverflowError):
        return EvalError("arithmetic overflow: the result is not a finite number", span)
    if isinstance(exc, TypeError):
        _number(a, span), _number(b, span)
        return exc
    return EvalError(f"arithmetic error: {exc}", span)


def _compile_cond(node: ast.Cond) -> Fn:
    test, then, orelse = compile_expr(node.test), compile_expr(node.then), compile_expr(node.orelse)
    return lambda env: then(env) if test(env) else orelse(env)


def _compile_call(node: ast.Call) -> Fn:
    args, span, func = [compile_expr(a) for a in node.args], node.span, _FUNCS[node.func]
    arity = _ARITY.get(node.func)
    if arity is not None and len(args) != arity:
        raise EvalError(f"{node.func}() takes {arity} argument, got {len(args)}", span)

    def call(env: Env) -> Any:
        values = [_number(a(env), span) for a in args]
        try:
            return _real(func(*values) if len(values) > 1 or arity else values[0], span)
        except (OverflowError, ValueError) as exc:
            raise EvalError(f"{node.func}(): {exc}", span) from None
    return call


def _compile_kinds(node: ast.Kinds) -> Fn:
    rank = {name: n for n, name in enumerate(node.names)}
    last, span = len(node.names), node.span

    def position(env: Env) -> int:
        try:
            kind = env["kind"]
        except KeyError:
            raise EvalError("a list of kinds ranks an op's kind: it stands in queue keys and greedy "
                            "priorities only", span) from None
        return rank.get(kind, last)
    return position


_COMPILERS: dict[type, Callable[[Any], Fn]] = {
    ast.Num: _compile_num, ast.Name: _compile_name, ast.Star: _compile_star, ast.Unary: _compile_unary,
    ast.Binary: _compile_binary, ast.Cond: _compile_cond, ast.Call: _compile_call, ast.Kinds: _compile_kinds,
}


def compile_expr(node: ast.Expr, constants: Env | None = None) -> Fn:
    """Turn an expression into a function of an environment (a dict of names to values). Names found in
    `constants` are folded in, and so is every sub-expression that reads only constants."""
    if constants:
        node = fold_constants(node, constants)
    return _COMPILERS[type(node)](node)


def fold_constants(node: ast.Expr, constants: Env) -> ast.Expr:
    """Replace names bound in `constants` by their numbers and evaluate what becomes constant.

        fold_constants(i // p, {"p": 4}) -> i // 4 ;  fold_constants(p - 1, {"p": 4}) -> 3
    """
    if isinstance(node, ast.Name):
        value = constants.get(node.id)
        return ast.Num(node.span, value) if isinstance(value, (int, float)) else node
    if isinstance(node, ast.Unary):
        node = ast.Unary(node.span, node.op, fold_constants(node.operand, constants))
        parts = (node.operand,)
    elif isinstance(node, ast.Binary):
        node = ast.Binary(node.span, node.op, fold_constants(node.left, constants),
                          fold_constants(node.right, constants))
        parts = (node.left, node.right)
    elif isinstance(node, ast.Cond):
        node = ast.Cond(node.span, *(fold_constants(n, constants) for n in (node.test, node.then, node.orelse)))
        parts = (node.test, node.then, node.orelse)
    elif isinstance(node, ast.Call):
        node = ast.Call(node.span, node.func, tuple(fold_constants(a, constants) for a in node.args))
        parts = node.args
    else:
        return node
    if all(isinstance(p, ast.Num) for p in parts):
        try:
            value = _COMPILERS[type(node)](node)({})
        except EvalError:
            return node  # leave the error to evaluation time, where it is reported with its span
        if isinstance(value, (int, float)):
            return ast.Num(node.span, value)
    return node


_COMPILED: dict[int, tuple[ast.Expr, Fn]] = {}  # id(node) -> (node, its function); see evaluate
_COMPILED_MAX = 4096


def evaluate(node: ast.Expr, env: Env) -> Any:
    """The node's value in `env`. Programs evaluate the same nodes once per loop iteration, so each
    node's function is compiled once and kept (by identity, the node held so its id is not reused;
    the table is emptied when full, so a long search over many files stays bounded)."""
    entry = _COMPILED.get(id(node))
    if entry is None or entry[0] is not node:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        entry = _COMPILED[id(node)] = (node, compile_expr(node))
    return entry[1](env)


def evaluate_int(node: ast.Expr, env: Env, what: str) -> int:
    """Evaluate to an integer (a float with an integral value is accepted) within +-MAX_INT, so that
    whatever it sizes fits a machine integer; a name bound to a huge or non-finite number (-D m=1e308)
    is refused here, where it would size something."""
    value = evaluate(node, env)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise EvalError(f"{what} must be an integer, got {value}", node.span)
    if not -MAX_INT <= value <= MAX_INT:
        raise EvalError(f"{what} {_magnitude(value)} is too large (at most {MAX_INT})", node.span)
    return value


def kind_lists(node: ast.Expr) -> list[ast.Kinds]:
    """The `[I, F, W]` lists inside an expression (their names are checked against the schedule's kinds)."""
    if isinstance(node, ast.Kinds):
        return [node]
    children = {ast.Unary: ("operand",), ast.Binary: ("left", "right"), ast.Cond: ("test", "then", "orelse")}
    found = [k for attr in children.get(type(node), ()) for k in kind_lists(getattr(node, attr))]
    return found + [k for arg in (node.args if isinstance(node, ast.Call) else ()) for k in kind_lists(arg)]


def free_names(node: ast.Expr) -> set[str]:
    """The names an expression reads (for deciding what a key or cost depends on)."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Kinds):
        return {"kind"}
    children = {ast.Unary: ("operand",), ast.Binary: ("left", "right"), ast.Cond: ("test", "then", "orelse")}
    names: set[str] = set()
    for attr in children.get(type(node), ()):
        names |= free_names(getattr(node, attr))
    if isinstance(node, ast.Call):
        for arg in node.args:
            names |= free_names(arg)
    return names
