"""check_structure and the refusal corpus (tests/fixtures/broken): exit codes, messages, locations."""
from __future__ import annotations

import csv
import io
import re

import pytest
from click.testing import CliRunner

import reference_orders as R
from conftest import FIXTURES, compile_library
from schedc.cli import main

BROKEN = FIXTURES / "broken"

# file, exit code, (line:col, message fragment) that must be reported
CORPUS = [
    ("deadlock.sched", 1, [("11:3", "device 0 waits at B(0,0) for B(1,0) on device 1, ordered after F(1,1) "
                                    "at deadlock.sched:18, which waits at F(1,1) for F(0,1) on device 0")]),
    ("backward_first.sched", 1, [("9:3", "waits at B(0,0) for F(0,0), which device 0 runs later")]),
    ("memory.sched", 1, [("11:3", "device 0: 3 activation units alive at time 2 when F(0,2) runs, over the "
                                  "limit 2 (peak 4); alive: F(0,0), F(0,1), F(0,2)")]),
    ("kept_gradient.sched", 1, [("12:52", "device 0: 3 units held at time 1 of step 1 of the cycle when F(0,1) of "
                                          "step 1 is added, over the limit 2 (peak 3); held: gradient of B(0,1) "
                                          "of step 0 kept by g(0,1), F(0,0) of step 1, F(0,1) of step 1")]),
    ("factor_memory.sched", 1, [("11:52", "held: state of g(0) (1.5), F(0,0), F(0,1)")]),
    ("duplicate.csv", 1, [("2:17", "F(1,1) runs twice")]),
    ("missing.csv", 1, [("2:1", "device 1 never runs B(1,1)"), ("1:13", "which no device runs")]),
    ("out_of_range.csv", 1, [("1:9", "microbatch 2 is outside the microbatches 0..1")]),
    ("two_ranks.csv", 1, [("1:17", "stage 1 of pipeline 'main' is on device 1, but device 0 runs it too")]),
    ("bad_cell.csv", 2, [("2:9", "bad cell '1X0'"), ("2:17", "bad cell 'zz'")]),
    ("overlap_own_microbatch.sched", 1, [("8:20", "F(1,0) & B(1,0) on device 1: a backward cannot overlap a "
                                                  "forward of its own microbatch")]),
    ("overlap_own_microbatch.csv", 1, [("2:1", "F(1,0) & B(1,0) on device 1: a backward cannot overlap")]),
    ("negative_task_cost.sched", 1, [("5:13", "cost of task t must be a finite number >= 0 and at most 1e+15, "
                                              "got -100 (at s=0)")]),  # it simulated to utilization -10.4
    ("unknown_kind_in_choice.sched", 1, [("5:34", "program pops Bx: unknown kind 'Bx' (kinds: B, F)"),
                                         ("5:48", "program pops Q: unknown kind 'Q' (kinds: B, F)")]),  # were "ok"
    ("queue_without_programs.sched", 1, [("5:1", "'queue' orders the pops of per-device programs")]),  # ignored
    ("task_cycle.sched", 1, [("5:1", "task dependencies form a cycle: a(0) -> b(0) -> a(0)")]),  # was "a
    # dependency is neither an op of the schedule nor a task that gets placed"
]


