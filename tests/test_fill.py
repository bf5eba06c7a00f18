"""fill_bubbles: PipeFisher's K-FAC tasks in the bubbles, the cycle of steps, stats and errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SCHEDULES, compile_library
from reference_orders import chimera
from schedc.cli import main
from schedc.driver import build_schedule, compile_source, read_source
from schedc.diagnostics import SchedError
from schedc.passes.fill import WARN_CYCLE, fill_bubbles
from schedc.frontend.elaborate import Options
from schedc.frontend.tasks import refine_tasks
from schedc.interop.profiles import piece_overhead, read_profile, read_profile_memory
from schedc.passes.simulate import simulate

DATA = Path(__file__).resolve().parent / "data"
BERT_LARGE = DATA / "bert-large_time_memory_v100.csv"
V100 = {model: DATA / f"{model}_time_memory_v100.csv" for model in ("bert-base", "bert-large")}


def independent_utilization(p: int, m: int, f: float, b: float) -> float:
    """Utilization of the Chimera order (from tests/reference_orders.py) under F=f, B=b, no latency:
    an op starts when its device is free and its producer (F of s-1, B of s+1, own F) has ended."""
    orders = chimera(p, m)
    place = {"down": lambda s: s, "up": lambda s: p - 1 - s}
    end: dict[tuple, float] = {}
    position = [0] * p
    clock = [0.0] * p
    while any(position[d] < len(orders[d]) for d in range(p)):
        moved = False
        for d in range(p):
            while position[d] < len(orders[d]):
                kind, s, mb, pipe = orders[d][position[d]]
                needs = [("F", s - 1, mb, pipe)] if kind == "F" and s > 0 else []
                if kind == "B":
                    needs = [("F", s, mb, pipe)] + ([("B", s + 1, mb, pipe)] if s + 1 < p else [])
                if any(n not in end for n in needs):
                    break
                start = max([clock[d]] + [end[n] for n in needs])
                end[(kind, s, mb, pipe)] = clock[d] = start + (f if kind == "F" else b)
                position[d] += 1
                moved = True
                assert place[pipe](s) == d
        assert moved, "the reference order deadlocks"
    makespan = max(clock)
    return m * (f + b) / makespan  # every device holds m forwards and m backwards (two stages, m/2 each)


def simulate_json(*args: str) -> dict:
    result = CliRunner().invoke(main, ["simulate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_pipefisher_bert_large_v100():
    """The paper's setting: Chimera p=8, m=8, BERT-Large on V100 at micro-batch 32."""
    stats = simulate_json(str(SCHEDULES / "pipefisher.sched"), "-D", "p=8", "-D", "m=8",
                          "--profile", str(BERT_LARGE), "--microbatch-size", "32")
    costs = read_profile(str(BERT_LARGE), 32)
    expected = independent_utilization(8, 8, costs["F"], costs["B"])
    assert expected == pytest.approx(0.686, abs=5e-4)
    assert stats["utilization_unfilled"] == pytest.approx(expected, rel=1e-9)
    assert stats["utilization"] >= 0.95
    assert stats["cycle_steps"] == len(stats["step_times"]) >= 2


def test_chimera_unfilled_matches_independent_simulation():
    stats = simulate_json("chimera", "-D", "p=8", "-D", "m=8", "--profile", str(BERT_LARGE),
                          "--microbatch-size", "32")
    costs = read_profile(str(BERT_LARGE), 32)
    assert stats["utilization"] == pytest.approx(independent_utilization(8, 8, costs["F"], costs["B"]))


def compile_text(tmp_path: Path, text: str, **params):
    path = tmp_path / "s.sched"
    path.write_text(text)
    return compile_source(read_source(path), Options({k: str(v) for k, v in params.items()}))


ONE_F_ONE_B = """schedule t "test"
param p = 2
param m = 2
pipeline main { stages p; device s -> s; microbatches m }
on device d { let w = min(p - 1 - d, m) ; F * w ; (F B) * (m - w) ; B * w }
"""


