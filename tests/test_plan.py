"""plan: instruction text round-trips, plan.json carries the documented keys and verifies its hash."""
from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import FIXTURES, compile_library
from schedc.compiler import compile_source, read_source
from schedc.plan.format import (_JSON_FORMS, _TEXT_FORMS, MEMO, Instr, Opcode, Plan, PlanError, load_plan,
                         parse_rank_text, step_json, step_text, write_plan)

small = st.integers(0, 10_000)
instrs = st.builds(Instr, st.sampled_from(["F", "B", "I", "W", "SEND_F", "RECV_B", "STEP", "curvature_A"]),
                   st.none() | small, st.none() | small, st.none() | small, st.none() | small,
                   st.none() | st.lists(small, min_size=1, max_size=4).map(tuple))


@given(instrs)
def test_instruction_text_round_trips(instr):
    if instr.stage is None and instr.mb is not None:
        instr = instr._replace(mb=None)
    assert Instr.parse(str(instr)) == instr
    assert Instr.from_json(json.loads(json.dumps(instr.to_json()))) == instr


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 4, "m": 8}), ("chimera", {"p": 4, "m": 8}),
                                         ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4})])
def test_rank_files_parse_back_to_the_json_streams(tmp_path, name, params):
    plan, paths = write_plan(compile_library(name, **params).plan, tmp_path)
    loaded = load_plan(tmp_path / "plan.json")
    assert loaded.hash == plan.hash
    for rank in range(plan.devices):
        assert tuple(map(tuple, parse_rank_text((tmp_path / f"rank{rank}.txt").read_text()))) == loaded.ranks[rank]


def test_plan_json_has_the_documented_keys(tmp_path):
    write_plan(compile_library("chimera", p=4, m=8).plan, tmp_path)
    obj = json.loads((tmp_path / "plan.json").read_text())
    for key in ("format", "version", "hash", "schedule", "params", "devices", "stages", "placement" if False else
                "pipelines", "replicas", "costs", "stats", "ranks"):
        assert key in obj
    assert obj["params"] == {"p": 4, "m": 8}
    assert set(obj["stats"]) >= {"makespan", "utilization", "bubble_fraction", "busy", "idle", "peak_memory"}
    assert [r["rank"] for r in obj["ranks"]] == [0, 1, 2, 3]
    assert all(set(i) >= {"op", "stage", "mb"} for r in obj["ranks"] for step in r["steps"] for i in step)


def test_edited_plan_is_refused(tmp_path):
    write_plan(compile_library("1f1b", p=2, m=2).plan, tmp_path)
    path = tmp_path / "plan.json"
    path.write_text(path.read_text().replace('"mb":1', '"mb":0', 1))
    with pytest.raises(PlanError, match="hash"):
        load_plan(path)


with_parts = st.tuples(instrs, st.none() | small, st.none() | small).map(lambda t: t[0]._replace(part=t[1], parts=t[2]))


ops = st.sampled_from([*Opcode, "curvature_A", "tâche", 'a"b'])  # enum members, task names to escape


@given(st.lists(instrs | with_parts | st.builds(Instr, ops, small, small, small, st.none() | small), max_size=12))
def test_step_forms_are_the_instruction_forms(step):
    """The whole-step forms (plain instructions from columns, the others by Instr) are each
    instruction's forms, in order."""
    step = tuple(i._replace(mb=None) if i.stage is None else i for i in step)
    assert step_text(step) == "".join(f"{i}\n" for i in step)
    assert step_json(step) == json.dumps([i.to_json() for i in step], sort_keys=True, separators=(",", ":"))


odd = st.sampled_from([True, False, 1.0, 2.0, 0.5])  # equal to ints the forms may hold already


