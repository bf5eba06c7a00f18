"""fill_bubbles: PipeFisher's K-FAC tasks in the bubbles, the cycle of steps, stats and errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SCHEDULES, compile_library
from reference_orders import chimera
from schedc.cli import main
from schedc.compiler import compile_source, read_source
from schedc.diagnostics import SchedError
from schedc.frontend.elaborate import Options
from schedc.interop.profiles import read_profile

DATA = Path(__file__).resolve().parent / "data"
BERT_LARGE = DATA / "bert-large_time_memory_v100.csv"


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


def test_cycle_cap_is_an_error_at_the_fill_statement(tmp_path):
    with pytest.raises(SchedError) as info:
        compile_text(tmp_path, ONE_F_ONE_B + """
task a(s, i) = 50 after F(s, i)
task b(s) = 1 after a(s, *)
fill bubbles with b, a split 100
""")
    text = info.value.render()
    assert "more than 16 steps" in text
    assert ":8:1:" in text or "fill bubbles" in text


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
    c, k = result.schedule.params["c"], result.schedule.params["k"]
    assert counted["curvature_A"] == counted["curvature_B"] == stages * mbs * c
    pipes = len(result.schedule.pipelines)
    assert counted["inversion"] == stages * pipes * k
    assert counted["precondition"] == stages * pipes * result.stats["cycle_steps"]


def test_shared_task_cost_and_dependencies_cover_replicas():
    result = compile_library("pipefisher", p=2, m=2, k=1)
    inversions = [op for op in result.schedule.unplaced if op.kind == "inversion"]
    assert {op.device for op in inversions if op.stage == 0} == {0, 1}
    assert all(op.cost == 4.0 for op in inversions)  # 8 per stage, shared by 2 replicas
    deps = result.schedule.deps[inversions[0]]
    assert {op.pipe for op in deps} == {0, 1}
