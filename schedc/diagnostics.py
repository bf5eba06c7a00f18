"""Diagnostics: located errors and warnings, printed compiler-style with the source line and a caret."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache

from .text import MAX_SHOWN


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True, slots=True)
class Source:
    """A source file's name and text; spans point into it."""

    path: str
    text: str

    def line(self, number: int) -> str:
        lines = _lines(self.text)
        return lines[number - 1] if 0 < number <= len(lines) else ""


@dataclass(frozen=True, slots=True)
class Span:
    """A 1-based line/column range in a source file: the one a diagnostic is reported against, unless
    the span names its own (a declaration a schedule took from another file: `extends`, `use`)."""

    line: int
    column: int
    end_line: int = 0
    end_column: int = 0
    source: Source | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    severity: Severity
    message: str
    span: Span | None = None
    notes: tuple[str, ...] = ()
    detail: str = ""  # a block shown after the caret, e.g. a rank x step grid
    # a check of a lowered plan names the instruction at fault: (rank, step program, index in it; None
    # when the fault is the rank's as a whole), so a front end that made the plan can locate it
    at: tuple[int, int, int | None] | None = None
    # a check of a schedule's orders names the ops at fault: (device, position in its order, role), the
    # role "stuck" (a device stopped there) or "awaited" (what a stuck device waits for); the timeline
    # draws them
    ops: tuple[tuple[int, int, str], ...] = ()

    def to_json(self, source: Source | None) -> dict:
        """The diagnostic as `simulate --json` prints it: severity, message, file, line and column
        (null where it has no place), notes."""
        source = (self.span.source if self.span else None) or source
        return {"severity": self.severity.value, "message": self.message,
                "file": source.path if source else None, "line": self.span.line if self.span else None,
                "column": self.span.column if self.span else None, "notes": list(self.notes)}

    def format(self, source: Source | None) -> str:
        source = (self.span.source if self.span else None) or source
        where = source.path if source else "<input>"
        if self.span:
            where += f":{self.span}"
        out = [f"{where}: {self.severity.value}: {self.message}"]
        if self.span and source:
            text = source.line(self.span.line)
            if text:
                width = max(1, (self.span.end_column - self.span.column)
                            if self.span.end_line == self.span.line else 1)
                shown, column = _window(text.replace("\t", " "), self.span.column)
                out.append("  " + shown)
                out.append("  " + " " * (column - 1) + "^" + "~" * (min(width, len(shown) - column + 1) - 1))
        out.extend(f"  note: {note}" for note in self.notes)
        if self.detail:
            out.append(self.detail)
        return "\n".join(out)


LINE_WIDTH = 120  # at most this much of a source line is shown (a CSV row may hold 100,000 cells)


def _window(text: str, column: int) -> tuple[str, int]:
    """The part of a long line around `column` (1-based), with '...' where it was cut, and the column
    of the same character in it."""
    if len(text) <= LINE_WIDTH:
        return text, column
    start = max(0, min(column - 1 - LINE_WIDTH // 3, len(text) - LINE_WIDTH))
    shown = text[start:start + LINE_WIDTH]
    head = "..." if start else ""
    tail = "..." if start + LINE_WIDTH < len(text) else ""
    return head + shown + tail, column - start + len(head)


def error(message: str, span: Span | None = None, notes: tuple[str, ...] = (), detail: str = "",
          at: tuple[int, int, int | None] | None = None, ops: tuple[tuple[int, int, str], ...] = ()) -> Diagnostic:
    return Diagnostic(Severity.ERROR, message, span, notes, detail, at, ops)


def warning(message: str, span: Span | None = None) -> Diagnostic:
    return Diagnostic(Severity.WARNING, message, span)


@lru_cache(maxsize=8)
def _lines(text: str) -> tuple[str, ...]:
    """A source's lines, split once (each of 20,000 diagnostics split the whole file again)."""
    return tuple(text.splitlines())


_NUMBERS = re.compile(r"\d+")


def capped(diagnostics: list[Diagnostic], limit: int = MAX_SHOWN) -> list[Diagnostic]:
    """The diagnostics to show: at most `limit` of each kind (the same message but for its numbers, as
    'F(0,3) runs twice ...' and 'F(0,4) runs twice ...'), then one 'and N more like this' per kind,
    where its first left-out one was. The order is kept."""
    seen: dict[tuple, int] = {}
    shown, extra = [], {}
    for diag in diagnostics:
        kind = (diag.severity, _NUMBERS.sub("#", diag.message))
        seen[kind] = seen.get(kind, 0) + 1
        if seen[kind] <= limit:
            shown.append(diag)
        elif kind not in extra:
            extra[kind] = len(shown)
            shown.append(diag)  # replaced below by the count
    for kind, position in extra.items():
        rest = seen[kind] - limit
        first = shown[position]
        shown[position] = Diagnostic(first.severity, f"and {rest:,} more like this ({first.message})", first.span,
                                     at=first.at)
    return shown


# What a SchedError is about, and the command line's exit code for it (decided here, nowhere else): a
# usage or syntax error (the options, a file that cannot be read as what it claims to be), or a schedule
# that reads but is wrong.
USAGE, SCHEDULE = "usage", "schedule"
EXIT_CODES = {SCHEDULE: 1, USAGE: 2}


class SchedError(Exception):
    """The compiler's one user error, carrying diagnostics; `kind` USAGE or SCHEDULE (EXIT_CODES)."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic, source: Source | None = None,
                 kind: str = SCHEDULE):
        self.diagnostics = [diagnostics] if isinstance(diagnostics, Diagnostic) else list(diagnostics)
        self.source = source
        self.kind = kind
        super().__init__(self.render())

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.kind]

    def render(self) -> str:
        return "\n".join(d.format(self.source) for d in capped(self.diagnostics))


def has_errors(diagnostics: list[Diagnostic]) -> bool:
    return any(d.severity is Severity.ERROR for d in diagnostics)


def exit_code(diagnostics: list[Diagnostic]) -> int:
    """The command line's exit code for a schedule with these diagnostics: a wrong schedule's when one
    is an error, else 0 (a SchedError carries its own kind)."""
    return EXIT_CODES[SCHEDULE] if has_errors(diagnostics) else 0


OPTIONS = Source("schedc", "")  # where errors in command-line options are reported


def usage(message: str) -> SchedError:
    """A usage error (exit 2) about the command line's options."""
    return SchedError(error(message), OPTIONS, kind=USAGE)