def test_first_fit_in_priority_with_dependencies(tmp_path):
    """1F1B p=2 m=2 (F=1, B=2): device 0 idles 2..4 (waiting for B of stage 1) and 6..7; device 1
    idles 0..1 (nothing is ready) and 7..9 (the step's tail)."""
    result = compile_text(tmp_path, ONE_F_ONE_B + """
task a(s, i) = 1 after F(s, i)
fill bubbles with a
""")
    steps, timing = result.schedule.steps, result.timing.steps[0]
    assert len(steps) == 1
    assert [(str(op), timing.start[op]) for op in steps[0][0]] == [
        ("F(0,0)", 0), ("F(0,1)", 1), ("a(0,0)", 2), ("a(0,1)", 3), ("B(0,0)", 4), ("B(0,1)", 7)]
    assert [(str(op), timing.start[op]) for op in steps[0][1] if op.is_task] == [("a(1,0)", 7), ("a(1,1)", 8)]
    assert result.stats["utilization_unfilled"] == pytest.approx(12 / 18)
    assert result.stats["utilization"] == pytest.approx(16 / 18)


def test_tasks_that_do_not_fit_go_to_the_next_step(tmp_path):
    result = compile_text(tmp_path, ONE_F_ONE_B + """
task a(s, i) = 1 after F(s, i)
task inv(s) = 3 after a(s, *)
fill bubbles with a, inv split 3
""")
    stats, steps = result.stats, result.schedule.steps
    assert stats["cycle_steps"] == len(steps) > 1
    placed = [op for step in steps for order in step for op in order if op.is_task]
    assert sorted(map(str, placed)) == sorted(map(str, result.schedule.unplaced))
    # every inversion piece runs after all curvature of its stage, in a later step or later in time
    step_of = {op: k for k, step in enumerate(steps) for order in step for op in order if op.is_task}
    for op in placed:
        if op.kind == "inv":
            assert all(step_of[a] <= step_of[op] for a in placed if a.kind == "a" and a.stage == op.stage)
    busy = sum(op.cost for op in placed) + len(steps) * sum(result.schedule.costs[k][s] for k in "FB"
                                                             for s in range(2)) * 2
    total = 2 * sum(result.timing.steps[k].makespan for k in range(len(steps)))
    assert stats["utilization"] == pytest.approx(busy / total)


def test_at_end_runs_every_step(tmp_path):
    result = compile_text(tmp_path, ONE_F_ONE_B + """
task a(s, i) = 2.5 after F(s, i)
task pre(s) = 1 after B(s, *) at end
fill bubbles with pre, a
""")
    steps = result.schedule.steps
    for step in steps:
        for d, order in enumerate(step):
            pre = [op for op in order if op.kind == "pre"]
            assert len(pre) == 1 and order.index(pre[0]) > order.index(next(o for o in order if o.kind == "B"))


def test_a_long_cycle_is_a_warning_and_the_plan_size_bound_an_error(tmp_path):
    """Work that needs many steps makes a long cycle (a warning past 16 steps, located at the fill
    line); a cycle whose K step programs would hold more ops than a plan may is refused there."""
    text = ONE_F_ONE_B + """task a(s, i) = 50 after F(s, i)
task b(s) = 1 after a(s, *)
fill bubbles with b, a split 100
"""
    result = compile_text(tmp_path, text)
    assert result.ok and result.stats["cycle_steps"] > WARN_CYCLE
    warnings = [d for d in result.diagnostics if d.severity.value == "warning"]
    assert len(warnings) == 1 and warnings[0].span.line == 8
    assert f"cycle of {result.stats['cycle_steps']} steps" in warnings[0].message
    path = tmp_path / "s.sched"
    schedule = build_schedule(read_source(path))
    with pytest.raises(SchedError) as info:
        fill_bubbles(schedule, simulate(schedule), max_ops=200)
    text = info.value.render()
    assert ":8:1: error:" in text and "more than the 200 ops a plan may hold" in text


