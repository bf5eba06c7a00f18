"""Where a key stands in a TOML description file (tomllib gives no positions): the scan every located
error of a model or cluster file points with, and the reading of such a file through schedc.inputs."""
from __future__ import annotations

import re
from pathlib import Path

from ..descriptions import code_given_as_model, known_models, resolve_model
from ..diagnostics import USAGE, Diagnostic, SchedError, Source, Span, error
from ..inputs import MAX_DESCRIPTION_BYTES, load_toml, read_source
from ..text import MAX_SHOWN


def read_toml(path: str | Path, what: str) -> tuple[dict, Source]:
    """A TOML file's table and its source, read through schedc.inputs (a regular file, its size, depth
    and integers capped); unreadable or invalid TOML is a located error (exit 2). A model description
    found neither as a file nor in the library says what the library holds."""
    if what == "model description" and not Path(path).exists():
        hint = code_given_as_model(str(path))
        message = hint or f"cannot read {what}: No such file or directory (the library's: {known_models()})"
        raise SchedError(error(message),
                         Source(str(path), ""), kind=USAGE)
    source = read_source(path, what, MAX_DESCRIPTION_BYTES)
    return load_toml(source, what), source


def locate(source: Source, key: str, table: str | None = None) -> Span:
    """Where `key = ...` stands in `[table]` (top level for None); the table's header when the key is
    not written there (a missing field), else the first line. tomllib gives no positions, so the text
    is scanned: headers `[name]`, keys `name =`, `"name" =` or dotted `table.name =`, and inline tables
    `table = { name = ... }`."""
    current, header = None, None
    for number, line in enumerate(source.text.splitlines(), 1):
        stripped = line.split("#", 1)[0].strip()
        heading = re.fullmatch(r"\[\s*([A-Za-z0-9_.\"-]+)\s*\]", stripped)
        if heading:
            current = heading.group(1).strip('"')
            if current == table:
                header = Span(number, line.index("[") + 1, number, line.index("]") + 2)
            if table is None and current == key:  # a top-level name that is a table: its header
                return Span(number, line.index("[") + 1, number, line.index("]") + 2)
            continue
        inline = re.match(rf"\s*(\"?{re.escape(table)}\"?)\s*=\s*\{{", line) if table and current is None else None
        if inline:  # table = { key = ..., ... } (one line, as TOML has it)
            inner = re.search(rf"[{{,]\s*(\"?{re.escape(key)}\"?)\s*=", line[inline.end() - 1:])
            if inner:
                column = inline.end() - 1 + inner.start(1) + 1
                return Span(number, column, number, column + len(inner.group(1)))
            header = header or Span(number, inline.start(1) + 1, number, inline.end(1) + 1)
            continue
        found = re.match(rf"\s*((?:{re.escape(table)}\s*\.\s*)?\"?{re.escape(key)}\"?)\s*=", line) if table else \
            re.match(rf"\s*(\"?{re.escape(key)}\"?)\s*=", line)
        if found and (current == table or (table and current is None and "." in found.group(1))):
            column = found.start(1) + 1
            return Span(number, column, number, column + len(found.group(1)))
    return header or Span(1, 1)


def unknown_keys(keys: list[str], message, where) -> list[Diagnostic]:
    """The errors of unknown keys: the first MAX_SHOWN located (each is a scan of the file), the rest
    counted in one, so that a file of 100,000 unknown keys is refused in a moment."""
    diags = [error(message(k), where(k)) for k in keys[:MAX_SHOWN]]
    if len(keys) > MAX_SHOWN:
        diags.append(error(f"... and {len(keys) - MAX_SHOWN:,} more unknown keys", where(keys[MAX_SHOWN])))
    return diags




def source_text(path: str) -> Source:
    """A model description's text for a located error: a path, or a library name's file (`mixtral-8x7b`)."""
    try:
        return read_source(resolve_model(path), "model", MAX_DESCRIPTION_BYTES)
    except SchedError:
        return Source(path, "")
