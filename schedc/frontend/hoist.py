"""A loop's invariants folded in before it runs many rounds: every name its body reads but never binds
(no `let`, no inner loop's variable) has the value it had when the loop began, so the body is run with
those names replaced by their numbers and what becomes constant computed once (expr.fold_constants).

    for t in 0 .. 30 { if t % 6 == a % 6 and t < a + 6 * m { F at t } }    with a = 2, m = 4
    -> for t in 0 .. 30 { if t % 6 == 2 and t < 26 { F at t } }

The values are the body's own, and so are the errors: a sub-expression that fails is left as it was
and fails when the program reaches it, with its span; every node keeps its span, so the ops and the
diagnostics name the same places.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import ast
from .expr import fold_constants


def hoisted(loop: ast.Loop, env: dict[str, Any]) -> tuple[ast.Stmt, ...]:
    """The loop's body with the names it does not bind folded in at their values in `env`."""
    bound = {loop.var} | bound_names(loop.body)
    constants = {name: value for name, value in env.items() if name not in bound}
    return _body(loop.body, constants)


def bound_names(body: tuple[ast.Stmt, ...]) -> set[str]:
    """The names a body binds anywhere inside it (lets and loop variables, in any nested body)."""
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.Let):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Loop):
            names |= {stmt.var} | bound_names(stmt.body)
        elif isinstance(stmt, ast.When):
            names |= bound_names(stmt.then) | bound_names(stmt.orelse)
        elif isinstance(stmt.unit, ast.Group):
            names |= bound_names(stmt.unit.body)
    return names


def _body(body: tuple[ast.Stmt, ...], c: dict) -> tuple[ast.Stmt, ...]:
    return tuple(_STATEMENTS[type(stmt)](stmt, c) for stmt in body)


def _expr(node: ast.Expr | None, c: dict) -> ast.Expr | None:
    return None if node is None else fold_constants(node, c)


def _cursor(cursor: ast.Cursor, c: dict) -> ast.Cursor:
    args = None if cursor.args is None else tuple(fold_constants(a, c) for a in cursor.args)
    return replace(cursor, args=args, chunk=_expr(cursor.chunk, c))


_STATEMENTS = {
    ast.Let: lambda s, c: replace(s, value=fold_constants(s.value, c)),
    ast.Loop: lambda s, c: replace(s, start=fold_constants(s.start, c), stop=fold_constants(s.stop, c),
                                   body=_body(s.body, c)),
    ast.When: lambda s, c: replace(s, test=fold_constants(s.test, c), then=_body(s.then, c),
                                   orelse=_body(s.orelse, c)),
    ast.Item: lambda s, c: replace(s, unit=_UNITS[type(s.unit)](s.unit, c), repeat=_expr(s.repeat, c),
                                   when=_expr(s.when, c), slot=_expr(s.slot, c)),
}
_UNITS = {
    ast.Cursor: _cursor,
    ast.Group: lambda u, c: replace(u, body=_body(u.body, c)),
    ast.Overlap: lambda u, c: replace(u, forward=_cursor(u.forward, c), backward=_cursor(u.backward, c)),
    ast.Choice: lambda u, c: replace(u, options=tuple(_cursor(o, c) for o in u.options)),
}