@pytest.mark.parametrize("tasks,known", [("", "no tasks are declared"),
                                         ("task t(s) = 3 after B(s, *)\n", "tasks: t")])
@pytest.mark.parametrize("name", ["zz", "F"])
def test_a_name_in_a_fill_list_that_is_no_task_is_a_located_error(tmp_path, tasks, known, name):
    """With tasks declared or none, `fill bubbles with NAME` names a declared task: the same error,
    at the name, exit 1 (a fill list of a schedule without tasks was not read, so a typo in it passed)."""
    path = tmp_path / "s.sched"
    path.write_text(ONE_F_ONE_B + tasks + f"fill bubbles with {name}\n")
    result = CliRunner().invoke(main, ["check", str(path)])
    line = 6 + bool(tasks)
    assert result.exit_code == 1, result.output
    assert f"{path}:{line}:19: error: unknown task '{name}' in fill ({known})" in result.output


def test_kept_activations_count_against_memory(tmp_path):
    plain = compile_text(tmp_path, ONE_F_ONE_B + "task a(s, i) = 40 after F(s, i)\nfill bubbles with a\n")
    keeping = compile_text(tmp_path, ONE_F_ONE_B + "task a(s, i) = 40 after F(s, i) keeps F(s, i)\n"
                                                   "fill bubbles with a\n")
    assert plain.stats["peak_memory"] == [2, 1]  # 1F1B: device 1 frees each activation before the next F
    assert keeping.stats["peak_memory"] == [2, 2]  # the tasks run after both backwards: both stay alive


@pytest.mark.parametrize("name,params", [("pipefisher", {"p": 4, "m": 8}), ("pipefisher", {"p": 2, "m": 2}),
                                         ("pipefisher_1f1b", {"p": 4, "m": 8}),
                                         ("pipefisher_1f1b", {"p": 2, "m": 4})])
def test_library_plans_lower_with_every_task(name, params):
    result = compile_library(name, **params)
    assert result.ok, result.diagnostics
    ranks = result.plan.ranks
    assert all(len(steps) == result.stats["cycle_steps"] for steps in ranks)
    counted = {}
    for steps in ranks:
        for program in steps:
            for instr in program:
                counted[instr.op] = counted.get(instr.op, 0) + 1
    stages, mbs = result.schedule.stages, result.schedule.microbatches
    pieces = result.stats["pieces"]  # per instance, as chosen (`split auto`) or declared
    assert counted["curvature_A"] == stages * mbs * pieces["curvature_A"]
    assert counted["curvature_B"] == stages * mbs * pieces["curvature_B"]
    pipes = len(result.schedule.pipelines)
    assert counted["inversion"] == stages * pipes * pieces["inversion"]
    assert counted["precondition"] == stages * pipes * result.stats["cycle_steps"] * pieces["precondition"]


def test_shared_task_cost_and_dependencies_cover_replicas():
    result = compile_library("pipefisher", p=2, m=2)
    inversions = [op for op in result.schedule.unplaced if op.kind == "inversion"]
    assert {op.device for op in inversions if op.stage == 0} == {0, 1}
    # 8 per stage, 2 units (a layer's two factors), shared by 2 replicas: one unit of 4 each, cut
    # into j pieces that cost `cost piece` (0.08) more per extra piece
    j = result.stats["pieces"]["inversion"]
    for stage in (0, 1):
        for pipe in (0, 1):
            costs = [op.cost for op in inversions if (op.stage, op.pipe) == (stage, pipe)]
            assert len(costs) == j and sum(costs) == pytest.approx(4.0 + (j - 1) * 0.08)
    deps = result.schedule.deps[inversions[0]]
    assert {op.pipe for op in deps} == {0, 1}


