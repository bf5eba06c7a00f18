"""The plan: per-rank instruction streams, their JSON and text forms.

This module is the contract between compiler and runtime (docs/plan-format.md). It imports nothing
from the compiler, so the runtime can read plans without loading the parser or the passes.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from types import NoneType
from itertools import chain, compress, count, repeat
from operator import is_not
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ..ops import COMM, Opcode, label

FORMAT = "schedc-plan"
VERSION = 1


_KEYS = ("stage", "mb", "pipe", "peer", "group", "part", "parts")
_FIELDS = frozenset({"op", *_KEYS})


_OP_JSON = {op.value: json.dumps(op.value) for op in Opcode}  # op -> its JSON string; tasks join when seen

class PlanError(ValueError):
    """A plan file that cannot be read or does not fit its use."""


class Instr(NamedTuple):
    """One instruction of a rank's step program (see docs/plan-format.md). A NamedTuple: plans hold
    hundreds of thousands of them, and tuples are built and hashed in C."""

    op: str
    stage: int | None = None
    mb: int | None = None
    pipe: int | None = None
    peer: int | None = None
    group: tuple[int, ...] | None = None
    part: int | None = None
    parts: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "stage": self.stage, "mb": self.mb}
        if self.pipe is not None:
            out["pipe"] = self.pipe
        if self.peer is not None:
            out["peer"] = self.peer
        if self.group is not None:
            out["group"] = list(self.group)
        if self.part is not None:
            out["part"] = self.part
        if self.parts is not None:
            out["parts"] = self.parts
        return out

    def json_text(self) -> str:
        """The instruction's canonical JSON: compact, keys sorted (as plan.json and its hash have it)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Instr:
        if not isinstance(obj, dict) or not isinstance(obj.get("op"), str):
            raise PlanError(f"instruction must be an object with a string 'op', got {obj!r}")
        if not obj.keys() <= _FIELDS:
            unknown = obj.keys() - _FIELDS
            raise PlanError(f"instruction {obj!r} has unknown keys {sorted(unknown)}")
        group = obj.get("group")
        return cls(obj["op"], obj.get("stage"), obj.get("mb"), obj.get("pipe"), obj.get("peer"),
                   tuple(group) if group is not None else None, obj.get("part"), obj.get("parts"))

    def __str__(self) -> str:
        text = self.op
        if self.stage is not None:
            text += f" stage={self.stage} mb={'-' if self.mb is None else self.mb}"
        elif self.mb is not None:
            text += f" mb={self.mb}"
        if self.pipe is not None:
            text += f" pipe={self.pipe}"
        if self.peer is not None:
            text += f" peer={self.peer}"
        if self.group is not None:
            text += " group=" + ",".join(map(str, self.group))
        if self.part is not None:
            text += f" part={self.part}"
        if self.parts is not None:
            text += f" parts={self.parts}"
        return text

    def short(self) -> str:
        """The compact form diagnostics and grids show (ops.label): F(1,2), SEND_F(0,3)>1, RECV_B(2,0)<2."""
        return label(self.op, self.stage, self.mb, self.peer if self.op in COMM else None, parts=None)

    @classmethod
    def parse(cls, line: str) -> Instr:
        """Inverse of `str()`: ``SEND_F stage=1 mb=3 pipe=0 peer=2``."""
        op, *words = line.split()
        values: dict[str, Any] = {}
        for word in words:
            key, sep, text = word.partition("=")
            if not sep or key not in _KEYS:
                raise PlanError(f"bad field {word!r} in instruction {line!r}")
            try:
                if key == "group":
                    values[key] = tuple(int(x) for x in text.split(",") if x)
                else:
                    values[key] = None if text == "-" else int(text)
            except ValueError:
                raise PlanError(f"bad value in field {word!r} of instruction {line!r}") from None
        return cls(op, **values)


