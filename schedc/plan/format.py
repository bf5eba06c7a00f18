"""The plan format: per-rank instruction streams, their JSON and text forms, loading and verifying.

This module is the contract between compiler and runtime (docs/plan-format.md). It imports nothing of
the compiler but schedc.ops, so the runtime reads plans without loading the parser or the passes.
Everything here is the plain form; plan/write.py writes the same bytes fast.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from pathlib import Path
from types import NoneType
from typing import Any, NamedTuple

from ..ops import COMM, DECLARED, Opcode, label

FORMAT = "schedc-plan"
VERSION = 1
COLLECTIVES_VERSION = 2  # a plan whose ops declare collectives (ALL_TO_ALL, ...); one without stays version 1
VERSIONS = (VERSION, COLLECTIVES_VERSION)


_KEYS = ("stage", "mb", "pipe", "peer", "group", "part", "parts")
_FIELDS = frozenset({"op", *_KEYS, "halves"})
OVERLAP = Opcode.OVERLAP_F_B.value
_AND = " & "  # between the halves of an overlapped instruction in its text form


class PlanError(ValueError):
    """A plan file that cannot be read or does not fit its use."""

    def without_path(self, path: str | Path) -> str:
        """The message without the file's path that leads it, for a caller that names the file itself."""
        return str(self).removeprefix(f"{path}: ")


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
    halves: tuple[Instr, Instr] | None = None  # OVERLAP_F_B: its forward and backward, in the plan's order

    def units(self) -> tuple[Instr, ...]:
        """The compute instructions it runs: an OVERLAP_F_B's two halves, any other instruction itself."""
        return self.halves if self.halves is not None else (self,)

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
        if self.halves is not None:
            out["halves"] = [half.to_json() for half in self.halves]
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
        group, halves = obj.get("group"), obj.get("halves")
        if halves is not None:
            if not isinstance(halves, list) or len(halves) != 2 or \
                    any(not isinstance(h, dict) or "halves" in h for h in halves):
                raise PlanError(f"instruction {obj!r}: halves must be a list of two instructions, "
                                "neither overlapped itself")
            halves = tuple(map(cls.from_json, halves))
        return cls(obj["op"], obj.get("stage"), obj.get("mb"), obj.get("pipe"), obj.get("peer"),
                   tuple(group) if group is not None else None, obj.get("part"), obj.get("parts"), halves)

    def __str__(self) -> str:
        """``SEND_F stage=1 mb=3 pipe=0 peer=2``; an overlapped instruction names its halves after its
        op: ``OVERLAP_F_B F stage=0 mb=3 pipe=0 & B stage=7 mb=1 pipe=0``."""
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
        if self.halves is not None:
            text += " " + _AND.join(map(str, self.halves))
        return text

    def short(self) -> str:
        """The compact form diagnostics and grids show (ops.label): F(1,2), SEND_F(0,3)>1, RECV_B(2,0)<2,
        F(0,3) & B(7,1)."""
        halves = None if self.halves is None else tuple(half.short() for half in self.halves)
        return label(self.op, self.stage, self.mb, self.peer if self.op in COMM else None, parts=None,
                     halves=halves)

    @classmethod
    def parse(cls, line: str) -> Instr:
        """Inverse of `str()`: ``SEND_F stage=1 mb=3 pipe=0 peer=2``, ``OVERLAP_F_B F stage=0 mb=3
        pipe=0 & B stage=7 mb=1 pipe=0``."""
        op, _, rest = line.strip().partition(" ")
        if op == OVERLAP and _AND in rest:
            halves = rest.split(_AND)
            if len(halves) != 2 or any(half.split()[:1] in ([], [OVERLAP]) for half in halves):
                raise PlanError(f"instruction {line!r}: an {OVERLAP} names two halves, joined by '&'")
            return cls(op, halves=(cls.parse(halves[0]), cls.parse(halves[1])))
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


def format_rank_text(plan: Plan, rank: int) -> str:
    """rank{rank}.txt: a header, then each step program's lines (Instr.__str__) after a '# step k' line."""
    pieces = [f"# schedc plan {plan.meta['schedule']} rank {rank} (hash {plan.hash[:12]})\n"]
    for k, step in enumerate(plan.ranks[rank]):
        pieces.append(f"# step {k}\n")
        pieces += [f"{i}\n" for i in step]
    return "".join(pieces)


_INT_OR_NONE = frozenset({int, NoneType})


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
        return json.dumps(self.content(), sort_keys=True, separators=(",", ":"))

    def to_json(self) -> dict[str, Any]:
        body = self.content()
        return {"format": FORMAT, "version": version_of(self), "hash": self.hash or content_hash(body), **body}


def version_of(plan: Plan, opcodes: Iterable[Iterable[str]] | None = None) -> int:
    """The format version a plan is written with: 2 where an instruction declares a collective (a reader
    of version 1 would take ALL_TO_ALL for a user task), else 1, so that plans without them keep their
    bytes. opcodes: each step's opcodes, when the caller holds them as a column (the plan writer)."""
    if opcodes is None:
        opcodes = (map(_OP, step) for steps in plan.ranks for step in steps)
    declares = any(not DECLARED.isdisjoint(ops) for ops in opcodes)
    return COLLECTIVES_VERSION if declares else VERSION


_OP = attrgetter("op")


def content_hash(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def plan_from_json(obj: dict[str, Any], verify: bool = True) -> Plan:
    """Build a Plan from parsed plan.json; with verify, refuse a plan whose hash does not match."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise PlanError("not a schedc plan (missing \"format\": \"schedc-plan\")")
    if obj.get("version") not in VERSIONS or type(obj.get("version")) is not int:
        raise PlanError(f"plan version {obj.get('version')!r} is not supported (expected one of "
                        f"{', '.join(map(str, VERSIONS))})")
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
    if obj["version"] < COLLECTIVES_VERSION and version_of(plan) >= COLLECTIVES_VERSION:
        raise PlanError(f"a plan of version {obj['version']} declares collectives ({', '.join(sorted(DECLARED))}); "
                        f"those need version {COLLECTIVES_VERSION}")
    if verify and not _hash_matches(plan):
        raise PlanError("plan hash does not match its content (the file was edited or is corrupt)")
    return plan


_NUMBERS = ("stage", "mb", "pipe", "peer", "part", "parts")


def _check_types(step: tuple[Instr, ...]) -> None:
    """Every number field of a loaded step an int or null and every group a list of ints (columns
    checked in C; the first bad instruction is named)."""
    columns = dict(zip(Instr._fields, zip(*step))) if step else {}
    halves = [half for pair in columns.get("halves", ()) if pair is not None for half in pair]
    if halves:
        _check_types(tuple(halves))
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
    """Whether the plan's hash is its content's canonical JSON (Plan.canonical), however it was written."""
    return plan.hash == content_hash(plan.content())


def load_plan(path: str | Path, verify: bool = True) -> Plan:
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: cannot read plan: {exc}") from None
    except RecursionError:
        raise PlanError(f"{path}: cannot read plan: arrays or objects nested too deeply") from None
    return plan_from_json(obj, verify)
