"""A loop of many rounds run as one generated Python function: its rounds a `for` over a range, its
statements inline (ifs and else-ifs as Python's, `X at t` pops as queue pops), each statement and
round counted against the step budget where the interpreter (order._ProgramRun) counts it, and every
expression still the closure the interpreter evaluates (expr.compile_expr), so the values, the order
and every error and its span are the interpreter's.

    for t in 0 .. 30 { if t % 6 == 2 { F[0] at t } else { W? at t } }
    -> def make(b):                       # once per loop of the source, its body `b` given per entry
           e0 = closure(b[0].test) ...    # (the body with its invariants folded in: hoist.py)
           def rounds(run, scope, start, stop):
               for k in range(start, stop):
                   <count the round> ; scope['t'] = k
                   <count the if> ; if e0(scope): <count, slot, pop F[0]> else: <count, slot, W?>
           return rounds

The source of a loop is made once (kept by the loop's identity, as the interpreter keeps its bodies'
`let`s); each entry binds it to the entry's body in one call. Bodies too large or deep for one Python
function (MAX_STATEMENTS, MAX_DEPTH) are left to the interpreter (compiled() returns None).
"""
from __future__ import annotations

from typing import Any, Callable

from . import ast
from .expr import ARITH, MAX_INT, EvalError, compile_expr, conjunction_atoms, evaluate_int
from .hoist import bound_names
from ..ops import GRADIENT, OpKind

_B, _I, _W = OpKind.B.value, OpKind.I.value, OpKind.W.value
MAX_STATEMENTS = 400  # statements and units of one loop's body made into one function
MAX_DEPTH = 40        # nested blocks (an else-if chain nests one per `else if`)


def closure(node: ast.Expr) -> Callable[[dict], Any]:
    """The expression's function (as evaluate's), an error compile_expr meets raised when it is called,
    as evaluate raises it when the program reaches it."""
    try:
        return compile_expr(node)
    except EvalError as exc:
        def fail(env: dict, exc: EvalError = exc) -> Any:
            raise EvalError(exc.message, exc.span)
        return fail


_COMPARED = ("==", "!=", "<", "<=", ">", ">=")


def _shape(node: ast.Expr) -> list[tuple[str, bool, str]] | None:
    """The comparisons an `and` chain is made of, as (name, whether it is taken modulo something, the
    comparison), or None where one compares anything but a name or a name's remainder."""
    if type(node) is ast.Binary and node.op == "and":
        left, right = _shape(node.left), _shape(node.right)
        return None if left is None or right is None else left + right
    if type(node) is not ast.Binary or node.op not in _COMPARED:
        return None
    inner = node.left
    if type(inner) is ast.Name:
        return [(inner.id, False, node.op)]
    if node.op in ("==", "!=") and type(inner) is ast.Binary and inner.op == "%" and type(inner.left) is ast.Name:
        return [(inner.left.id, True, node.op)]
    return None


def _plain(cursor: ast.Cursor) -> bool:
    """A pop of the next op of a kind (of its local chunk, a literal): no pipeline, no arguments."""
    chunk = cursor.chunk
    return cursor.args is None and cursor.pipe is None and (chunk is None or (
        type(chunk) is ast.Num and type(chunk.value) is int and -MAX_INT <= chunk.value <= MAX_INT))


def atom_values(test: ast.Expr, shape: list[tuple[str, bool, str]]) -> tuple[bool, tuple]:
    """Whether the entry's test (invariants folded in) compiles to expr._conjunction's closure of the
    expected shape, and its divisors and numbers (mod_0, value_0, mod_1, ...; zeros where it does not)."""
    atoms = conjunction_atoms(test)
    if (atoms is None or len(atoms) != len(shape) or len({name for name, _, _, _ in atoms}) != 1
            or any(name != want or (mod is not None) != modulo or compare is not ARITH[op]
                   for (name, mod, compare, _), (want, modulo, op) in zip(atoms, shape))):
        return False, (0,) * (2 * len(shape))
    return True, tuple(v for _, mod, _, value in atoms for v in (mod, value))


