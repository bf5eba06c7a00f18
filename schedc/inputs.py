"""Reading an input file, the one way every file the compiler takes is read (a .sched schedule, a torch
CSV, a plan.json, a costs JSON, a measured trace, a model or cluster TOML, a profile CSV): a regular
file only (a FIFO, a device or a directory is refused by name before it is opened, so `--model
/dev/zero` neither hangs nor fills memory), at most MAX_BYTES read, UTF-8, and for JSON and TOML a
nesting depth and an integer length checked before the parser or int() would fail on them. Every
refusal is a usage error (exit 2) at its file, and at the line and column where the text is at fault.

    read_source("model.toml", "model")     -> Source (path, text)
    load_json(source, "costs")             -> the parsed value
    load_toml(source, "model")             -> the parsed table
"""
from __future__ import annotations

import codecs
import json
import os
import re
import stat
from pathlib import Path

from .diagnostics import USAGE, SchedError, Source, Span, error

MAX_BYTES = 256 * 2**20  # an input file: far past any plan a compile writes, far below the memory it would take
MAX_DESCRIPTION_BYTES = 16 * 2**20  # a model, cluster, costs or profile file: a few hundred bytes written by hand
MAX_DEPTH = 64           # arrays and tables nested in a JSON or TOML file; no schedc file nests more than 5
MAX_DIGITS = 40          # digits of an integer in a JSON or TOML file; no count or size comes near 10^40

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def refuse(message: str, source: Source, span: Span | None = None) -> SchedError:
    """The one form of an input's refusal: a usage error at the file (and the span, where known)."""
    return SchedError(error(message, span), source, kind=USAGE)


def read_bytes(path: str | Path, what: str, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; anything else refused naming what it is."""
    where = Source(str(path), "")
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        raise refuse(f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}", where) from None
    for test, name in _KINDS:
        if test(mode):
            raise refuse(f"cannot read {what}: {path} is {name}, not a file", where)
    try:
        with open(path, "rb") as stream:  # a size the kernel reports 0 for (/proc) is read to the limit
            data = stream.read(limit + 1)
    except OSError as exc:
        raise refuse(f"cannot read {what}: {exc.strerror or exc}", where) from None
    if len(data) > limit:
        raise refuse(f"{what} is larger than {_size(limit)}; refusing to read it", where)
    return data


def decode(data: bytes, path: str, what: str = "file") -> Source:
    """UTF-8 text (a leading byte-order mark, which spreadsheets write, dropped); a bad byte is located."""
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return Source(path, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise refuse(f"{what} is not valid UTF-8", Source(path, ""), Span(line, column, line, column + 1)) from None


def read_source(path: str | Path, what: str = "file", limit: int = MAX_BYTES) -> Source:
    """A regular file's text, as a Source (the path and the text the errors point into)."""
    return decode(read_bytes(path, what, limit), str(path), what)


# a string, a comment (TOML) or a bracket: strings and comments are stepped over whole
_BRACKETS = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]')
_LONG_INT = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|(?<![\w.])[-+]?\d[\d_]{%d,}+(?![.eE])' % MAX_DIGITS)


def _span(source: Source, offset: int, length: int = 1) -> Span:
    line = source.text.count("\n", 0, offset) + 1
    column = offset - (source.text.rfind("\n", 0, offset) + 1) + 1
    return Span(line, column, line, column + length)


_BRACKETS_ONLY = {c: None for c in range(128) if chr(c) not in "[]{}"}
_PAIR = re.compile(r"\[\]|\{\}")
_DIGITS_ONLY = str.maketrans("123456789", "000000000")


def _shallow(text: str) -> bool:
    """A fast first look: whether the brackets, strings and comments not told apart, nest no deeper
    than MAX_DEPTH (the innermost pairs peeled a level at a time by the regex engine: a plan of 20 MB
    takes a fraction of a second). A text that fails it gets the exact, located scan; one that passes
    it with brackets hidden in strings is still held by the parsers' own recursion limit, caught."""
    brackets = text.translate(_BRACKETS_ONLY) if text.isascii() else re.sub(r"[^\[\]{}]+", "", text)
    for _ in range(MAX_DEPTH + 1):
        brackets, peeled = _PAIR.subn("", brackets)
        if not brackets or not peeled:  # all peeled, or unbalanced: the parser says where
            return True
    return False


def check_depth(source: Source, what: str, headers: bool = False) -> None:
    """Refuse arrays or objects nested deeper than MAX_DEPTH, at the bracket that goes past it (before a
    recursive parser or walk runs out of stack). headers: a TOML file, whose `[table]` lines at the
    start of a line are names, not arrays."""
    if _shallow(source.text):
        return
    depth = 0
    for found in _BRACKETS.finditer(source.text):
        char = found.group()
        if char in "[{":
            if headers and depth == 0 and char == "[" and _starts_line(source.text, found.start()):
                continue
            depth += 1
            if depth > MAX_DEPTH:
                raise refuse(f"{what}: arrays or {'tables' if headers else 'objects'} nested deeper than {MAX_DEPTH} levels", source,
                             _span(source, found.start()))
        elif char in "]}":
            depth = max(0, depth - 1)


def _starts_line(text: str, offset: int) -> bool:
    start = text.rfind("\n", 0, offset) + 1
    return not text[start:offset].strip()


def check_digits(source: Source, what: str) -> None:
    """Refuse an integer of more than MAX_DIGITS digits where it is written (int() of thousands of digits
    stops at Python's int-to-str limit with a traceback, and no count or size needs them)."""
    if "0" * MAX_DIGITS not in source.text.translate(_DIGITS_ONLY):  # the common case, at C speed
        return
    for found in _LONG_INT.finditer(source.text):
        text = found.group()
        if text[0] in "\"'#":
            continue
        digits = sum(c.isdigit() for c in text)
        start = source.text.rfind("\n", 0, found.start()) + 1
        key = re.fullmatch(r'\s*"?([\w.-]+)"?\s*[=:]\s*', source.text[start:found.start()])
        named = f"'{key.group(1)}' is " if key else ""
        raise refuse(f"{what}: {named}an integer of {digits:,} digits (at most {MAX_DIGITS})", source,
                     _span(source, found.start(), len(text)))


def load_json(source: Source, what: str):
    """A JSON text's value, its depth and integers checked first; a syntax error at its line:column."""
    check_depth(source, what)
    check_digits(source, what)
    try:
        return json.loads(source.text)
    except json.JSONDecodeError as exc:
        raise refuse(f"cannot read {what}: {exc.msg}", source,
                     Span(exc.lineno, exc.colno, exc.lineno, exc.colno + 1)) from None
    except (RecursionError, ValueError) as exc:  # past the checks above (e.g. a float's exponent)
        raise refuse(f"cannot read {what}: {exc}", source) from None


def load_toml(source: Source, what: str) -> dict:
    """A TOML text's table, its depth and integers checked first; invalid TOML at its line:column."""
    import tomllib  # only the cost model reads TOML; compiles skip the import
    check_depth(source, what, headers=True)
    check_digits(source, what)
    try:
        return tomllib.loads(source.text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"line (\d+), column (\d+)", str(exc))
        lines = source.text.splitlines() or [""]
        span = Span(int(found.group(1)), int(found.group(2))) if found else Span(len(lines), len(lines[-1]) + 1)
        raise refuse(f"not valid TOML: {str(exc).split(' (at')[0]}", source, span) from None
    except (RecursionError, ValueError) as exc:
        raise refuse(f"cannot read {what}: {exc}", source) from None


def _size(nbytes: int) -> str:
    return f"{nbytes // 2**20:,} MiB"
