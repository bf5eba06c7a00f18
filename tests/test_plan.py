"""plan: instruction text round-trips, plan.json carries the documented keys and verifies its hash."""
from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import FIXTURES, compile_library
from schedc.driver import compile_source, read_source
from schedc.plan import Instr, Opcode, Plan, PlanError, format_rank_text, load_plan, parse_rank_text
from schedc.plan.write import _JSON_FORMS, _TEXT_FORMS, MEMO, canonical_pieces, step_json, step_text, write_plan

small = st.integers(0, 10_000)
instrs = st.builds(Instr, st.sampled_from(["F", "B", "I", "W", "SEND_F", "RECV_B", "STEP", "curvature_A"]),
                   st.none() | small, st.none() | small, st.none() | small, st.none() | small,
                   st.none() | st.lists(small, min_size=1, max_size=4).map(tuple), halves=st.none())
halves = st.builds(Instr, st.sampled_from(["F", "B", "I"]), small, small, st.none() | small, halves=st.none())
overlapped = st.builds(lambda first, second: Instr("OVERLAP_F_B", halves=(first, second)), halves, halves)


@given(instrs | overlapped)
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
    assert set(obj["stats"]) >= {"makespan", "utilization", "bubble", "busy", "idle", "peak_memory"}
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


@given(st.lists(instrs | with_parts | overlapped | st.builds(Instr, ops, small, small, small, st.none() | small,
                                                            halves=st.none()), max_size=12))
def test_step_forms_are_the_instruction_forms(step):
    """The whole-step forms (plain instructions from columns, the others by Instr) are each
    instruction's forms, in order."""
    step = tuple(i._replace(mb=None) if i.stage is None else i for i in step)
    assert step_text(step) == "".join(f"{i}\n" for i in step)
    assert step_json(step) == json.dumps([i.to_json() for i in step], sort_keys=True, separators=(",", ":"))


odd = st.sampled_from([True, False, 1.0, 2.0, 0.5])  # equal to ints the forms may hold already


@given(st.lists(st.builds(Instr, ops, small | odd, small | odd, small | odd, st.none() | small | odd, halves=st.none()),
                max_size=6))
def test_step_forms_keep_values_of_other_types(step):
    """A value equal to an int but of another type is still formatted as Instr formats it."""
    step = tuple(Instr("F", n, n, n, n) for n in range(3)) + tuple(step)  # the ints come first
    assert step_text(step) == "".join(f"{i}\n" for i in step)
    assert step_json(step) == "[" + ",".join(i.json_text() for i in step) + "]"


@pytest.mark.parametrize("compiled", [lambda: compile_library("pipefisher"),
                                      lambda: compile_library("chimera", p=4, m=8),
                                      lambda: compile_library("dualpipev", p=2, m=4),
                                      lambda: compile_source(read_source(FIXTURES / "split_backward.sched"))])
def test_written_files_are_the_instruction_forms(tmp_path, compiled):
    """plan.json and the rank files, formatted a column at a time, are the plain dict and str forms
    (tasks in parts, SYNC_GRAD, STEP, several steps, OVERLAP_F_B)."""
    plan, _ = write_plan(compiled().plan, tmp_path)
    assert "".join(canonical_pieces(plan)) == plan.canonical() == json.dumps(plan.content(), sort_keys=True,
                                                                            separators=(",", ":"))
    for rank, steps in enumerate(plan.ranks):
        lines = [f"# schedc plan {plan.meta['schedule']} rank {rank} (hash {plan.hash[:12]})"]
        for k, step in enumerate(steps):
            lines += [f"# step {k}", *map(str, step)]
        assert (tmp_path / f"rank{rank}.txt").read_text() == "\n".join(lines) + "\n" == format_rank_text(plan, rank)


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


# Edited plans, the hash recomputed as a careless tool would (docs/plan-format.md: SHA-256 of the compact,
# key-sorted JSON of everything but format, version and hash): refused on loading, naming the field.

