"""The text of a `.sched` string literal: one rule for its escapes."""
from __future__ import annotations

import re

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)")


def _unescape(match: re.Match) -> str:
    code = match.group(1)
    if code[0] in "ux" and len(code) > 1:
        point = int(code[1:], 16)
        return match.group(0) if 0xD800 <= point <= 0xDFFF else chr(point)  # no lone surrogates
    return _ESCAPES.get(code, match.group(0))  # an unknown escape stays as written


def string_text(tok: str | None) -> str:
    """A STRING token's text (quotes included): its backslash escapes (newline, tab, return, quote,
    backslash, xHH, uHHHH) decoded, every other character as written (non-ASCII text included, not read as Latin-1)."""
    return "" if tok is None else _ESCAPE.sub(_unescape, tok[1:-1])