def test_refined_pieces_cost_what_splitting_costs(tmp_path):
    """`split auto` cuts each unit into j pieces (refine_tasks): piece q of p becomes q*j .. q*j+j-1 of
    p*j, chained, each costing c / j + piece * (j - 1) / j; a task that waited on a cut piece waits on
    its last part. A fill's explicit `split n` beyond the task's units charges the same."""
    base = ONE_F_ONE_B + """cost piece = 0.5
task a(s, i) = 2 after F(s, i) split 2
task inv(s) = 3 after a(s, *)
"""
    schedule = build_schedule(_source(tmp_path, base + "fill bubbles with a split auto, inv split auto\n"))
    assert [op.cost for op in schedule.unplaced if op.kind == "a"][:2] == [1.0, 1.0]  # 2 units, uncut
    cut = refine_tasks(schedule, {"a": 3})
    pieces = [op for op in cut.unplaced if op.kind == "a" and (op.stage, op.mb) == (0, 0)]
    assert [(op.part, op.parts) for op in pieces] == [(q, 6) for q in range(6)]
    assert sum(op.cost for op in pieces) == pytest.approx(2 + 4 * 0.5)  # 6 pieces for 2 units: 4 extra
    assert [cut.deps[op][-1] for op in pieces[1:]] == pieces[:-1]
    inv = next(op for op in cut.unplaced if op.kind == "inv" and op.stage == 0)
    # inv waited on both pieces (units) of a(0, 0) and a(0, 1): now on the last part of each
    assert {(op.mb, op.part) for op in cut.deps[inv]} == {(0, 2), (0, 5), (1, 2), (1, 5)}
    explicit = build_schedule(_source(tmp_path, base + "fill bubbles with a split 6, inv\n"))
    same = [op.cost for op in explicit.unplaced if op.kind == "a" and (op.stage, op.mb) == (0, 0)]
    assert same == pytest.approx([op.cost for op in pieces])


def _source(tmp_path: Path, text: str):
    path = tmp_path / "s.sched"
    path.write_text(text)
    return read_source(path)


def test_profile_piece_overhead_is_the_curvature_intercept_per_call():
    """Least squares through time_kron over micro-batches 8..64, written out here: the intercept over
    the 12 calls (2 factors of 6 nn.Linear) of a BERT layer."""
    rows = [line.split(",") for line in BERT_LARGE.read_text().splitlines()[1:]]
    points = [(float(r[0]), float(r[3])) for r in rows if float(r[0]) >= 8]
    n = len(points)
    sx, sy = sum(x for x, _ in points), sum(y for _, y in points)
    sxx, sxy = sum(x * x for x, _ in points), sum(x * y for x, y in points)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    assert piece_overhead(str(BERT_LARGE)) == pytest.approx((sy - slope * sx) / n / 12)
    assert read_profile(str(BERT_LARGE), 32)["piece"] == pytest.approx(0.1407, abs=1e-4)


SIZES = (1, 2, 4, 8, 16, 32, 64)


@pytest.mark.parametrize("model", sorted(V100))
@pytest.mark.parametrize("size", SIZES)
def test_pipefisher_on_chimera_with_v100_profiles(model, size):
    """Chimera p=8, m=8 with the library's defaults and PipeFisher's V100 profiles at every micro-batch
    size: the compile succeeds, the unfilled utilization is an independent simulation's, and the fill
    reaches >= 0.95 at micro-batches 16-64, >= 0.90 below (the measured figures: docs/benchmarks.md and
    benchmarks/pipefisher_paper.py). A lagged inversion runs before the last step of its curvature."""
    options = Options({"p": "8", "m": "8"}, read_profile(str(V100[model]), size),
                      memory=read_profile_memory(str(V100[model]), size))
    result = compile_source(read_source(SCHEDULES / "pipefisher.sched"), options)
    assert result.ok, result.diagnostics
    stats, costs = result.stats, options.costs
    assert stats["utilization_unfilled"] == pytest.approx(independent_utilization(8, 8, costs["F"], costs["B"]),
                                                          rel=1e-9)
    assert stats["utilization"] >= (0.95 if size >= 16 else 0.90)
    assert stats["utilization"] >= stats["utilization_useful"] > stats["utilization_unfilled"]
    step = {op: k for k, program in enumerate(result.schedule.steps) for order in program for op in order}
    for name in stats["lagged"]:
        kind, stage = name.rstrip(")").split("(")
        ops = [op for op in result.schedule.unplaced if op.kind == kind and op.stage == int(stage)]
        deps = [dep for op in ops for dep in result.schedule.deps[op] if dep.kind != kind]
        assert max(step[op] for op in ops) <= max(step[dep] for dep in deps)