def run_check(*args):
    result = CliRunner().invoke(main, ["check", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize("name,code,expected", CORPUS, ids=[c[0] for c in CORPUS])
def test_broken_corpus_is_refused_with_locations(name, code, expected):
    result = run_check(BROKEN / name)
    assert result.exit_code == code, result.output
    for where, fragment in expected:
        line = next((x for x in result.output.splitlines() if f"{name}:{where}: error:" in x), None)
        assert line is not None and fragment in line, (where, fragment, result.output)


def torch_1f1b_csv(p: int, m: int) -> str:
    """torch 2.13's Schedule1F1B._get_pipeline_order() written as its compute-only CSV."""
    from torch.distributed.pipelining.schedules import Schedule1F1B
    order = Schedule1F1B(R._MockStage(0, p, 0, p), m).pipeline_order
    buf = io.StringIO()
    writer = csv.writer(buf)
    for rank in range(p):
        writer.writerow(["" if a is None else str(a) for a in order[rank]])
    return buf.getvalue()


def test_torch_1f1b_from_the_wild_is_refused_naming_every_fault(tmp_path):
    import torch.distributed.pipelining  # noqa: F401 - torch is a test dependency
    text = torch_1f1b_csv(4, 8)
    assert "3F8" in text and "3F0" not in text  # the bug this test is about
    path = tmp_path / "torch_1f1b.csv"
    path.write_text(text)
    result = run_check(path)
    assert result.exit_code == 1
    out = result.output
    column = text.splitlines()[3].index("3F8") + 1
    assert f"torch_1f1b.csv:4:{column}: error: F(3,8) on device 3: microbatch 8 is outside" in out
    assert "torch_1f1b.csv:4:5: error: B(3,0) on device 3 runs before its forward: no device runs F(3,0)" in out
    assert "error: device 3 never runs F(3,0)" in out
    assert "deadlock: device 3 waits at B(3,0) for F(3,0), which no device runs" in out
    assert "[B(3,0)]" in out  # the grid marks where device 3 is stuck


def test_structure_reports_every_fault_of_a_mutated_order():
    import dataclasses
    from schedc.checks.structure import check_structure
    schedule = compile_library("1f1b", p=4, m=4).schedule
    orders = [list(o) for o in schedule.orders]
    orders[0].append(orders[0][0])                          # duplicate F(0,0)
    orders[2].append(dataclasses.replace(orders[1].pop(), device=2))  # B(1,3) moved to device 2
    orders[3][0] = dataclasses.replace(orders[3][0], mb=9)  # F(3,9) out of range, F(3,0) missing
    mutated = dataclasses.replace(schedule, orders=tuple(map(tuple, orders)))
    messages = [d.message for d in check_structure(mutated)]
    assert any("F(0,0) runs twice" in m for m in messages)
    assert any("stage 1 of pipeline 'main' is on device 1, but device 2 runs it too: B(1,3)" in m for m in messages)
    assert any("F(3,9) on device 3: microbatch 9 is outside" in m for m in messages)
    assert any("device 3 never runs F(3,0)" in m for m in messages)


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "chimera", "interleaved_1f1b"])
def test_library_structure_is_clean(name):
    from schedc.checks.structure import check_structure
    assert check_structure(compile_library(name, p=4, m=8).schedule) == []


def test_output_is_deterministic():
    first = run_check(BROKEN / "two_ranks.csv").output
    assert first == run_check(BROKEN / "two_ranks.csv").output
    assert re.search(r"two_ranks.csv: 2 errors", first)


@pytest.mark.parametrize("name", ["v_half", "v_min", "dualpipev"])
def test_a_mixed_backwards_expected_ops_are_f_and_its_chosen_backward_per_unit(name):
    from schedc.checks.census import expected_keys
    schedule = compile_library(name, p=4, m=8).schedule
    expected = set()  # F per (stage, microbatch), then B where the programs ran it whole, I and W where split
    for k, pipe in enumerate(schedule.pipelines):
        for s in range(pipe.stages):
            for mb in pipe.microbatches:
                halves = ("I", "W") if (k, s, mb) in schedule.split_of else ("B",)
                expected.update((kind, s, mb, k, 0) for kind in ("F", *halves))
    units = sum(pipe.stages * len(pipe.microbatches) for pipe in schedule.pipelines)
    assert 0 < len(schedule.split_of) <= units  # the split choice is exercised
    assert expected_keys(schedule) == expected


def test_a_reload_without_its_offload_is_named_not_a_traceback(tmp_path):
    """An edited plan of offload_1f1b whose O instructions were removed: each L is reported as running
    before its offload, which no device runs (was a KeyError in check, simulate and render)."""
    import hashlib
    import json
    from click.testing import CliRunner
    from schedc.cli import main
    out = tmp_path / "plan"
    assert CliRunner().invoke(main, ["compile", "offload_1f1b", "-D", "p=2", "-D", "m=4", "-o", str(out)]).exit_code == 0
    obj = json.loads((out / "plan.json").read_text())
    for rank in obj["ranks"]:
        for step in rank["steps"]:
            step[:] = [i for i in step if i["op"] != "O"]
    body = {k: v for k, v in obj.items() if k not in ("format", "version", "hash")}
    obj["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (tmp_path / "no_o.json").write_text(json.dumps(obj))
    for verb in (["check"], ["simulate"], ["render", "-o", str(tmp_path / "x.svg")]):
        result = CliRunner().invoke(main, [verb[0], str(tmp_path / "no_o.json"), *verb[1:]])
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert "L(0,0) on device 0 runs before its offload: no device runs O(0,0)" in result.output
