"""Parsing: load the grammar (schedc/grammars/sched.lark) once, parse text, build the AST with spans.

Lark's exceptions are translated here into located diagnostics; nothing from Lark reaches the user.
"""
from __future__ import annotations

import bisect
import codecs
import re
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import (LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken,
                             VisitError)

from . import ast
from .strings import string_text as _string
from .brackets import line_column, unclosed_bracket, unmatched_paren
from ..diagnostics import USAGE, SchedError, Source, Span, error
from ..inputs import decode, read_bytes
from ..text import listed

GRAMMAR_PACKAGE = "schedc.grammars"
GRAMMAR_FILE = "sched.lark"
MAX_SOURCE_BYTES = 4 * 1024 * 1024
MAX_NESTING = 200
MAX_DIGITS = 18  # an integer literal of more digits is refused (schedules count far below 10^18)


@lru_cache(maxsize=1)
def parser() -> Lark:
    """The LALR parser, its tables cached on disk by Lark between processes."""
    text = resources.files(GRAMMAR_PACKAGE).joinpath(GRAMMAR_FILE).read_text()
    return Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=True, cache=True)


def _span(meta) -> Span:
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _name_or_path(tok: Token) -> str:
    return _string(tok) if tok.type == "STRING" else str(tok)


_SPACE = "[ \t\f\r\n]*"  # the grammar's whitespace (WS), no other
_OP_LITERAL = re.compile(rf"{_SPACE}([A-Za-z_][A-Za-z_0-9]*)(?:\.([A-Za-z_][A-Za-z_0-9]*))?\({_SPACE}([0-9]+){_SPACE},"
                         rf"{_SPACE}([0-9]+){_SPACE}\)")


def _integer(text: str, span: Span) -> ast.Num:
    if len(text.lstrip("0")) > MAX_DIGITS:
        raise _Refused(f"integer {text[:12]}... has {len(text)} digits (at most {MAX_DIGITS})", span)
    return ast.Num(span, int(text))


def _positions(tok: Token) -> Callable[[int], tuple[int, int]]:
    """(line, column) of an offset into the token's text, from the token's own position."""
    newlines = [k for k, char in enumerate(tok) if char == "\n"]

    def at(offset: int) -> tuple[int, int]:
        before = bisect.bisect_left(newlines, offset)
        return tok.line + before, (offset - newlines[before - 1] if before else tok.column + offset)
    return at


class _Run(list):
    """The items of a literal run, spliced into the block or group that holds it."""


def _flat(children: list) -> tuple:
    return tuple(x for child in children for x in (child if isinstance(child, _Run) else (child,)))


class _Refused(Exception):
    """A construct the grammar admits but the language refuses (an integer literal of 400 digits), raised
    inside the Transformer with its span and reported by parse_source as a located syntax error."""

    def __init__(self, message: str, span: Span):
        super().__init__(message)
        self.message, self.span = message, span


