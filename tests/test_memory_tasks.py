"""The timed memory model (schedc/passes/memory.py): saved gradients that tasks keep, tasks' persistent state
(K-FAC's factors), `memory K(s)` for every kind, counted by the peaks, the cycle and check_memory."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, SCHEDULES
from schedc.cli import main
from schedc.driver import compile_source, read_source
from schedc.diagnostics import SchedError
from schedc.frontend.elaborate import Options
from schedc.passes.memory import holdings

ONE_F_ONE_B = """schedule t "test"
param p = 2
param m = 1
pipeline main { stages p; device s -> s; microbatches m }
on device d { let w = min(p - 1 - d, m) ; F * w ; (F B) * (m - w) ; B * w }
"""


def compile_text(tmp_path: Path, text: str, **params):
    path = tmp_path / "s.sched"
    path.write_text(text)
    return compile_source(read_source(path), Options({k: str(v) for k, v in params.items()}))


def test_peaks_match_a_hand_computation(tmp_path):
    """1F1B p=2 m=1 (F=1, B=2): F(0,0) 0..1, F(1,0) 1..2, B(1,0) 2..4, B(0,0) 4..6. g(1,0) fits device
    1's gap at 4; g(0,0) has no gap after B(0,0) ends at 6, so it runs at 1 of step 1 (time 7..8) and
    keeps step 0's gradient of B(0,0) alive over [6, 8), when step 1's F(0,0) already holds its unit.
    device 0: state 2 + F(0,0) of step 1 1 + gradient 0.5 = 3.5; device 1: state 2 + F(1,0) 1 = 3."""
    result = compile_text(tmp_path, ONE_F_ONE_B + """
memory B(s) = 0.5
memory g(s) = 2
task g(s, i) = 1 after B(s, i) keeps B(s, i)
fill bubbles with g
""")
    assert result.ok, result.diagnostics
    assert result.stats["cycle_steps"] == 2 and result.stats["step_times"] == [6, 6]
    assert result.stats["peak_memory"] == [3.5, 3.0]
    held = holdings(result.schedule, list(result.timing.steps))
    gradients = [(str(h.op), h.step, h.start, h.end, str(h.keeper)) for d in held for h in d if h.op.kind == "B"]
    assert gradients == [("B(0,0)", 0, 6, 8, "g(0,0)"), ("B(1,0)", 0, 4, 5, "g(1,0)")]


def test_unkept_gradient_and_undeclared_memory_change_nothing(tmp_path):
    plain = compile_text(tmp_path, ONE_F_ONE_B, m=4)
    declared = compile_text(tmp_path, ONE_F_ONE_B + "memory B(s) = 5\n", m=4)
    assert declared.stats["peak_memory"] == plain.stats["peak_memory"] == [2, 1]


def test_programmed_task_state_and_keeps_count_without_fill(tmp_path):
    """A task in the programs (not filled) keeps its own step's gradient; its state is held throughout."""
    result = compile_text(tmp_path, """schedule t "test"
param p = 1
param m = 2
pipeline main { stages p; device s -> s; microbatches m }
memory B(s) = 0.25
memory g(s) = 1
task g(s, i) = 1 after B(s, i) keeps B(s, i)
on device d { F F B B g g }
""")
    # F F B(0,0) B(0,1): 2 activations; after both B, two kept gradients 0.5; state 1 throughout
    assert result.stats["peak_memory"] == [3.0]


def test_split_backward_keeps_I_gradient(tmp_path):
    result = compile_text(tmp_path, """schedule t "test"
param p = 1
param m = 1
pipeline main { stages p; device s -> s; microbatches m }
backward split
memory B(s) = 3
task g(s, i) = 1 after B(s, i) keeps B(s, i)
on device d { F I W g }
""")
    assert result.schedule.memory == {"I": (3.0,)}
    # F 0..1, I 1..2, W 2..3, g 3..4: I's gradient (3) is saved from 2 while F's unit waits for W
    assert result.stats["peak_memory"] == [4.0]


def test_memory_of_unknown_kind_is_refused(tmp_path):
    with pytest.raises(SchedError) as exc:
        compile_text(tmp_path, ONE_F_ONE_B + "memory curvature(s) = 1\n")
    assert "memory of unknown kind 'curvature'" in exc.value.diagnostics[0].message


@pytest.mark.parametrize("name,fragments", [
    ("kept_gradient.sched", ["gradient of B(0,1) of step 0 kept by g(0,1)", "task 'g' keeps outputs alive"]),
    ("factor_memory.sched", ["state of g(0) (1.5)"]),
])
def test_check_refuses_kept_gradient_and_factor_memory(name, fragments):
    result = CliRunner().invoke(main, ["check", str(FIXTURES / "broken" / name)])
    assert result.exit_code == 1, result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.mark.parametrize("name,params", [("pipefisher", ["-D", "p=8", "-D", "m=8"]), ("pipefisher", []),
                                         ("pipefisher_1f1b", [])])
def test_library_pipefisher_schedules_pass_check(name, params):
    result = CliRunner().invoke(main, ["check", str(SCHEDULES / f"{name}.sched"), *params])
    assert result.exit_code == 0, result.output


def test_pipefisher_counts_saved_errors_and_factors():
    """p=8 m=8: the declared saved gradients and factors raise every device's peak above the
    activations-only figure (8 on most devices)."""
    result = compile_source(read_source(SCHEDULES / "pipefisher.sched"), Options({"p": "8", "m": "8"}))
    kinds = {h.op.kind for d in holdings(result.schedule, list(result.timing.steps)) for h in d}
    assert {"F", "B", "curvature_A", "curvature_B"} <= kinds
    assert all(peak > 8 for peak in result.stats["peak_memory"])


def test_profile_maps_memory_columns():
    """mem_save_err and mem_kron over mem_act (BERT-Large, V100, micro-batch 32: 144, 168 and 352.06 MB)."""
    from schedc.interop.profiles import read_profile_memory
    memory = read_profile_memory(str(Path(__file__).parent / "data" / "bert-large_time_memory_v100.csv"), 32)
    assert memory["B"] == pytest.approx(144 / 352.0625)
    assert memory["curvature_A"] == memory["curvature_B"] == pytest.approx(168 / 352.0625 / 2)
    result = CliRunner().invoke(main, ["simulate", str(SCHEDULES / "pipefisher.sched"), "--profile",
                                       str(Path(__file__).parent / "data" / "bert-large_time_memory_v100.csv"),
                                       "--microbatch-size", "32", "--json"])
    assert result.exit_code == 0, result.output


def test_over_the_limit_names_the_keeping_task_where_it_is_declared(tmp_path):
    """A task a program places keeps outputs alive: the note points at its `task` line, not at the
    program line that popped it."""
    text = ("schedule keep \"x\"\nparam p = 2\nparam m = 4\n"
            "pipeline main { stages p; device s -> s; microbatches m }\n"
            "task probe(s, i) = 1 after F(s, i) keeps F(s, i)\n"
            "limit memory <= 2\n"
            "on device d {\n  F * m\n  B * m\n  probe * m\n}\n")
    notes = [note for diag in compile_text(tmp_path, text).diagnostics for note in diag.notes]
    assert "task 'probe' keeps outputs alive: declared at s.sched:5" in notes