@pytest.mark.slow
def test_model_layers_give_units_and_scale_a_profile(tmp_path):
    """`--model` spreads its layers over the stages: a profile's per-layer costs are times the stage's
    layers, and the tasks' units follow (`split layers`: BERT-Large's 24 layers on 8 stages, 3 each;
    precondition is not cut by `split auto`, so it shows the units). Fewer layers than stages: exit 2."""
    model = tmp_path / "bert-large.toml"
    model.write_text("layers = 24\nhidden = 1024\nheads = 16\nseq = 128\nvocab = 30522\n")
    row = ["-D", "p=8", "-D", "m=8", "--profile", str(BERT_LARGE), "--microbatch-size", "32"]
    per_layer = simulate_json("pipefisher", *row)
    three = simulate_json("pipefisher", *row, "--model", str(model))
    assert per_layer["pieces"]["precondition"] == 1 and three["pieces"]["precondition"] == 3
    assert three["makespan_unfilled"] == pytest.approx(3 * per_layer["makespan_unfilled"])
    assert three["utilization_unfilled"] == pytest.approx(per_layer["utilization_unfilled"])
    assert three["utilization"] >= 0.95
    model.write_text("layers = 4\nhidden = 1024\nheads = 16\nseq = 128\nvocab = 30522\n")
    refused = CliRunner().invoke(main, ["simulate", "pipefisher", *row, "--model", str(model)])
    assert refused.exit_code == 2 and "the plan has 8 model stages but the model has 4 layers to split" in refused.output


def test_a_profile_and_a_costs_file_with_a_byte_order_mark_read_as_without(tmp_path):
    """Spreadsheet tools write a byte-order mark: the profile's columns and the costs' keys are found."""
    from schedc.interop.profiles import load_costs
    marked = tmp_path / "profile.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + BERT_LARGE.read_bytes())
    assert read_profile(str(marked), 32) == read_profile(str(BERT_LARGE), 32)
    costs = tmp_path / "costs.json"
    costs.write_bytes(b'\xef\xbb\xbf{"F": 1.5, "B": 3}')
    assert load_costs(str(costs)) == {"F": 1.5, "B": 3.0}


def test_a_fill_that_outgrows_the_op_limit_is_given_up_after_a_few_cuts(tmp_path, monkeypatch):
    """`split auto` tries several cuts; each that outgrows the plan's op limit lays out about that many
    ops (pipefisher_1f1b at m = 1,000: 17 s of CPU over every cut), so after OVER_LIMIT_TRIALS of them,
    with no fill yet good, the search ends with that refusal."""
    import schedc.passes.fill as fill
    path = tmp_path / "s.sched"
    path.write_text(ONE_F_ONE_B + "task a(s, i) = 50 after F(s, i)\ntask b(s) = 1 after a(s, *)\n"
                    "fill bubbles with b, a split auto\n")
    schedule = build_schedule(read_source(path))
    calls, real = [], fill._fill
    monkeypatch.setattr(fill, "_fill", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    with pytest.raises(SchedError, match="more than the 15 ops a plan may hold"):
        fill_bubbles(schedule, simulate(schedule), max_ops=15)
    assert len(calls) == fill.OVER_LIMIT_TRIALS
    calls.clear()
    fill_bubbles(schedule, simulate(schedule))  # under the default limit the same fill is found
    assert len(calls) > fill.OVER_LIMIT_TRIALS
