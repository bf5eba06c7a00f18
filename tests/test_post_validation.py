"""post_validation: the optimizer's post-validation (--post-validation, schedc/driver/post_validation.py),
steps run back to back with no synchronization between them; its steady step by hand, on a cluster through simulate
and tune, and its refusals."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from schedc import compile_file
from schedc.cli import main
from schedc.driver.post_validation import repeat_steps
from schedc.passes.simulate import simulate

# p = 2, one microbatch, a split backward; stage 1's W costs 5, every other op 1
HANDMADE = """schedule handmade "stage 1's W five times the rest"
devices 2
pipeline main { stages 2; device s -> s; microbatches 1 }
backward split
cost F(s) = 1
cost I(s) = 1
cost W(s) = 1 if s < 1 else 5
on device 0 { F(0, 0) I(0, 0) W(0, 0) }
on device 1 { F(1, 0) I(1, 0) W(1, 0) }
"""
# the paper's rows (benchmarks/zb_paper.py): p = 8, b = 6, no recomputation, blocking sends, 24 units
ROW = ["--model", "zb-1.5b", "--cluster", "a100-80gb-roce", "--microbatch-size", "6", "--recompute", "none",
       "--blocking-p2p", "--account-for-embedding", "--account-for-loss"]


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_the_steady_step_by_hand(tmp_path):
    """One step: F0 [0,1] on device 0, F1 [1,2] I1 [2,3] W1 [3,8] on device 1, I0 [3,4] W0 [4,5]: 8.
    Step 2 starts on device 0 at 5 (F [5,6]), on device 1 when its W ends at 8 (F [8,9] I [9,10] W
    [10,15]), device 0's I [10,11] W [11,12]: 15, so the second step adds 7, device 1's work; a third
    adds 7 again (22)."""
    path = tmp_path / "two.sched"
    path.write_text(HANDMADE)
    one = compile_file(str(path))
    assert one.ok and one.timing.makespan == 8
    two, three = simulate(repeat_steps(one.schedule)), simulate(repeat_steps(one.schedule, 3))
    assert (two.makespan, three.makespan) == (15, 22)
    assert (two.start[next(op for op in two.start if str(op) == "F(0,1)")],
            two.start[next(op for op in two.start if str(op) == "F(1,1)")]) == (5, 8)


def test_repeating_keeps_the_orders_and_offsets_the_microbatches():
    one = compile_file("1f1b", ["p=2", "m=3"])
    twice = repeat_steps(one.schedule)
    assert [len(order) for order in twice.orders] == [2 * len(order) for order in one.schedule.orders]
    first, second = twice.orders[0][:len(one.schedule.orders[0])], twice.orders[0][len(one.schedule.orders[0]):]
    assert list(first) == list(one.schedule.orders[0])
    assert [(op.kind, op.stage, op.mb - 3) for op in second] == [(op.kind, op.stage, op.mb) for op in first]


def _prediction(*args: str) -> dict:
    result = _cli("simulate", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_synthesized_zb_1p_overlaps_its_steps_on_the_cluster(tmp_path):
    """ZB-1p of the paper's 1.5B row at m = 24: with post-validation the iteration is at most the
    synchronized one and at least the busiest device's work plus the optimizer's tail; 1F1B, whose
    device 0 runs the first and the last op of a step, gains nothing from it."""
    out = tmp_path / "zb1p.sched"
    made = _cli("tune", "--synthesize", *ROW, "-D", "p=8", "-D", "m=24", "--activation-limit", "8", "-o", str(out))
    assert made.exit_code == 0, made.output
    batch = ["--global-batch", "144"]
    plain = _prediction(str(out), *ROW, *batch)
    overlapped = _prediction(str(out), *ROW, *batch, "--post-validation")
    tail = plain["breakdown"]["data_parallel_comm_s"] + plain["breakdown"]["optimizer_s"]
    assert max(plain["busy"]) + tail - 1e-9 <= overlapped["iteration_s"] <= plain["iteration_s"] + 1e-9
    ones = [_prediction("1f1b", "-D", "p=8", *ROW, *batch, *flag) for flag in ((), ("--post-validation",))]
    assert ones[0]["iteration_s"] == pytest.approx(ones[1]["iteration_s"], rel=1e-12)


@pytest.mark.parametrize("args, message", [
    (["1f1b", "-D", "p=8", "--zero", "2", "--dp", "2", "--global-batch", "288"], "--post-validation with --zero 2"),
    (["seq1f1b", "-D", "p=8", "-D", "k=2", "--global-batch", "144"], "--post-validation repeats a step's orders: its schedule has sequence chunks"),
])
def test_what_it_cannot_repeat_is_refused(args, message):
    result = _cli("simulate", *args, *ROW, "--post-validation")
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_tune_searches_with_it_and_names_it_in_the_winners_commands():
    result = _cli("tune", *ROW, "--gpus", "8", "--global-batch", "144", "--tp", "1", "--pp", "8",
                  "--schedules", "1f1b,zb_h1", "--post-validation")
    assert result.exit_code == 0, result.output
    assert "two steps are timed back to back" in result.output
    winner = [line for line in result.output.splitlines() if line.strip().startswith("schedc simulate")]
    assert winner and winner[0].endswith("--post-validation")
