"""The bracket a syntax error leaves open. `let w = min(p - 1 - d, m` and a newline stops the parser on
the next line (`unexpected 'F'`); the mistake is the '(' that is never closed, so the error is put
there, with a note where the parser stopped."""
from __future__ import annotations

CLOSER = {"(": ")", "[": "]", "{": "}"}
TERMINAL = {"(": "RPAR", "[": "RSQB", "{": "RBRACE"}  # the grammar's names of the closers


def open_brackets(text: str) -> list[int]:
    """Where the brackets of `text` that stay open stand, outermost first. Comments (`#` to the end of
    the line) and strings are skipped; a closer that does not match the innermost open bracket closes
    nothing (it is the parser's to report)."""
    stack: list[int] = []
    position, size = 0, len(text)
    while position < size:
        char = text[position]
        if char == "#":
            position = _end_of(text, "\n", position)
        elif char == '"':
            position = _end_of(text, '"\n', position + 1)
        elif char in CLOSER:
            stack.append(position)
        elif stack and char == CLOSER[text[stack[-1]]]:
            stack.pop()
        position += 1
    return stack


def _end_of(text: str, stops: str, start: int) -> int:
    """The position of the first of `stops` at or after `start` (an escaped quote in a string skipped),
    or the end of the text."""
    position = start
    while position < len(text) and text[position] not in stops:
        position += 2 if text[position] == "\\" else 1
    return min(position, len(text))


def unclosed_bracket(text: str, stopped: int, expected: set[str], at_end: bool) -> int | None:
    """The position of the bracket to blame for a syntax error at offset `stopped`: the innermost one
    open there, when the whole text never closes it and the parser stopped on a later line where its
    closer would have been taken (or at the end of the file); None when no bracket is to blame."""
    before = open_brackets(text[:stopped])
    if not before or before[-1] not in open_brackets(text):
        return None
    opening = before[-1]
    later_line = "\n" in text[opening:stopped]
    if at_end or (later_line and TERMINAL[text[opening]] in expected):
        return opening
    return None


def line_column(text: str, offset: int) -> tuple[int, int]:
    """The 1-based line and column of an offset."""
    return text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)


def unmatched_paren(text: str) -> int | None:
    """The position of the last '(' of `text` that no later ')' closes, or None."""
    depth = 0
    for position in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[position], 0)
        if depth < 0:
            return position
    return None