def parse_rank_text(text: str) -> list[list[Instr]]:
    """Parse a rankN.txt file back into its step programs."""
    steps: list[list[Instr]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.startswith("# step"):
            steps.append([])
        elif line and not line.startswith("#"):
            if not steps:
                raise PlanError(f"line {number}: instruction before the first '# step' header")
            steps[-1].append(Instr.parse(line))
    return steps


def format_rank_text(plan: Plan, rank: int, forms: list[_StepForms] | None = None) -> str:
    """rank{rank}.txt: a header, then each step program's lines after a '# step k' line. forms: the
    rank's steps as _StepForms when the caller has them already."""
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
_INT_OR_NONE = frozenset({int, NoneType})


class _StepForms:
    """One step program as columns, to format its instructions a column at a time in C. Nearly every
    instruction is plain: an op or a message with int stage, mb and pipe and no group or parts. Those
    are formatted by table lookups; the few others (SYNC_GRAD, STEP, task parts) then by Instr's
    methods, which define both forms, in their place."""

    __slots__ = ("step", "columns", "others")

    def __init__(self, step: tuple[Instr, ...]) -> None:
        self.step = step
        self.columns = tuple(zip(*step)) if step else ((),) * len(Instr._fields)
        self.others = self._irregular()

    def _irregular(self) -> list[int] | None:
        """Positions of the instructions that are not plain, ascending: those with a stage, mb or pipe
        of None, or a group or parts. None when a stage, mb, pipe or peer is neither an int nor None,
        or an op is not a string (a hand-made plan; the memos cannot take such values, as True == 1
        and lists do not hash): then every instruction is formatted on its own."""
        ops, stages, mbs, pipes, peers, *rest = self.columns
        types = list(map(type, chain(stages, mbs, pipes)))
        unset = _positions(types, NoneType)
        if (len(unset) + types.count(int) < len(types) or not _INT_OR_NONE.issuperset(map(type, peers))
                or not {str}.issuperset(map(type, ops))):
            return None
        found = [k % len(stages) for k in unset]  # position in the three columns -> instruction
        for column in rest:  # group, part, parts: set on few instructions if any
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


@dataclass(frozen=True, slots=True)
class Plan:
    """A compiled plan: metadata (everything but the streams) and ranks[r][k] = step program k of rank r."""

    meta: dict[str, Any]
    ranks: tuple[tuple[tuple[Instr, ...], ...], ...]
    hash: str = field(default="")

    @property
    def devices(self) -> int:
        return len(self.ranks)

    @property
    def cycle_steps(self) -> int:
        return len(self.ranks[0]) if self.ranks else 0

    def content(self) -> dict[str, Any]:
        body = dict(self.meta)
        body["ranks"] = [{"rank": r, "steps": [[i.to_json() for i in step] for step in steps]}
                         for r, steps in enumerate(self.ranks)]
        return body

    def canonical(self) -> str:
        """The compact, key-sorted JSON of the content (what `content_hash` hashes)."""
        return "".join(self.canonical_pieces())

    def canonical_pieces(self, forms: list[list[_StepForms]] | None = None) -> Iterator[str]:
        """The canonical JSON in pieces: the metadata up to the rank list, one piece per rank, the rest.
        Built without a dict per instruction, and never as one string: a plan of 10^6 instructions is
        hashed and written piece by piece. forms: the ranks' steps as _StepForms, if already made."""
        head = json.dumps({**self.meta, "ranks": _RANKS}, sort_keys=True, separators=(",", ":"))
        before, after = head.split(json.dumps(_RANKS), 1)
        yield before + "["
        for r, steps in enumerate(forms or map(_step_forms, self.ranks)):
            pieces = ['%s{"rank":%d,"steps":[' % ("," if r else "", r)]
            for k, step in enumerate(steps):
                if k:
                    pieces.append(",")
                pieces += step.json_pieces()
            pieces.append("]}")
            yield "".join(pieces)
        yield "]" + after

    def to_json(self) -> dict[str, Any]:
        body = self.content()
        return {"format": FORMAT, "version": VERSION, "hash": self.hash or content_hash(body), **body}


def _file_head(digest: str) -> str:
    """plan.json's first bytes: format, version and hash, then the canonical content's keys follow."""
    return json.dumps({"format": FORMAT, "version": VERSION, "hash": digest}, separators=(",", ":"))[:-1] + ","


def content_hash(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def plan_from_json(obj: dict[str, Any], verify: bool = True) -> Plan:
    """Build a Plan from parsed plan.json; with verify, refuse a plan whose hash does not match."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise PlanError("not a schedc plan (missing \"format\": \"schedc-plan\")")
    if obj.get("version") != VERSION:
        raise PlanError(f"plan version {obj.get('version')!r} is not supported (expected {VERSION})")
    meta = {k: v for k, v in obj.items() if k not in ("format", "version", "hash", "ranks")}
    try:
        entries = sorted(obj["ranks"], key=lambda e: e["rank"])
        if [e["rank"] for e in entries] != list(range(len(entries))) or any(type(e["rank"]) is not int for e in entries):
            raise PlanError(f"ranks: each entry's rank must be 0..{len(entries) - 1}, once each")
        ranks = tuple(tuple(tuple(map(Instr.from_json, step)) for step in entry["steps"]) for entry in entries)
    except (KeyError, TypeError, AttributeError) as exc:
        raise PlanError(f"malformed 'ranks' in plan: {exc}") from None
    for steps in ranks:
        for step in steps:
            _check_types(step)
    plan = Plan(meta, ranks, obj.get("hash", ""))
    if verify and not _hash_matches(plan):
        raise PlanError("plan hash does not match its content (the file was edited or is corrupt)")
    return plan


_NUMBERS = ("stage", "mb", "pipe", "peer", "part", "parts")


def _check_types(step: tuple[Instr, ...]) -> None:
    """Every number field of a loaded step an int or null and every group a list of ints (columns
    checked in C; the first bad instruction is named)."""
    columns = dict(zip(Instr._fields, zip(*step))) if step else {}
    fine = all(_INT_OR_NONE.issuperset(map(type, columns[key])) for key in _NUMBERS if key in columns)
    groups = [g for g in columns.get("group", ()) if g is not None]
    if fine and all(type(x) is int for x in chain.from_iterable(groups)):
        return
    for instr in step:
        for key in _NUMBERS:
            if type(getattr(instr, key)) not in _INT_OR_NONE:
                raise PlanError(f"instruction {instr.to_json()}: {key} must be an integer or null")
        if instr.group is not None and not all(type(x) is int for x in instr.group):
            raise PlanError(f"instruction {instr.to_json()}: group must be a list of integers")


def _hash_matches(plan: Plan) -> bool:
    """Whether the plan's hash is its content's. The canonical writer is the fast way (and is what wrote
    the hash); a plan it does not match is checked once more against json.dumps of the content."""
    if hashlib.sha256(plan.canonical().encode()).hexdigest() == plan.hash:
        return True
    return plan.hash == content_hash(plan.content())


def load_plan(path: str | Path, verify: bool = True) -> Plan:
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: cannot read plan: {exc}") from None
    except RecursionError:
        raise PlanError(f"{path}: cannot read plan: arrays or objects nested too deeply") from None
    return plan_from_json(obj, verify)


def write_plan(plan: Plan, directory: str | Path) -> tuple[Plan, list[Path]]:
    """Write plan.json and rank{r}.txt into directory (each file atomically); return the hashed plan
    and the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    forms = list(map(_step_forms, plan.ranks))  # the columns of each step, for both files
    plan, path = _write_plan_json(plan, out / "plan.json", forms)
    written = [path]
    for rank in range(plan.devices):
        written.append(_write_atomic(out / f"rank{rank}.txt", format_rank_text(plan, rank, forms[rank])))
    return plan, written


def _step_forms(steps: tuple[tuple[Instr, ...], ...]) -> list[_StepForms]:
    return list(map(_StepForms, steps))


def _write_plan_json(plan: Plan, path: Path, forms: list[list[_StepForms]]) -> tuple[Plan, Path]:
    """Stream the canonical content into plan.json while hashing it, then fill in the hash, which the
    file names first (a 64-digit placeholder until the content has been hashed)."""
    digest, placeholder = hashlib.sha256(), "0" * 64
    head = _file_head(placeholder).encode()
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as stream:
            stream.write(head)
            for k, piece in enumerate(plan.canonical_pieces(forms)):
                data = piece.encode()
                digest.update(data)
                stream.write(data[1:] if k == 0 else data)  # the content's "{" is the head's
            stream.write(b"\n")
            plan = replace(plan, hash=digest.hexdigest())
            stream.seek(head.index(placeholder.encode()))
            stream.write(plan.hash.encode())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return plan, path


def _write_atomic(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
