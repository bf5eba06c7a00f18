"""Writing a plan: plan.json and rank*.txt, streamed to disk while hashed.

The bytes are those of the plain forms of plan/format.py (Plan.canonical, format_rank_text,
Instr.__str__ and Instr.json_text); tests/test_plan.py holds the two together. The speed lives here,
out of the runtime's contract: a plan of 10^5-10^6 instructions is formatted a column at a time, its
field texts memoized, and never built as one string.

    write_plan(plan, "out/1f1b")  ->  (plan with its hash, [out/1f1b/plan.json, out/1f1b/rank0.txt, ...])
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import chain, compress, count, repeat
from operator import is_not
from pathlib import Path
from types import NoneType
from typing import Any

from ..ops import Opcode
from ..outputs import open_output, write_output
from .format import _INT_OR_NONE, FORMAT, Instr, Plan, version_of

_OP_JSON = {op.value: json.dumps(op.value) for op in Opcode}  # op -> its JSON string; tasks join when seen


def write_plan(plan: Plan, directory: str | Path) -> tuple[Plan, list[Path]]:
    """Write plan.json and rank{r}.txt into directory (each file atomically); return the hashed plan
    and the paths written. The rank streams of an earlier, larger plan written there (rank{r}.txt for
    r past this plan's ranks, with the header this module writes) are removed; nothing else is."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    forms = list(map(_step_forms, plan.ranks))  # the columns of each step, for both files
    plan, path = _write_plan_json(plan, out / "plan.json", forms)
    written = [path]
    for rank in range(plan.devices):
        written.append(write_output(out / f"rank{rank}.txt", _rank_text(plan, rank, forms[rank])))
    for stale in stale_rank_files(out, plan.devices):
        stale.unlink()
    return plan, written


_RANK_FILE = re.compile(r"rank(0|[1-9][0-9]*)\.txt")
_RANK_HEAD = b"# schedc plan "


def stale_rank_files(directory: Path, ranks: int) -> list[Path]:
    """The rank{r}.txt files in directory with r >= ranks that this module wrote (their first bytes
    are a rank stream's header), in rank order; a file of any other name or content is never listed."""
    found = []
    for path in directory.iterdir():
        match = _RANK_FILE.fullmatch(path.name)
        if match and int(match[1]) >= ranks and path.is_file() and not path.is_symlink():
            with open(path, "rb") as stream:
                if stream.read(len(_RANK_HEAD)) == _RANK_HEAD:
                    found.append((int(match[1]), path))
    return [path for _, path in sorted(found)]


def _step_forms(steps: tuple[tuple[Instr, ...], ...]) -> list[_StepForms]:
    return list(map(_StepForms, steps))


def _write_plan_json(plan: Plan, path: Path, forms: list[list[_StepForms]]) -> tuple[Plan, Path]:
    """Stream the canonical content into plan.json while hashing it, then fill in the hash, which the
    file names first (a 64-digit placeholder until the content has been hashed)."""
    digest, placeholder = hashlib.sha256(), "0" * 64
    head = _file_head(placeholder, version_of(plan, (step.columns[0] for steps in forms for step in steps))).encode()
    with open_output(path) as stream:
        stream.write(head)
        for k, piece in enumerate(canonical_pieces(plan, forms)):
            data = piece.encode()
            digest.update(data)
            stream.write(data[1:] if k == 0 else data)  # the content's "{" is the head's
        stream.write(b"\n")
        plan = replace(plan, hash=digest.hexdigest())
        stream.seek(head.index(placeholder.encode()))
        stream.write(plan.hash.encode())
    return plan, path


def _rank_text(plan: Plan, rank: int, forms: list[_StepForms] | None = None) -> str:
    """format_rank_text(plan, rank), from the rank's steps as _StepForms when the caller has them."""
    pieces = [f"# schedc plan {plan.meta['schedule']} rank {rank} (hash {plan.hash[:12]})\n"]
    for k, step in enumerate(forms or map(_StepForms, plan.ranks[rank])):
        pieces.append(f"# step {k}\n")
        pieces += step.text_pieces()
    return "".join(pieces)


def step_text(step: tuple[Instr, ...]) -> str:
    """`"".join(f"{i}\\n" for i in step)`, several times faster on a plan's 10^5-10^6 instructions."""
    return "".join(_StepForms(step).text_pieces())


def step_json(step: tuple[Instr, ...]) -> str:
    """The step's JSON array, `"[" + ",".join(i.json_text() for i in step) + "]"`, likewise."""
    return "".join(_StepForms(step).json_pieces())


class _Forms(dict):
    """Memo of one field's text by value, e.g. 3 -> " stage=3": a plan's fields take a few hundred
    values, so each is formatted once and then looked up in C. Only values of the field's type are kept
    (True == 1 and 1.0 == 1, but their texts differ), and at most MEMO values (the memo lives as long
    as the process); None maps to `none`."""

    __slots__ = ("form", "kind")

    def __init__(self, form: Callable[[Any], str], kind: type = int, none: str = "") -> None:
        super().__init__({None: none})
        self.form, self.kind = form, kind

    def __missing__(self, value: Any) -> str:
        text = self.form(value)
        if type(value) is self.kind and len(self) < MEMO:
            self[value] = text
        return text


MEMO = 4096


# The pieces of a plain instruction (stage, mb and pipe ints, no group or parts): five per form.
_TEXT_FORMS = (_Forms(" stage={}".format), _Forms(" mb={}".format), _Forms(" pipe={}".format),
               _Forms(" peer={}\n".format, none="\n"))
_JSON_FORMS = (_Forms(',{{"mb":{}'.format), _Forms(lambda op: ',"op":' + _op_json(op), kind=str),
               _Forms(',"peer":{}'.format), _Forms(',"pipe":{}'.format), _Forms(',"stage":{}}}'.format))


class _StepForms:
    """One step program as columns, to format its instructions a column at a time in C. Nearly every
    instruction is plain: an op or a message with int stage, mb and pipe and no group or parts. Those
    are formatted by table lookups; the few others (SYNC_GRAD, STEP, task parts, OVERLAP_F_B) then
    by Instr's methods, which define both forms, in their place."""

    __slots__ = ("step", "columns", "others")

    def __init__(self, step: tuple[Instr, ...]) -> None:
        self.step = step
        self.columns = tuple(zip(*step)) if step else ((),) * len(Instr._fields)
        self.others = self._irregular()
        self.columns = self.columns[:5]  # op, stage, mb, pipe, peer: what the forms read (at 10^6 ops the
        # other four, None nearly everywhere, would hold a tenth of a GiB until both files are written)

    def _irregular(self) -> list[int] | None:
        """Positions of the instructions that are not plain, ascending: those with a stage, mb or pipe
        of None, or a group or parts. None when a stage, mb, pipe or peer is neither an int nor None,
        or an op is not a string (a hand-made plan; the memos cannot take such values, as True == 1
        and lists do not hash): then every instruction is formatted on its own."""
        ops, stages, mbs, pipes, peers, *rest = self.columns
        unset: list[int] = []
        if not {int}.issuperset(map(type, chain(stages, mbs, pipes))):  # else (nearly always) one pass, no list
            types = list(map(type, chain(stages, mbs, pipes)))
            unset = _positions(types, NoneType)
            if len(unset) + types.count(int) < len(types):
                return None
        if not _INT_OR_NONE.issuperset(map(type, peers)) or not {str}.issuperset(map(type, ops)):
            return None
        found = [k % len(stages) for k in unset]  # position in the three columns -> instruction
        for column in rest:  # group, part, parts, halves: set on few instructions if any
            if column.count(None) < len(column):
                found += compress(count(), map(is_not, column, repeat(None)))
        return sorted(set(found))

    def text_pieces(self) -> list[str]:
        """The step's lines, each ending in a newline, in five pieces per instruction: the op, then the
        texts of stage, mb, pipe and peer (the peer's with the newline)."""
        if self.others is None:
            return [f"{i}\n" for i in self.step]
        ops, stages, mbs, pipes, peers = self.columns[:5]
        pieces: list[Any] = [None] * (5 * len(ops))
        pieces[0::5] = ops
        for j, (forms, column) in enumerate(zip(_TEXT_FORMS, (stages, mbs, pipes, peers)), 1):
            pieces[j::5] = map(forms.__getitem__, column)
        for k in self.others:
            pieces[5 * k:5 * k + 5] = str(self.step[k]), "\n", "", "", ""
        return pieces

    def json_pieces(self) -> list[str]:
        """The step's JSON array, in five pieces per instruction (the keys in sorted order: mb, op,
        peer, pipe, stage, each piece with the separator before it) and its brackets."""
        if self.others is None:
            return ["[" + ",".join(i.json_text() for i in self.step) + "]"]
        ops, stages, mbs, pipes, peers = self.columns[:5]
        pieces: list[Any] = [None] * (5 * len(ops))
        for j, (forms, column) in enumerate(zip(_JSON_FORMS, (mbs, ops, peers, pipes, stages))):
            pieces[j::5] = map(forms.__getitem__, column)
        for k in self.others:
            pieces[5 * k:5 * k + 5] = "," + self.step[k].json_text(), "", "", "", ""
        if not pieces:
            return ["[]"]
        pieces[0] = "[" + pieces[0][1:]  # each instruction's piece starts with its separator
        pieces.append("]")
        return pieces


def _positions(items: list, value: Any) -> list[int]:
    """The positions of value in items, found in C."""
    found = [-1]
    try:
        while True:
            found.append(items.index(value, found[-1] + 1))
    except ValueError:
        return found[1:]


def _op_json(op: str) -> str:
    return _OP_JSON.get(op) or _OP_JSON.setdefault(op, json.dumps(op))


_RANKS = "\u0000ranks\u0000"  # stands in for the rank streams while the metadata is encoded


def canonical_pieces(plan: Plan, forms: list[list[_StepForms]] | None = None) -> Iterator[str]:
    """Plan.canonical() in pieces: the metadata up to the rank list, one piece per rank, the rest.
    Built without a dict per instruction, and never as one string: a plan of 10^6 instructions is
    hashed and written piece by piece. forms: the ranks' steps as _StepForms, if already made."""
    head = json.dumps({**plan.meta, "ranks": _RANKS}, sort_keys=True, separators=(",", ":"))
    before, after = head.split(json.dumps(_RANKS), 1)
    yield before + "["
    for r, steps in enumerate(forms or map(_step_forms, plan.ranks)):
        pieces = ['%s{"rank":%d,"steps":[' % ("," if r else "", r)]
        for k, step in enumerate(steps):
            if k:
                pieces.append(",")
            pieces += step.json_pieces()
        pieces.append("]}")
        yield "".join(pieces)
    yield "]" + after


def _file_head(digest: str, version: int) -> str:
    """plan.json's first bytes: format, version and hash, then the canonical content's keys follow."""
    return json.dumps({"format": FORMAT, "version": version, "hash": digest}, separators=(",", ":"))[:-1] + ","