class _TooBig(Exception):
    pass


class _Source:
    """The generated function's text, its constants (spans, keys: the same for every entry) and its
    per-entry values (nodes and closures, read from the entry's body by their path)."""

    def __init__(self, loop: ast.Loop, mixed: bool, units: dict):
        self.var, self.mixed, self.units = loop.var, mixed, units
        self.rebound = bound_names(loop.body)  # names the body binds (the loop's variable, if a let does)
        self.bound = {loop.var} | self.rebound  # names never folded in (hoist.hoisted)
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self.reads: list[str] = []  # `n3 = b[0].orelse[0]` lines of make()
        self.statements = 0

    def const(self, value: Any) -> str:
        name = f"c{len(self.constants)}"
        self.constants[name] = value
        return name

    def node(self, path: str) -> str:
        name = f"n{len(self.reads)}"
        self.reads.append(f"{name} = {path}")
        return name

    def expr(self, path: str) -> str:
        name = f"e{len(self.reads)}"
        self.reads.append(f"{name} = closure({path})")
        return name

    def emit(self, depth: int, line: str) -> None:
        if depth > MAX_DEPTH:
            raise _TooBig
        self.lines.append("    " * depth + line)

    def charge(self, depth: int, span: ast.Span) -> None:
        """One statement or round counted, as the interpreter counts it (the span it names): in `left`,
        budget.left's copy while the function runs (written back when it calls what counts, and when it
        ends or fails)."""
        self.emit(depth, "left -= 1")
        self.emit(depth, f"if left < 0: raise EvalError(budget.refusal(), {self.const(span)})")

    def call(self, depth: int, call: str) -> None:
        """A call to what counts statements itself (_ProgramRun's methods), the budget handed over and back."""
        self.emit(depth, "budget.left = left")
        self.emit(depth, "try:")
        self.emit(depth + 1, call)
        self.emit(depth, "finally:")
        self.emit(depth + 1, "left = budget.left")

    def body(self, body: tuple[ast.Stmt, ...], path: str, env: str, depth: int) -> None:
        """A body as _ProgramRun.run runs it: a scope of its own if it has a `let`, each statement counted."""
        self.statements += len(body)
        if self.statements > MAX_STATEMENTS:
            raise _TooBig
        if any(type(stmt) is ast.Let for stmt in body):
            inner = f"env{depth}"
            self.emit(depth, f"{inner} = dict({env})")
            env = inner
        for n, stmt in enumerate(body):
            self.charge(depth, stmt.span)
            self.STATEMENTS[type(stmt)](self, stmt, f"{path}[{n}]", env, depth)
        if not body:
            self.emit(depth, "pass")

    def let(self, stmt: ast.Let, path: str, env: str, depth: int) -> None:
        self.emit(depth, f"{env}[{stmt.name!r}] = {self.expr(path + '.value')}({env})")

    def loop(self, stmt: ast.Loop, path: str, env: str, depth: int) -> None:
        self.call(depth, f"run._loop({self.node(path)}, {env})")

    def when(self, stmt: ast.When, path: str, env: str, depth: int) -> None:
        """`if`, and its `else if`s: each one's test counted as a statement, as _ProgramRun._when counts it."""
        self.emit(depth, f"if {self.test(stmt.test, path + '.test', env)}:")
        self.body(stmt.then, path + ".then", env, depth + 1)
        self.emit(depth, "else:")
        orelse = stmt.orelse
        if len(orelse) == 1 and type(orelse[0]) is ast.When:
            self.charge(depth + 1, orelse[0].span)
            self.when(orelse[0], path + ".orelse[0]", env, depth + 1)
        else:
            self.body(orelse, path + ".orelse", env, depth + 1)

    def test(self, test: ast.Expr, path: str, env: str) -> str:
        """An if's test: a conjunction of one name's comparisons with numbers (`t % 6 == 2 and t >= 2`,
        once the invariants are folded in) as Python's comparisons while the name holds an int, as
        expr._conjunction compares; any other test (or entry) by its closure."""
        shape = _shape(test)
        if shape is None or len({name for name, _, _ in shape}) != 1:
            return f"{self.expr(path)}({env})"
        fast, values = f"f{len(self.reads)}", [f"v{len(self.reads)}_{n}" for n in range(2 * len(shape))]
        self.reads.append(f"{fast}, ({', '.join(values)},) = atom_values({path}, {self.const(shape)})")
        closure, counter = self.expr(path), self.counter(shape[0][0])
        x = "k" if counter else "x"
        parts = " and ".join(f"{x} {op} {values[2 * n + 1]}" if not mod else f"{x} % {values[2 * n]} {op} {values[2 * n + 1]}"
                             for n, (_, mod, op) in enumerate(shape))
        if counter:
            return f"(({parts}) if {fast} else {closure}({env}))"
        return f"(({parts}) if {fast} and type(x := {env}.get({shape[0][0]!r})) is int else {closure}({env}))"

    def counter(self, name: str) -> bool:
        """Whether `name` is the loop's variable, which no let rebinds: in each round the int k."""
        return name == self.var and name not in self.rebound

    def item(self, stmt: ast.Item, path: str, env: str, depth: int) -> None:
        """`X at t` and `X? at t` (no repeat) inline; any other item by _ProgramRun._item."""
        if stmt.repeat is not None or (type(stmt.unit) is not ast.Cursor and not stmt.optional):
            self.call(depth, f"run._item({self.node(path)}, {env})")
            return
        if stmt.when is not None:
            self.emit(depth, f"if {self.expr(path + '.when')}({env}):")
            depth += 1
        if stmt.slot is not None:
            self.slot(stmt.slot, path + ".slot", env, depth)
        if stmt.optional:
            self.emit(depth, "run.lenient += 1")
            self.emit(depth, "try:")
            self.charge(depth + 1, stmt.span)
            self.optional(stmt.unit, path + ".unit", env, depth + 1)
            self.emit(depth, "finally:")
            self.emit(depth + 1, "run.lenient -= 1")
        else:
            self.charge(depth, stmt.span)
            self.cursor(stmt.unit, path + ".unit", env, depth)

    def slot(self, slot: ast.Expr, path: str, env: str, depth: int) -> None:
        """`at slot`: read as _ProgramRun._item reads it (an int in range as it is, anything else as
        evaluate_int gives it), then _ProgramRun._at."""
        node = self.node(path)
        if type(slot) is ast.Name and self.counter(slot.id):
            self.emit(depth, "s = k")  # an int within MAX_INT (evaluate_int bounds the loop's ends)
        else:
            if type(slot) is ast.Name and slot.id in self.bound:  # never folded: read as _item's fast path reads it
                self.emit(depth, f"s = {env}.get({slot.id!r})")
            else:
                self.emit(depth, f"s = {self.expr(path)}({env})")
            self.emit(depth, f"if type(s) is not int or not {-MAX_INT} <= s <= {MAX_INT}: "
                             f"s = evaluate_int({node}, {env}, 'slot')")
        self.emit(depth, f"if s < run.next_slot: run._at(s, {self.const(slot.span)})")
        self.emit(depth, "run.next_slot = s")

    def cursor(self, cursor: ast.Cursor, path: str, env: str, depth: int) -> None:
        """A pop: a plain one inline, its empty queue's report (or an optional's nothing) by
        _ProgramRun._cursor; any other by _cursor."""
        node = self.node(path)
        if not _plain(cursor):
            self.emit(depth, f"run._cursor({node}, {env})")
            return
        self.pop(cursor, depth)
        self.emit(depth, f"if op is None: run._cursor({node}, {env})")
        self.emit(depth, "else:")
        self.take(cursor, depth + 1)

    def optional(self, unit: ast.Unit, path: str, env: str, depth: int) -> None:
        """`X?` and `(X | Y)?` of plain cursors inline (the first that pops, or none), as _cursor and
        _choice pop them while the item is optional; any other unit by its _ProgramRun method."""
        options = (unit,) if type(unit) is ast.Cursor else unit.options if type(unit) is ast.Choice else ()
        if not options or not all(map(_plain, options)):
            self.call(depth, f"{self.const(self.units[type(unit)])}(run, {self.node(path)}, {env})")
            return
        for cursor in options:
            self.pop(cursor, depth)
            self.emit(depth, "if op is not None:")
            self.take(cursor, depth + 1)
            self.emit(depth, "else:")
            depth += 1
        self.emit(depth, "pass")

    def pop(self, cursor: ast.Cursor, depth: int) -> None:
        """`op = ` the plain cursor's pop (None: nothing to pop), as _ProgramRun._cursor pops it."""
        chunk = None if cursor.chunk is None else cursor.chunk.value
        if self.mixed and cursor.kind == _W:
            self.emit(depth, f"op = run.mixed.pop_weight(run.pipelines, None, {chunk!r}, run.chunk)")
            return
        kind = _B if self.mixed and cursor.kind == _I else cursor.kind  # order._queued
        self.emit(depth, f"q = queues[{self.const((kind, None, chunk))}]")
        self.emit(depth, "op = q.pop(taken) if q else None")
        if self.mixed and cursor.kind in GRADIENT:
            self.emit(depth, f"if op is not None: op = run.mixed.choose(op, {cursor.kind!r}, taken)")

    def take(self, cursor: ast.Cursor, depth: int) -> None:
        """_ProgramRun._take of `op`, placed by this cursor."""
        for line in ("taken.add(id(op))", "order.append(op)", f"spans.append({self.const(cursor.span)})",
                     "slots.append(run.next_slot)", "run.next_slot += 1", "if op.kind in until: raise run.ENOUGH"):
            self.emit(depth, line)

    STATEMENTS = {ast.Let: let, ast.Loop: loop, ast.When: when, ast.Item: item}


