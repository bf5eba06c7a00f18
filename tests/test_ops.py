"""ops: the kinds, the one link rule (what feeds what, who sends to whom) and the text form; and a
grep over the tree that finds no second copy of the rule."""
from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from conftest import ROOT
from schedc import ops
from schedc.ops import OpKind, Opcode
from schedc.plan import Instr


def design_deps(kind: str, s: int, stages: int, split: bool) -> list[tuple[str, int]]:
    """docs/DESIGN: F(s,i) after F(s-1,i); B(s,i) after B(s+1,i) and F(s,i); with a split backward I
    takes B's place and W(s,i) comes after I(s,i). Written out here, independently of schedc.ops."""
    grad = "I" if split else "B"
    table = {"F": [("F", s - 1)] if s > 0 else [],
             grad: [("F", s)] + ([(grad, s + 1)] if s + 1 < stages else []),
             "W": [("I", s)]}
    return table[kind]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("stages", [1, 2, 5])
def test_builtin_deps_follow_the_design(stages, split):
    for kind in ops.builtin_kinds(split):
        for s in range(stages):
            assert sorted(ops.builtin_deps(kind, s, stages, split)) == sorted(design_deps(kind, s, stages, split))


def test_what_feeds_what_and_the_messages_that_carry_it():
    assert [ops.feeds(k, 3) for k in "FBIW"] == [4, 2, 2, None]
    assert ops.feeds("curvature_A", 3) is None
    assert ops.message("F") == ("SEND_F", "RECV_F") and ops.message("I") == ops.message("B") == ("SEND_B", "RECV_B")
    assert ops.message("W") is None
    # a message is named by its producing stage, on both ends
    assert ops.link_ends("SEND_F", 1) == ops.link_ends("RECV_F", 1) == (1, 2)
    assert ops.link_ends("SEND_B", 2) == ops.link_ends("RECV_B", 2) == (2, 1)
    assert (ops.own_stage("SEND_F", 1), ops.peer_stage("SEND_F", 1)) == (1, 2)
    assert (ops.own_stage("RECV_F", 1), ops.peer_stage("RECV_F", 1)) == (2, 1)
    assert (ops.own_stage("RECV_B", 2), ops.peer_stage("RECV_B", 2)) == (1, 2)
    # what a consumer reads, under the name the producer's message carries
    assert ops.fed_by("F", 2) == ("F", 1) and ops.fed_by("I", 2) == ops.fed_by("B", 2) == ("B", 3)
    assert ops.fed_by("W", 2) is None
    assert [ops.follows(k) for k in "FBIW"] == [None, "F", "F", "I"]


def test_kinds_read_and_hash_as_their_codes():
    assert {"F": 1}[OpKind.F] == 1 and {OpKind.F: 1}["F"] == 1
    assert f"{OpKind.W}" == str(OpKind.W) == "W" and f"{Opcode.SEND_B}" == "SEND_B"
    assert json.dumps({"op": Opcode.STEP}) == '{"op": "STEP"}'
    assert ops.COMM == ops.SENDS | ops.RECVS and not ops.COMM & ops.COMPUTE
    assert ops.NOT_COMPUTE == ops.COMM | {"SYNC_GRAD", "STEP", "ALL_TO_ALL", "ALL_GATHER", "REDUCE_SCATTER", "ALL_REDUCE"}
    assert ops.COLLECTIVE == ops.DECLARED | {"SYNC_GRAD"} and not ops.COLLECTIVE & ops.COMPUTE
    assert ops.BUILTIN == {"F", "B", "I", "W", "R", "O", "L"} and ops.LINKED == {"F", "B", "I"} and ops.SPLIT == {"I", "W"}


def test_one_text_form_for_ops_and_instructions():
    from schedc.ir import Op
    assert str(Op("F", 1, 2)) == ops.label("F", 1, 2) == "F(1,2)"
    assert str(Op("kfac", 1, None, part=1, parts=4)) == "kfac(1)[2/4]"
    assert Instr("SEND_F", 0, 3, 0, 1).short() == "SEND_F(0,3)>1"
    assert Instr("RECV_B", 2, 0, 0, 2).short() == "RECV_B(2,0)<2"
    assert Instr("SYNC_GRAD", 1, None, group=(0, 3)).short() == "SYNC_GRAD(1)"
    assert Instr("STEP").short() == "STEP"
    line = "SEND_F stage=0 mb=3 pipe=0 peer=1"  # the plan text, parsed back
    assert str(Instr.parse(line)) == line