@v_args(meta=True)
class ToAst(Transformer):
    """One method per grammar rule; each returns an AST node with its span."""

    # expressions
    def number(self, meta, children):
        tok, span = children[0], _span(meta)
        if tok.type == "INT":
            return _integer(tok, span)
        value = float(tok)
        if value == float("inf"):
            raise _Refused(f"number {tok} is too large to be a finite number", span)
        return ast.Num(span, value)

    def name(self, meta, children):
        return ast.Name(_span(meta), str(children[0]))

    def star(self, meta, children):
        return ast.Star(_span(meta))

    def cond(self, meta, children):
        then, test, orelse = children
        return ast.Cond(_span(meta), test, then, orelse)

    def or_(self, meta, children):
        return ast.Binary(_span(meta), "or", *children)

    def and_(self, meta, children):
        return ast.Binary(_span(meta), "and", *children)

    def not_(self, meta, children):
        return ast.Unary(_span(meta), "not", children[0])

    def neg(self, meta, children):
        return ast.Unary(_span(meta), "-", children[0])

    def compare(self, meta, children):
        left, op, right = children
        return ast.Binary(_span(meta), str(op), left, right)

    binary = compare

    def pow(self, meta, children):
        return ast.Binary(_span(meta), "**", children[0], children[2])

    def kinds(self, meta, children):
        return ast.Kinds(_span(meta), tuple(str(c) for c in children))

    def call(self, meta, children):
        func, *args = children
        return ast.Call(_span(meta), str(func).strip(), tuple(args))

    # programs
    def cursor(self, meta, children):
        kind, pipe, chunk, args = children
        return ast.Cursor(_span(meta), str(kind), pipe and str(pipe), args, chunk)

    def chunk(self, meta, children):
        return children[0]

    def overlap(self, meta, children):
        return ast.Overlap(_span(meta), *children)

    def choice(self, meta, children):
        return ast.Choice(_span(meta), tuple(children))

    def optional(self, meta, children):
        return True

    def args(self, meta, children):
        return tuple(children)

    def group(self, meta, children):
        return ast.Group(_span(meta), _flat(children))

    def literal_run(self, meta, children):
        """`F(0, 3) B.up(2, 5) ...` lexed as one token: the items the general rule builds, spans alike."""
        tok = children[0]
        at = _positions(tok)
        out, position = [], 0
        while position < len(tok):  # OP_RUN matched the whole token: every op is read, none skipped
            match = _OP_LITERAL.match(tok, position)
            if match is None:  # the grammar's OP_RUN and _OP_LITERAL disagree: refused, never skipped
                raise _Refused("cannot read this op list", Span(*at(position), *at(len(tok))))
            position = match.end()
            span = Span(*at(match.start(1)), *at(match.end()))
            args = tuple(_integer(match[k], Span(*at(match.start(k)), *at(match.end(k)))) for k in (3, 4))
            out.append(ast.Item(span, ast.Cursor(span, match[1], match[2], args, None), None, None))
        return _Run(out)

    def item(self, meta, children):
        unit, optional, repeat, slot, when = children
        return ast.Item(_span(meta), unit, repeat, when, bool(optional), slot)

    def repeat(self, meta, children):
        return children[0]

    condition = repeat_split = slot = repeat

    def let(self, meta, children):
        return ast.Let(_span(meta), str(children[0]), children[1])

    def block(self, meta, children):
        return _flat(children)

    def loop(self, meta, children):
        var, start, stop, body = children
        return ast.Loop(_span(meta), str(var), start, stop, body)

    def when(self, meta, children):
        test, then, orelse = children
        if isinstance(orelse, ast.When):
            orelse = (orelse,)
        return ast.When(_span(meta), test, then, orelse or ())

    # declarations
    def header(self, meta, children):
        return str(children[0]), _string(children[1]), False

    def addon_header(self, meta, children):
        return str(children[0]), _string(children[1]), True

    def extends(self, meta, children):
        return ast.Extends(_span(meta), _name_or_path(children[0]))

    def use(self, meta, children):
        addon = _name_or_path(children[0])
        return ast.Use(_span(meta), addon, str(children[1]) if children[1] else Path(addon).stem)

    def param(self, meta, children):
        name, default, doc = children
        return ast.Param(_span(meta), str(name), default, _string(doc))

    def require(self, meta, children):
        return ast.Require(_span(meta), children[0], _string(children[1]))

    def devices(self, meta, children):
        return ast.Devices(_span(meta), children[0])

    def stages(self, meta, children):
        return ("stages", children[0])

    def placement(self, meta, children):
        return ("placement", (str(children[0]), children[1], _span(meta)))

    def microbatches(self, meta, children):
        start, stop, chunks = children
        return ("microbatches", ((start, stop) if stop is not None else (None, start), chunks))

    def chunks(self, meta, children):
        return children[0]

    def pipeline(self, meta, children):
        name, *fields = children
        found = dict(fields)
        var, place, place_span = found.get("placement", ("s", None, None))
        (start, stop), chunks = found.get("microbatches", ((None, None), None))
        return ast.PipelineDecl(_span(meta), str(name), found.get("stages"), var, place, place_span,
                                start, stop, chunks)

    def replicate(self, meta, children):
        return ast.Replicate(_span(meta), tuple(str(c) for c in children))

    def cost(self, meta, children):
        kind, var, value = children
        return ast.CostDecl(_span(meta), str(kind), var and str(var), value)

    def memory(self, meta, children):
        kind, var, value = children
        return ast.MemoryDecl(_span(meta), str(kind), var and str(var), value)

    def limit(self, meta, children):
        return ast.Limit(_span(meta), children[0])

    def host_limit(self, meta, children):
        return ast.HostLimit(_span(meta), children[0])

    def offload(self, meta, children):
        return ast.Offload(_span(meta), str(children[0]))

    def split_backward(self, meta, children):
        return ast.SplitBackward(_span(meta))

    def recompute(self, meta, children):
        return ast.Recompute(_span(meta), str(children[0]))

    def mixed_backward(self, meta, children):
        return ast.MixedBackward(_span(meta))

    def squeeze(self, meta, children):
        return ast.Squeeze(_span(meta))

    def key(self, meta, children):
        return tuple(children)

    def queue(self, meta, children):
        kind, pipe, key = children
        return ast.QueueDecl(_span(meta), str(kind), pipe and str(pipe), key)

    def program(self, meta, children):
        target, body = children
        if target.type == "INT":
            return ast.Program(_span(meta), None, int(target), body)
        return ast.Program(_span(meta), str(target), None, body)

    def greedy(self, meta, children):
        key, inflight = children
        return ast.Greedy(_span(meta), key, inflight)

    def dep(self, meta, children):
        return ast.Dep(_span(meta), str(children[0]), tuple(children[1:]))

    def after(self, meta, children):
        return ("after", tuple(children))

    def keeps(self, meta, children):
        return ("keeps", tuple(children))

    def split(self, meta, children):
        return ("split", children[0])

    def at_end(self, meta, children):
        return ("at_end", True)

    def task(self, meta, children):
        name, *rest = children
        params = []
        while rest and (rest[0] is None or isinstance(rest[0], Token)):
            tok = rest.pop(0)
            if tok is not None:
                params.append(str(tok))
        cost = rest.pop(0) if rest and not isinstance(rest[0], tuple) else None
        clauses: dict = {"after": (), "keeps": ()}
        for key, value in rest:
            clauses[key] = clauses.get(key, ()) + value if key in ("after", "keeps") else value
        return ast.TaskDecl(_span(meta), str(name), tuple(params), cost, clauses["after"], clauses["keeps"],
                            clauses.get("split"), bool(clauses.get("at_end")))

    def fill_item(self, meta, children):
        return ast.FillItem(_span(meta), str(children[0]), children[1])

    def fill(self, meta, children):
        return ast.Fill(_span(meta), tuple(children))

    def start(self, meta, children):
        (name, doc, addon), *decls = children
        return ast.ScheduleDecl(_span(meta), name, doc, tuple(decls), addon)