@given(st.lists(st.builds(Instr, ops, small | odd, small | odd, small | odd, st.none() | small | odd), max_size=6))
def test_step_forms_keep_values_of_other_types(step):
    """A value equal to an int but of another type is still formatted as Instr formats it."""
    step = tuple(Instr("F", n, n, n, n) for n in range(3)) + tuple(step)  # the ints come first
    assert step_text(step) == "".join(f"{i}\n" for i in step)
    assert step_json(step) == "[" + ",".join(i.json_text() for i in step) + "]"


@pytest.mark.parametrize("compiled", [lambda: compile_library("pipefisher"),
                                      lambda: compile_library("chimera", p=4, m=8),
                                      lambda: compile_source(read_source(FIXTURES / "split_backward.sched"))])
def test_written_files_are_the_instruction_forms(tmp_path, compiled):
    """plan.json and the rank files, formatted a column at a time, are the plain dict and str forms
    (tasks in parts, SYNC_GRAD, STEP, several steps)."""
    plan, _ = write_plan(compiled().plan, tmp_path)
    assert plan.canonical() == json.dumps(plan.content(), sort_keys=True, separators=(",", ":"))
    for rank, steps in enumerate(plan.ranks):
        lines = [f"# schedc plan {plan.meta['schedule']} rank {rank} (hash {plan.hash[:12]})"]
        for k, step in enumerate(steps):
            lines += [f"# step {k}", *map(str, step)]
        assert (tmp_path / f"rank{rank}.txt").read_text() == "\n".join(lines) + "\n"


def test_plan_json_is_the_canonical_content_after_its_hash(tmp_path):
    """plan.json is streamed and its hash filled in last: the file is still format, version, hash, then
    exactly the canonical content that the hash covers."""
    plan, _ = write_plan(compile_library("chimera", p=4, m=8).plan, tmp_path)
    canonical = plan.canonical()
    assert hashlib.sha256(canonical.encode()).hexdigest() == plan.hash
    head = json.dumps({"format": "schedc-plan", "version": 1, "hash": plan.hash}, separators=(",", ":"))
    assert (tmp_path / "plan.json").read_text() == head[:-1] + "," + canonical[1:] + "\n"
    assert load_plan(tmp_path / "plan.json").hash == plan.hash


@pytest.mark.parametrize("edit", ['"stage":"1"}', '"stage":[1]}', '"stage":true}', '"stage":1.0}'])
def test_a_field_edited_to_another_type_is_refused_on_load(tmp_path, edit):
    """Edits that the canonical writer would print like the original (a quoted number) or could not
    print at all (a list) are refused as plan errors, not loaded or crashed on."""
    write_plan(compile_library("1f1b", p=2, m=2).plan, tmp_path)
    path = tmp_path / "plan.json"
    text = path.read_text()
    assert text.count('"stage":1}') > 0
    path.write_text(text.replace('"stage":1}', edit, 1))
    with pytest.raises(PlanError, match="stage must be an integer or null"):
        load_plan(path)


def test_hand_made_instructions_of_any_type_are_written_in_their_canonical_forms(tmp_path):
    step = (Instr("F", [1, 2], 0, 0), Instr("B", "1", 0, 0), Instr("F", 0, 1, 0, group=("a",)), Instr("STEP"))
    plan, _ = write_plan(Plan({"schedule": "s", "pipelines": []}, ((step,),)), tmp_path)
    obj = json.loads((tmp_path / "plan.json").read_text())
    assert obj["ranks"][0]["steps"][0] == [i.to_json() for i in step]
    assert hashlib.sha256(json.dumps({k: v for k, v in obj.items() if k not in ("format", "version", "hash")},
                                     sort_keys=True, separators=(",", ":")).encode()).hexdigest() == plan.hash
    assert (tmp_path / "rank0.txt").read_text().splitlines()[2:] == [str(i) for i in step]
    assert not list(tmp_path.glob("*.tmp"))


def test_field_memos_stay_bounded():
    step_text(tuple(Instr("F", 0, mb, 0) for mb in range(3 * MEMO)))
    assert all(len(memo) <= MEMO for memo in (*_TEXT_FORMS, *_JSON_FORMS))