# The grep: no second copy of the rule ---------------------------------------------------------------

MESSAGE_CODES = {op.value for op in Opcode} - ops.BUILTIN
# Files whose bare op-kind literals are left for the branches that rewrite them (elaboration and the
# order strategies; the runtime's buffer names). The counts must not grow: new code asks schedc.ops.
KIND_LITERALS_LEFT = {"schedc/frontend/footprint.py": 8, "schedc/frontend/params.py": 2, "schedc/frontend/queues.py": 7,
                      "schedc/runtime/execution/executor.py": 3}  # 20 in all (24 before the split; greedy's 2 now ask walk)
# stage arithmetic of the link rule: s + 1, stage - 1, ins[1] + 1, ...
STAGE_STEP = re.compile(r"\b(s|stage|ins\s*\[\s*1\s*\]|instr\s*\.\s*stage|op\s*\.\s*stage)\s*[+-]\s*1\b"
                        r"|\+\s*1\s*-\s*2\s*\*")
LAST_LETTER = re.compile(r"\[\s*0\s*\]\s*\[\s*-\s*1\s*\]|\.endswith\(\s*['\"][FB]['\"]\s*\)")  # opcode[-1] as direction


def _sources() -> list[Path]:
    return sorted(p for p in (ROOT / "schedc").rglob("*.py") if p != ROOT / "schedc" / "ops.py")  # the runtime too


def _scan(path: Path) -> tuple[list[str], list[str], list[str]]:
    """(code lines with the rule's stage arithmetic or a direction read off an opcode, string literals
    naming a message or instruction opcode, string literals naming a built-in op kind); comments and
    docstrings are not code."""
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    lines: dict[int, list[str]] = {}
    messages, kinds = [], []
    for token in tokens:
        if token.type == tokenize.STRING:
            body = token.string.lstrip("rbuRBU")
            if len(body) >= 2 and body[0] == body[-1] and body[0] in "'\"":
                if body[1:-1] in MESSAGE_CODES:
                    messages.append(f"{path.name}:{token.start[0]} {token.string}")
                elif body[1:-1] in ops.BUILTIN:
                    kinds.append(f"{path.name}:{token.start[0]} {token.string}")
        elif token.type != tokenize.COMMENT:
            lines.setdefault(token.start[0], []).append(token.string)
    code = [f"{path.name}:{n} {' '.join(parts)}" for n, parts in lines.items()
            if STAGE_STEP.search(" ".join(parts)) or LAST_LETTER.search(" ".join(parts))]
    return code, messages, kinds


def test_the_grep_finds_a_planted_copy(tmp_path):
    planted = tmp_path / "copy.py"
    planted.write_text('"""doc: F(s) feeds s + 1"""\n'
                       'def link(kind, s, place):\n'
                       '    if kind == "F":  # s + 1 in a comment is fine\n'
                       '        return "SEND_F", place[s + 1]\n'
                       '    return ins[0][-1]\n')
    code, messages, kinds = _scan(planted)
    assert [c.split()[0] for c in code] == ["copy.py:4", "copy.py:5"]
    assert messages == ['copy.py:4 "SEND_F"'] and kinds == ['copy.py:3 "F"']


def test_the_link_rule_exists_once():
    found = {path.relative_to(ROOT).as_posix(): _scan(path) for path in _sources()}
    assert len(found) > 40
    assert [line for code, _, _ in found.values() for line in code] == []
    assert [literal for _, messages, _ in found.values() for literal in messages] == []
    kinds = {path: len(k) for path, (_, _, k) in found.items() if k}
    assert {path: n for path, n in kinds.items() if n > KIND_LITERALS_LEFT.get(path, 0)} == {}
    assert sum(kinds.values()) <= sum(KIND_LITERALS_LEFT.values()) == 20


def test_the_release_rule_is_read_from_ops_everywhere():
    """What frees a forward's activation is ops' rule (RELEASES, release_kind) for the IR, the runtime's
    buffer lifetimes and the synthesis's timer alike."""
    from schedc.runtime.execution.lifetimes import USERS
    from schedc.synthesize.problem import Problem
    assert USERS is ops.RELEASES == {"B", "W"}
    for split in (False, True):
        problem = Problem(2, 4, ((1.0, 1.0),) * (3 if split else 2), split, 0.0, (4.0, 4.0))
        assert problem.name(problem.release) == ops.release_kind(split) == ("W" if split else "B")