_READABLE = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string",
    "LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('", "RPAR": "')'", "SEMICOLON": "';'", "COMMA": "','",
    "EQUAL": "'='", "COMPARE": "a comparison", "ADD_OP": "'+' or '-'", "MUL_OP": "an operator",
    "FUNC": "a function", "$END": "end of file", "DOT": "'.'", "STAR": "'*'", "MINUS": "'-'",
}


def _readable(terminal: str) -> str:
    if terminal in _READABLE:
        return _READABLE[terminal]
    pattern = parser().get_terminal(terminal).pattern
    return f"'{pattern.value}'" if pattern.type == "str" else terminal.lower()


def _syntax_error(exc: UnexpectedInput, source: Source) -> SchedError:
    line, column = max(exc.line, 1), max(exc.column, 1)
    if isinstance(exc, UnexpectedCharacters):
        message = f"unexpected character {source.text[exc.pos_in_stream]!r}"
    elif isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        message = "unexpected end of file"
        lines = source.text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    else:
        message = f"unexpected {exc.token.type and repr(str(exc.token)) or 'token'}"
    terminals = set(getattr(exc, "expected", None) or ())
    expected = sorted({_readable(t) for t in terminals - {"OP_RUN"}})  # a run of ops starts with a name
    if expected:
        message += ", expected " + (expected[0] if len(expected) == 1 else "one of " + listed(expected))
    at_end = message == "unexpected end of file"
    opening = unclosed_bracket(source.text, len(source.text) if at_end else exc.pos_in_stream, terminals, at_end)
    if opening is not None:  # the parser stopped past a bracket never closed: that bracket is the error
        where = Span(*line_column(source.text, opening), *line_column(source.text, opening + 1))
        return SchedError(error(f"{source.text[opening]!r} is not closed", where,
                                notes=(f"{source.path}:{line}:{column}: the parser stopped here: {message}",)),
                          source, kind=USAGE)
    notes = _ambiguity_hints(exc, source, terminals)
    return SchedError(error(message, Span(line, column, line, column + 1), notes=notes), source, kind=USAGE)