def _rehashed(obj: dict) -> dict:
    body = {k: v for k, v in obj.items() if k not in ("format", "version", "hash")}
    obj["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return obj


def _step(obj, rank=0, k=0):
    return obj["ranks"][rank]["steps"][k]


EDITS = {
    "stage 99": (lambda o: _step(o)[0].update(stage=99), "ranks[0].steps[0][0].stage: 99 is out of range 0..1"),
    "no ranks": (lambda o: o.update(ranks=[]), "ranks: the plan has no ranks"),
    "pipeline of no microbatches": (lambda o: o["pipelines"][0].update(microbatches=[]),
                                    "pipelines[0].microbatches: expected one or more distinct microbatches"),
    "microbatches 0": (lambda o: o.update(microbatches=0), "microbatches: expected an integer >= 1, got 0"),
    "placement 0,0": (lambda o: o["pipelines"][0].update(placement=[0, 0]),
                      "runs stage 1 on rank 1, but pipelines[0].placement puts it on rank 0"),
    "devices 3": (lambda o: o.update(devices=3), "devices: 3, but the plan has 2 ranks"),
    "no STEP": (lambda o: _step(o, 1).pop(), "ranks[1].steps[0]: a step program ends with exactly one STEP (found 0)"),
    "two STEPs": (lambda o: _step(o).insert(0, dict(_step(o)[-1])),
                  "ranks[0].steps[0]: a step program ends with exactly one STEP (found 2)"),
    "uneven steps": (lambda o: o["ranks"][1]["steps"].append(list(_step(o, 1))),
                     "ranks[1].steps: 2 step programs, but rank 0 has 1"),
    "no steps": (lambda o: [r.update(steps=[]) for r in o["ranks"]], "ranks[0].steps: 0 step programs"),
    "peer itself": (lambda o: next(i for i in _step(o) if i["op"] == "SEND_F").update(peer=0),
                    "peer: rank 0 sends or receives to itself"),
    "rank twice": (lambda o: o["ranks"][1].update(rank=0), "ranks: each entry's rank must be 0..1, once each"),
    "stages []": (lambda o: o.update(stages=[]), "stages: expected an integer >= 1, got []"),
    "cost inf": (lambda o: o["costs"].update(F=[1e400, 1.0]), "costs.F: expected a finite number >= 0"),
    "cost 2**64": (lambda o: o["costs"].update(F=[2 ** 64, 1.0]), "costs.F: expected a finite number >= 0 and at most 1e+15"),
    "mb of F": (lambda o: next(i for i in _step(o) if i["op"] == "RECV_B").update(mb=None), "RECV_B needs a mb"),
    "stage of F": (lambda o: next(i for i in _step(o) if i["op"] == "F").update(stage=None),
                   "ranks[0].steps[0][0].stage: F needs a stage"),
    "link to itself": (lambda o: o.update(links=[[0, 0, 1e-3]]), "links: expected [from rank, to rank, seconds >= 0]"),
    "link past the ranks": (lambda o: o.update(links=[[0, 2, 1e-3]]), "between the ranks 0..1"),
    "link time -1": (lambda o: o.update(links=[[0, 1, -1]]), "links: expected"),
    "activation of 1 stage": (lambda o: o.update(activation=[0.5]), "activation: expected 2 finite sizes >= 0"),
    "chunks 0": (lambda o: o.update(chunks=0), "chunks: expected an integer >= 1 dividing the plan's 2 microbatch"),
    "chunks '2'": (lambda o: o.update(chunks="2"), "chunks: expected an integer >= 1 dividing"),
    "chunks 1e400": (lambda o: o.update(chunks=1e400), "chunks: expected an integer >= 1 dividing"),
    "chunks 3": (lambda o: o.update(chunks=3), "units (its sequence chunks per microbatch), got 3"),
}


def _refused_when_edited(tmp_path, obj: dict, change, message: str) -> str:
    """Edit the plan object, rehash it as a careless tool would, and check loading refuses it naming
    `message`; returns the message. The edited file is tmp_path/edited.json."""
    from schedc.plan import load_plan as load_checked
    change(obj)
    (tmp_path / "edited.json").write_text(json.dumps(_rehashed(obj)))
    with pytest.raises(PlanError) as caught:
        load_checked(tmp_path / "edited.json")
    assert message in str(caught.value), str(caught.value)
    return message


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_edited_plans_are_refused_on_loading_naming_the_field(tmp_path, edit):
    from click.testing import CliRunner
    from schedc.cli import main
    out = tmp_path / "plan"
    CliRunner().invoke(main, ["compile", "1f1b", "-D", "p=2", "-D", "m=2", "-o", str(out)])
    obj = json.loads((out / "plan.json").read_text())
    message = _refused_when_edited(tmp_path, obj, *EDITS[edit])
    result = CliRunner().invoke(main, ["render", str(tmp_path / "edited.json"), "-o", str(tmp_path / "x.svg")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "x.svg").exists()


def test_a_deeply_nested_plan_is_refused_not_recursed_into(tmp_path):
    from schedc.plan import load_plan as load_checked
    (tmp_path / "deep.json").write_text('{"format": "schedc-plan", "version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(PlanError, match="nested too deeply"):
        load_checked(tmp_path / "deep.json")


def _overlap(obj, rank=0) -> dict:
    return next(i for i in _step(obj, rank) if i["op"] == "OVERLAP_F_B")


OVERLAP_EDITS = {
    "two forwards": (lambda o: _overlap(o)["halves"][1].update(op="F"), "halves: a forward and a backward (F and B "
                     "or I), got F and F"),
    "forward and W": (lambda o: _overlap(o)["halves"][1].update(op="W"), "got F and W"),
    "a stage of its own": (lambda o: _overlap(o).update(stage=0), "OVERLAP_F_B has its two halves and no other field"),
    "one half": (lambda o: _overlap(o)["halves"].pop(), "halves must be a list of two instructions"),
    "half elsewhere": (lambda o: _overlap(o)["halves"][0].update(stage=1), "halves[0]: F stage=1 mb=3 pipe=0 runs "
                       "stage 1 on rank 0, but pipelines[0].placement puts it on rank 1"),
    "half without mb": (lambda o: _overlap(o)["halves"][1].update(mb=None), "halves[1].mb: B needs a mb"),
    "halves elsewhere": (lambda o: _step(o)[0].update(halves=[_overlap(o)["halves"][0]] * 2),
                         "[0].halves: only OVERLAP_F_B has halves"),
}


@pytest.mark.parametrize("edit", sorted(OVERLAP_EDITS))
def test_edited_overlapped_instructions_are_refused_naming_the_field(tmp_path, edit):
    from schedc.plan import load_plan as load_checked
    plan, _ = write_plan(compile_library("dualpipev", p=2, m=4).plan, tmp_path)
    obj = json.loads((tmp_path / "plan.json").read_text())
    assert load_checked(tmp_path / "plan.json").hash == plan.hash
    _refused_when_edited(tmp_path, obj, *OVERLAP_EDITS[edit])


@pytest.mark.parametrize("name,params", [("interleaved_1f1b", {"p": "4", "v": "2"}), ("zbv", {"p": "4"})])
def test_a_cluster_plan_re_simulates_to_the_compiles_figures(name, params):
    """A --cluster compile records the message times it simulated with (links, for the device pairs its
    pipelines send over): simulate or render of the plan gives the compile's makespan, bubble and idle
    times, where without them the messages were left out (22.9112 s against 22.9352 s)."""
    from schedc.costmodel.specs import load_cluster, load_model_spec
    from schedc.layout import Layout
    from schedc.costmodel import Setting
    from schedc.driver.cluster import compile_for
    from schedc.driver.replay import compiled_from_plan
    model = load_model_spec(str(FIXTURES.parent.parent / "schedc" / "models" / "gpt-1.7b.toml"))
    st = Setting(model, load_cluster("dgx-a100-80gb"), Layout(tp=1, dp=1, microbatch_size=1, global_batch=16))
    compiled = compile_for(name, params, st).compiled
    assert compiled.plan.meta["links"] and all(seconds > 0 for _, _, seconds in compiled.plan.meta["links"])
    again = compiled_from_plan(compiled.plan, "plan.json", {})
    for key in ("makespan", "bubble", "busy", "idle", "idle_inside", "peak_memory"):
        assert again.stats[key] == compiled.stats[key], key


def test_a_plans_activation_sizes_give_the_compiles_peaks():
    from schedc.driver.replay import compiled_from_plan
    compiled = compile_source(read_source(FIXTURES / "half_activations.sched"))
    assert compiled.plan.meta["activation"] == [0.5, 0.5, 0.5]
    assert compiled_from_plan(compiled.plan, "plan.json", {}).stats["peak_memory"] == compiled.stats["peak_memory"] \
        == [1.5, 1.0, 0.5]


# Edited plans whose fields are valid but whose orders cannot run: the checks a .sched file's orders get.
ORDER_EDITS = {
    "I before its F": (lambda o: _swap(_step(o, 3), ("F", 3, 0), ("I", 3, 0)),
                       ["error: deadlock: device 3 waits at I(3,0) for F(3,0), which device 3 runs later"]),
    "F twice": (lambda o: _find(_step(o), ("F", 0, 0)).update(mb=1),
                ["error: F(0,1) runs twice", "error: device 0 never runs F(0,0)"]),
    "W missing": (lambda o: _step(o).remove(_find(_step(o), ("W", 0, 7))), ["error: device 0 never runs W(0,7)"]),
}


def _find(step: list, key: tuple) -> dict:
    return next(i for i in step if (i["op"], i["stage"], i["mb"]) == key)


def _swap(step: list, a: tuple, b: tuple) -> None:
    i, j = step.index(_find(step, a)), step.index(_find(step, b))
    step[i], step[j] = step[j], step[i]


@pytest.mark.parametrize("edit", ORDER_EDITS)
def test_a_plan_whose_orders_cannot_run_is_refused_by_check_simulate_and_run(tmp_path, edit):
    """Rehashed, these load; `check` runs the per-step structure and deadlock checks, `simulate`
    prints no stats of the partial run (it printed utilization 6 and idle -20), and `run` refuses
    before starting a process."""
    from click.testing import CliRunner
    from schedc.cli import main
    out = tmp_path / "plan"
    assert CliRunner().invoke(main, ["compile", "zb_h1", "-o", str(out)]).exit_code == 0
    obj = json.loads((out / "plan.json").read_text())
    change, messages = ORDER_EDITS[edit]
    change(obj)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(_rehashed(obj)))
    load_plan(path)  # its fields are valid
    for command in (["check", str(path)], ["simulate", str(path)], ["run", str(path), "--steps", "1"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 1, (command, result.output)
        for message in messages:
            assert f"{path}: {message}" in result.output, (command, result.output)
        assert "makespan" not in result.output and "torchrun" not in result.output and "ok (" not in result.output


def test_every_library_plan_passes_the_order_checks_in_every_step_program():
    from schedc.driver.replay import check_plan_orders
    for name, params in (("1f1b", {}), ("zbv", {}), ("dualpipev", {}), ("chimera", {}), ("pipefisher", {}),
                         ("pipefisher_1f1b", {}), ("interleaved_zb", {})):
        plan = compile_library(name, **params).plan
        assert check_plan_orders(plan, "plan.json") == [], name


def test_a_replayed_plan_is_titled_with_its_params_in_declared_order(tmp_path):
    """plan.json keeps params sorted by name; its re-simulation titles them as the library declares them."""
    from click.testing import CliRunner
    from schedc.cli import main
    assert CliRunner().invoke(main, ["compile", "interleaved_1f1b", "-o", str(tmp_path)]).exit_code == 0
    text = CliRunner().invoke(main, ["simulate", str(tmp_path / "plan.json")]).output
    assert text.startswith("interleaved_1f1b (p=4 v=2 m=8): ")


def test_a_filled_makespan_says_it_spans_the_cycle():
    from click.testing import CliRunner
    from schedc.cli import main
    lines = CliRunner().invoke(main, ["simulate", "pipefisher"]).output.splitlines()
    assert "(the cycle of 3 steps)" in lines[1] and "(the cycle" not in CliRunner().invoke(main, ["simulate", "1f1b"]).output
