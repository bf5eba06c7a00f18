# Lifetimes of saved activations: where the executor drops the saved state of (stage, mb) that F
# created. It lives until its last use after the F in the same step program (B, W, or a user task
# reading it); a user task of the next step program (a bubble-filled cycle, PipeFisher) that reads it
# before that program's own F(stage, mb) keeps it alive across the step boundary. An OVERLAP_F_B is
# its two halves at its one index.
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from schedc.ops import RELEASES
from schedc.plan import Instr, Opcode

BUILTIN = frozenset(op.value for op in Opcode)
USERS = RELEASES  # the built-in ops that use (and last) a forward's saved state: the release rule of schedc.ops

Key = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Lifetimes:
    """frees[k]: instruction indices of program k after which its (stage, mb) state is dropped;
    carried[k]: the (stage, mb) states that program k leaves alive for program k+1."""

    frees: tuple[frozenset[int], ...]
    carried: tuple[frozenset[Key], ...]


def is_user(instr: Instr) -> bool:
    return instr.mb is not None and (instr.op in USERS or instr.op not in BUILTIN)


def freed_by(instr: Instr) -> tuple[int, int] | None:
    """The (stage, mb) whose saved state is dropped after `instr` when an index of `frees` names it: its
    own, an OVERLAP_F_B's backward half's (its forward half starts a state, never ends one)."""
    users = [unit for unit in instr.units() if unit.op != Opcode.F]
    return (users[0].stage, users[0].mb) if users else None


def plan_lifetimes(programs: list[tuple[Instr, ...]]) -> Lifetimes:
    """
    >>> F, B, T = (Instr(op, 0, 0) for op in ("F", "B", "t"))
    >>> plan_lifetimes([(F, B)])
    Lifetimes(frees=(frozenset({1}),), carried=(frozenset(),))
    >>> plan_lifetimes([(T, F, B)])
    Lifetimes(frees=(frozenset({0}),), carried=(frozenset({(0, 0)}),))
    """
    count = len(programs)
    frees: list[set[int]] = [set() for _ in programs]
    carried: list[set[Key]] = [set() for _ in programs]
    for k, program in enumerate(programs):
        early = _early_uses(programs[(k + 1) % count])
        for key, last in _late_uses(program).items():
            if key in early:
                carried[k].add(key)
                frees[(k + 1) % count].add(early[key])
            elif last is not None:
                frees[k].add(last)
    return Lifetimes(tuple(map(frozenset, frees)), tuple(map(frozenset, carried)))


def _late_uses(program: tuple[Instr, ...]) -> dict[Key, int | None]:
    """For every F of the program: the index of the last use after it (None if unused)."""
    last: dict[Key, int | None] = {}
    for index, instr in _units(program):
        key = (instr.stage, instr.mb)
        if instr.op == Opcode.F:
            last[key] = None
        elif key in last and is_user(instr):
            last[key] = index
    return last


def _early_uses(program: tuple[Instr, ...]) -> dict[Key, int]:
    """Last index of a user task reading (stage, mb) before the program's own F(stage, mb)."""
    seen_f: set[Key] = set()
    early: dict[Key, int] = {}
    for index, instr in _units(program):
        key = (instr.stage, instr.mb)
        if instr.op == Opcode.F:
            seen_f.add(key)
        elif key not in seen_f and instr.mb is not None and instr.op not in BUILTIN:
            early[key] = index
    return early


def _units(program: tuple[Instr, ...]):
    """(index, instruction) of the program, an OVERLAP_F_B's halves each at its index."""
    for index, instr in enumerate(program):
        for unit in instr.units():
            yield index, unit


def release_sent(sends: deque, wait: Callable) -> deque:
    """The sends still in flight, oldest first; `wait` called on each completed one, in whatever order
    they completed (a later, smaller message to a quicker peer frees its buffer before an earlier one).

    >>> class Work:
    ...     def __init__(self, done): self.done = done
    ...     def is_completed(self): return self.done
    >>> left = release_sent(deque([(Work(False), "a", 1), (Work(True), "b", 2)]), lambda w, b, p: print("freed", b))
    freed b
    >>> [buffer for _, buffer, _ in left]
    ['a']
    """
    kept = deque()
    for entry in sends:
        if entry[0].is_completed():
            wait(*entry)
        else:
            kept.append(entry)
    return kept