_CURSOR_THEN_PAREN = re.compile(r"([A-Za-z_][A-Za-z_0-9.]*)(?:\[[^\[\]()]*\])?\s+\($")  # F (, B[0] (
_NOT_CURSORS = {"min", "max", "ceil", "floor", "abs", "require", "param", "devices", "stages", "microbatches",
                "limit", "memory", "cost", "inflight", "by", "if", "else", "and", "or", "not", "in", "split",
                "after", "keeps", "let"}
_ITEM_THEN_IF = re.compile(r"\bif\b[^;{}()]*$")


def _ambiguity_hints(exc: UnexpectedInput, source: Source, terminals: set[str]) -> tuple[str, ...]:
    """Explain the two places where the grammar reads the longer way (see schedc/grammars/sched.lark)."""
    if not isinstance(exc, UnexpectedToken) or exc.token.type == "$END":
        return ()
    before = source.text[: exc.pos_in_stream]
    inside_args = {"RPAR", "COMMA"} <= terminals  # `F (F B)`: only these; `F (F & B)`, `(B[1] | B[0])`: more
    if inside_args and (terminals <= {"RPAR", "COMMA"} or str(exc.token) in ("&", "|", "?", "[")):  # a program's
        opening = unmatched_paren(before)
        cursor = _CURSOR_THEN_PAREN.search(before[: opening + 1]) if opening is not None else None
        if cursor and cursor.group(1) not in _NOT_CURSORS:
            return ("a '(' right after an op is read as its arguments, as in F(0, 1); "
                    "put ';' before a group that follows an op: F ; (F B)",)
    found = _ITEM_THEN_IF.search(before) if exc.token.type == "LBRACE" else None
    if found:
        statement = before[max(before.rfind(c, 0, found.start()) for c in ";{}") + 1:found.start()].split()
        if statement[:1] == ["let"]:  # `let x = e if c else d`: the if continues the let's value
            return ("an 'if' right after a let's value is read as part of it (let x = a if c else b); "
                    "put ';' before an if-statement that follows a let: let x = 1 ; if k > 0 { F }",)
        return ("an 'if' right after an item is read as that item's condition (B if k > 0); "
                "put ';' before an if-statement that follows an item: B ; if k > 0 { F }",)
    count = _REPEAT_COUNT.search(before)
    if count and str(exc.token) in _OPERATORS:
        rest = _REST_OF_COUNT.match(source.text, exc.pos_in_stream).group(0).strip()
        return (f"a repeat count is one atom (a name, a number or a parenthesized expression): "
                f"write * ({count.group(1)} {rest}), not * {count.group(1)} {rest}",)
    return ()