_MADE: dict[tuple[int, bool], tuple[ast.Loop, Callable | None]] = {}  # (id(loop), mixed) -> (loop, make)
_MADE_MAX = 1024


def compiled(loop: ast.Loop, mixed: bool, units: dict) -> Callable | None:
    """make(body) -> rounds(run, scope, start, stop) for the loop (its body given per entry: the same
    shape as the loop's own), or None where the body is too large for one function. `units`:
    _ProgramRun's methods per unit type, `mixed`: whether the programs have a mixed backward."""
    entry = _MADE.get((id(loop), mixed))
    if entry is None or entry[0] is not loop:
        if len(_MADE) >= _MADE_MAX:
            _MADE.clear()
        entry = _MADE[(id(loop), mixed)] = (loop, _make(loop, mixed, units))
    return entry[1]


def _make(loop: ast.Loop, mixed: bool, units: dict) -> Callable | None:
    source = _Source(loop, mixed, units)
    try:
        source.emit(2, "left = budget.left")
        source.emit(2, "try:")
        source.emit(3, "for k in range(start, stop):")
        source.charge(4, loop.span)
        source.emit(4, f"scope[{loop.var!r}] = k")
        source.body(loop.body, "b", "scope", 4)
        source.emit(2, "finally:")
        source.emit(3, "budget.left = left")
    except _TooBig:
        return None
    text = "\n".join([
        "def make(b):",
        *("    " + line for line in source.reads),
        "    def rounds(run, scope, start, stop):",
        "        budget, queues, taken, until = run.budget, run.queues, run.taken, run.until",
        "        order, spans, slots = run.order, run.spans, run.slots",
        *source.lines,
        "    return rounds",
    ])
    namespace = {"closure": closure, "atom_values": atom_values, "EvalError": EvalError,
                 "evaluate_int": evaluate_int, **source.constants}
    exec(compile(text, f"<loop at line {loop.span.line}>", "exec"), namespace)
    return namespace["make"]