_REPEAT_COUNT = re.compile(r"[\w)\]]\s*\*\s*([A-Za-z_]\w*|\d+(?:\.\d+)?)\s*$")  # `F * m` just before
_OPERATORS = {"+", "-", "*", "/", "//", "%", "**"}
_REST_OF_COUNT = re.compile(r"[^;{}\n]*?(?=\s+if\b|\s+at\b|[;{}\n]|$)")


def decode_source(data: bytes, path: str) -> Source:
    """Decode a file's bytes, refusing non-UTF-8 and oversized input with a located error. A leading
    byte-order mark (spreadsheet tools write one into a CSV) is dropped: columns count as an editor shows them."""
    if len(data.removeprefix(codecs.BOM_UTF8)) > MAX_SOURCE_BYTES:
        raise SchedError(error(f"file is larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB"),
                         Source(path, ""), kind=USAGE)
    return decode(data, path)


def _check_nesting(source: Source) -> None:
    depth = 0
    for number, line in enumerate(source.text.splitlines(), 1):
        for column, char in enumerate(line.split("#", 1)[0], 1):
            depth += char in "({"
            depth -= char in ")}"
            if depth > MAX_NESTING:
                raise SchedError(error(f"nesting deeper than {MAX_NESTING} levels",
                                       Span(number, column, number, column + 1)), source, kind=USAGE)


def parse_source(source: Source) -> ast.ScheduleDecl:
    """Parse a .sched text into its AST; syntax errors raise SchedError (exit code 2)."""
    if not source.text.strip():
        raise SchedError(error("empty file: expected 'schedule NAME \"description\"'", Span(1, 1, 1, 2)),
                         source, kind=USAGE)
    _check_nesting(source)
    try:
        tree = parser().parse(source.text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, source) from None
    except LarkError as exc:  # not raised by an LALR parse of text; translated all the same, never shown raw
        raise SchedError(error(f"cannot parse: {type(exc).__name__}", Span(1, 1, 1, 2)), source,
                         kind=USAGE) from None
    _check_depth(tree, source)
    try:
        return ToAst().transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, _Refused):
            raise SchedError(error(exc.orig_exc.message, exc.orig_exc.span), source, kind=USAGE) from None
        raise


def _check_depth(tree: Tree, source: Source) -> None:
    """Refuse a syntax tree deeper than MAX_NESTING (`- - - ... 1`, `1 + 1 + ... + 1`, `not not ...`
    nest without brackets), at its deepest node, before the recursive passes over it run out of stack."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            meta = node.meta
            line, column = getattr(meta, "line", 1), getattr(meta, "column", 1)
            raise SchedError(error(f"expression or program nested deeper than {MAX_NESTING} levels (each operator "
                                   "of a chain like 1 + 1 + ... + 1 nests one level)",
                                   Span(line, column, line, column + 1)), source, kind=USAGE)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


def read_source(path: str | Path) -> Source:
    """Read a schedule file (through schedc.inputs: a regular file only, at most MAX_SOURCE_BYTES); a
    missing or unreadable file is a usage error (exit 2)."""
    try:
        data = read_bytes(path, "file", MAX_SOURCE_BYTES)
    except SchedError as exc:
        if not Path(path).exists():
            raise SchedError(error(exc.diagnostics[0].message + _library_hint(Path(path))),
                             Source(str(path), ""), kind=USAGE) from None
        raise
    return decode_source(data, str(path))


def _library_hint(path: Path) -> str:
    """For a bare name that is no file: the library names nearest to it (`1f1bb`: did you mean 1f1b?)."""
    if path.exists() or len(path.parts) > 1 or path.suffix not in ("", ".sched"):
        return ""
    from difflib import get_close_matches
    from .library import library_addons, library_files
    near = get_close_matches(path.stem, [p.stem for p in (*library_files(), *library_addons())], n=3)
    return ("; and no library schedule is named so" + (f" (did you mean {', '.join(near)}?)" if near else "")
            + "; `schedc list` shows them")
