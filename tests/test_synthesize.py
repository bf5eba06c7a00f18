"""Order synthesis under memory (`schedc tune --synthesize`, schedc/synthesize/scheduler.py): the orders pass the
compiler's checks, stay within the limit, and are no slower than the zero-bubble repo's heuristic
scheduler, ZB-H1 (limit p) and ZB-H2 (limit 2p) on the same inputs, all timed by the independent
timer of tests/zb_heuristic.py."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import zb_heuristic as ref
from conftest import ROOT
from schedc.cli import main
from schedc.diagnostics import SchedError
from schedc.synthesize.problem import make_problem
from schedc.synthesize.scheduler import synthesize
from schedc.synthesize.sched_text import number, to_sched
from schedc.synthesize.options import check_text, problem_from_options

UNIT = {"F": 1.0, "I": 1.0, "W": 1.0}
CASES = [(p, m, limit, latency) for p in (4, 8) for m in (2 * p, 4 * p) for limit in (p, 2 * p)
         for latency in (0.0, 0.5, 2.0) if latency == 0 or p * m <= 64]  # with latency: not p=8, m=32 (slow)


def _split_problem(p, m, limit, latency):
    return make_problem(p, m, {"F": (1,), "I": (1,), "W": (1,)}, latency, (limit,))


@pytest.mark.parametrize("p,m,limit,latency", CASES, ids=lambda v: str(v))
def test_synthesized_order_is_checked_fits_and_beats_the_references(p, m, limit, latency):
    result = synthesize(_split_problem(p, m, limit, latency))
    compiled = check_text(to_sched(result), "synthesized.sched", latency)
    assert compiled.ok, [d.message for d in compiled.diagnostics]
    assert max(compiled.stats["peak_memory"]) <= limit
    orders = [list(order) for order in result.orders]
    ours, peak = ref.simulate(orders, UNIT, latency)
    assert max(peak) <= limit
    assert ours == pytest.approx(compiled.stats["makespan"]) == pytest.approx(result.makespan)
    assert ours >= result.problem.lower_bound() - 1e-9
    heuristic, heuristic_peak = ref.simulate(ref.heuristic(p, m, UNIT, latency, limit), UNIT, latency)
    assert max(heuristic_peak) <= limit
    assert ours <= heuristic + 1e-9
    handmade = ref.zb_h1(p, m) if limit == p else ref.zb_h2(p, m)
    theirs, their_peak = ref.simulate(handmade, UNIT, latency)
    assert max(their_peak) <= limit
    assert ours <= theirs + 1e-9


def test_lower_bound_counts_memory():
    """With latency 2 and p activations an activation of device 0 lives at least 21 (F, 3 hops of F,
    I back, W: 1 + 3 * 3 + 1 + 3 * 3 + 1), so its 5th forward waits until 21: the 8th starts at 24
    at the earliest and its W ends at 45 or later, above the work bound 3 * 8 + 3 * 3 = 33."""
    assert _split_problem(4, 8, 4, 2.0).lower_bound() == 45
    assert _split_problem(4, 8, 8, 2.0).lower_bound() == 33


def test_references_reach_the_lower_bound_without_latency():
    """The bar is not low: with F = I = W and no latency ZB-H1, ZB-H2 and the heuristic all reach
    3m + p - 1 (the last device starts after p - 1 forwards and runs 3m of work)."""
    for p, m in ((4, 8), (8, 32)):
        assert ref.simulate(ref.zb_h1(p, m), UNIT)[0] == 3 * m + p - 1
        assert ref.simulate(ref.zb_h2(p, m), UNIT)[0] == 3 * m + p - 1
        assert ref.simulate(ref.heuristic(p, m, UNIT, 0.0, p), UNIT)[0] == 3 * m + p - 1
        assert max(ref.simulate(ref.zb_h1(p, m), UNIT)[1]) == p
        assert max(ref.simulate(ref.zb_h2(p, m), UNIT)[1]) == 2 * p


def one_f_one_b(p, m):
    """Megatron's 1F1B: p-1-d warm-up forwards, then one forward one backward, then the backwards."""
    orders = []
    for d in range(p):
        warm = min(p - 1 - d, m)
        ops = [("F", d, i) for i in range(warm)]
        for k in range(m - warm):
            ops += [("F", d, warm + k), ("B", d, k)]
        orders.append(ops + [("B", d, k) for k in range(m - warm, m)])
    return orders


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16)])
def test_full_backward_within_p_activations_matches_1f1b(p, m):
    costs = {"F": 1.0, "B": 2.0}
    result = synthesize(make_problem(p, m, {"F": (1,), "B": (2,)}, 0.0, (p,)))
    compiled = check_text(to_sched(result), "synthesized.sched")
    assert compiled.ok
    ours, peak = ref.simulate([list(o) for o in result.orders], costs)
    assert max(peak) <= p
    assert ours <= ref.simulate(one_f_one_b(p, m), costs)[0]


def test_per_stage_costs_and_limits():
    problem = make_problem(4, 8, {"F": (1, 1, 2, 1), "I": (1,), "W": (1, 2, 1, 1)}, 0.25, (4, 5, 3, 2))
    result = synthesize(problem)
    compiled = check_text(to_sched(result), "synthesized.sched", 0.25)
    assert compiled.ok, [d.message for d in compiled.diagnostics]
    assert all(peak <= limit for peak, limit in zip(compiled.stats["peak_memory"], (4, 5, 3, 2)))
    assert compiled.stats["makespan"] == pytest.approx(result.makespan)
    assert result.makespan >= problem.lower_bound()


def test_a_fractional_limit_admits_whole_activations(tmp_path):
    out = tmp_path / "half.sched"
    result = _tune("--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "I=1", "--cost", "W=1",
                   "--activation-limit", "2.5", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "peak activations 2 2 2 2 within 2.5;" in result.output
    assert "limit memory <= 2.5" in out.read_text()


def test_written_file_is_the_orders_and_is_deterministic():
    problem = _split_problem(4, 8, 4, 0.5)
    first, second = to_sched(synthesize(problem)), to_sched(synthesize(problem))
    assert first == second
    compiled = check_text(first, "synthesized.sched", 0.5)
    orders = [[(op.kind, op.stage, op.mb) for op in order] for order in compiled.schedule.orders]
    assert orders == [list(order) for order in synthesize(problem).orders]


def test_golden_file(regen_golden):
    """The file `schedc tune --synthesize -D p=4 -D m=8 --cost I=1 --cost W=1 --latency 0.5
    --activation-limit 4` writes (pytest --regen-golden rewrites it)."""
    golden = ROOT / "tests" / "golden" / "synthesized_p4_m8_limit4.sched"
    text = to_sched(synthesize(_split_problem(4, 8, 4, 0.5)))
    if regen_golden:
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


def _tune(*args):
    return CliRunner().invoke(main, ["tune", *args])


def test_cli_writes_a_file_that_check_accepts(tmp_path):
    out = tmp_path / "zb.sched"
    result = _tune("--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "I=1", "--cost", "W=1",
                   "--activation-limit", "8", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "makespan 27 (lower bound 27)" in result.output
    checked = CliRunner().invoke(main, ["check", str(out)])
    assert checked.exit_code == 0 and "ok (96 ops on 4 devices" in checked.output


@pytest.mark.parametrize("args,code,message", [
    (["-D", "p=4", "-D", "m=8", "--activation-limit", "4"], 2, "-D, --activation-limit go with --synthesize"),
    (["--synthesize", "-D", "m=8", "--activation-limit", "4"], 2, "give -D p=N"),
    (["--synthesize", "-D", "p=4", "-D", "m=x", "--activation-limit", "4"], 2, "-D m: expected an integer"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "-D", "v=2", "--activation-limit", "4"], 2, "-D v:"),
    (["--synthesize", "-D", "p=4", "-D", "m=8"], 2, "give --activation-limit"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "B=2", "--cost", "I=1", "--activation-limit", "4"], 2,
     "not both"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "X=2", "--activation-limit", "4"], 2, "KIND one of"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "F=1,2", "--activation-limit", "4"], 2, "one per stage"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "F=0", "--activation-limit", "4"], 2,
     "--cost F must be a finite number > 0 and at most 1e+15 (got 0)"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--activation-limit", "four"], 2, "expected a number"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--latency", "-1", "--activation-limit", "4"], 2, "--latency"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--activation-limit", "0.5"], 1, "no order fits: device 0"),
    (["--synthesize", "-D", "p=1000", "-D", "m=1000", "--activation-limit", "4"], 2,
     "would make 2,000,000 ops, past the limit of 10,000"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--memory-limit", "4"], 2,
     "--memory-limit: option of the configuration search, not of --synthesize (with --synthesize the limit is "
     "--activation-limit N"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--activation-limit", "4", "--model", "m.toml", "--top", "10",
      "--schedules", "zzz"], 2, "schedc: error: --schedules, --top: options of the configuration search"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--activation-limit", "4", "--cluster", "dgx-a100-80gb", "--top",
      "10"], 2, "--top: not an option of --synthesize --cluster"),  # --model and --cluster are the synthesis's too
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--activation-limit", "4", "--cluster", "dgx-a100-80gb"], 2,
     "--synthesize --cluster needs --model"),
    (["--synthesize", "-D", "p=8", "-D", "m=8", "--cluster", "a100-80gb-roce", "--model", "zb-1.5b"], 2,
     "with --cluster give --activation-limit N"),
    (["--synthesize", "-D", "p=8", "-D", "m=8", "--cluster", "a100-80gb-roce", "--model", "zb-1.5b", "--cost", "F=1",
      "--activation-limit", "8"], 2, "with --cluster the cost model gives them"),
    (["--synthesize", "-D", "p=64", "-D", "m=8", "--cluster", "a100-80gb-roce", "--model", "zb-1.5b",
      "--activation-limit", "8"], 2, "every stage needs at least one"),
    (["--synthesize", "-D", "p=4", "-D", "m=8", "--activation-limit", "4", "--costs", "missing.json"], 2,
     "cannot read costs"),
])
def test_cli_bad_input(args, code, message):
    result = _tune(*args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_measured_costs_file_gives_the_per_stage_costs(tmp_path):
    """--costs FILE (as `schedc run --profile-out` writes it) supplies F, I and W per stage; a --cost
    given too wins for its kind, but a --cost B does not throw its split away; the whole B a split
    profile also times is not ordered; a task's cost is refused."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"unit": "ms", "microbatch_size": 2, "F": [1.0, 2.0], "B": [2.5, 3.5],
                                 "I": [1.0, 1.5], "W": [1.5, 2.0]}))
    problem = problem_from_options({"p": "2", "m": "4"}, ("W=1",), 0.0, "2", str(costs))
    assert problem.split
    assert problem.costs == ((1.0, 2.0), (1.0, 1.5), (1.0, 1.0))
    with pytest.raises(SchedError) as whole:  # the measured I and W would be thrown away unsaid
        problem_from_options({"p": "2", "m": "4"}, ("B=2",), 0.0, "2", str(costs))
    assert f"--cost B with --costs {costs}, which times the backward split as I and W: give --cost I and " \
           "--cost W instead" in whole.value.render()
    costs.write_text(json.dumps({"F": 1.0, "B": 2.0, "curvature_A": 3.0}))  # a K-FAC run's profile
    result = _tune("--synthesize", "-D", "p=2", "-D", "m=4", "--activation-limit", "2", "--costs", str(costs))
    assert result.exit_code == 0 and f"--costs {costs}: curvature_A left out (not op kinds" in result.output
    costs.write_text(json.dumps({"unit": "ms", "F": [0.446, 0.542], "I": [0.301, 0.322]}))  # no W
    result = _tune("--synthesize", "-D", "p=2", "-D", "m=4", "--activation-limit", "2", "--costs", str(costs))
    assert result.exit_code == 2 and f"--costs {costs}: no measured cost for W, which the order runs" in result.output
    given = _tune("--synthesize", "-D", "p=2", "-D", "m=4", "--activation-limit", "2", "--costs", str(costs),
                  "--cost", "W=0.3")
    assert given.exit_code == 0, given.output
    costs.write_text(json.dumps({"F": [1, 1], "I": [1.5, 1.5], "W": [1.5, 1.5]}))  # a --cost of F: still split
    split = problem_from_options({"p": "2", "m": "2"}, ("F=2",), 0.0, "2", str(costs))
    assert split.split and split.costs == ((2.0, 2.0), (1.5, 1.5), (1.5, 1.5))
    costs.write_text(json.dumps({"F": [1, 0], "B": 2}))
    result = _tune("--synthesize", "-D", "p=2", "-D", "m=4", "--activation-limit", "2", "--costs", str(costs))
    assert result.exit_code == 2 and f"--costs {costs}, F must be a finite number > 0 and at most 1e+15 (stage 1: 0)" in result.output
    costs.write_text(json.dumps({"F": [1, 2, 3], "B": [2, 4, 6]}))
    result = _tune("--synthesize", "-D", "p=2", "-D", "m=4", "--activation-limit", "2", "--costs", str(costs))
    assert result.exit_code == 2 and f"--costs {costs}, F: 3 values; give one, or one per stage (2)" in result.output


def test_json_summary_and_the_written_costs(tmp_path):
    """--json prints the order's summary (the text in it without -o); per-stage costs are written as the
    command line gave them in the header and as a chain over runs of equal values in the file, which
    the compiler reads back as the same costs."""
    result = _tune("--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "F=1,1,2,2", "--cost", "I=1",
                   "--cost", "W=1", "--activation-limit", "4,4,3,2", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["valid"] and summary["peak_activations"] == [4, 4, 3, 2]
    assert summary["costs"]["F"] == [1, 1, 2, 2] and summary["activation_limit"] == [4, 4, 3, 2]
    text = summary["sched"]
    dash = _tune("--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "F=1,1,2,2", "--cost", "I=1", "--cost", "W=1",
                 "--activation-limit", "4,4,3,2", "--json", "-o", "-")
    assert json.loads(dash.stdout)["sched"] == text  # -o - with --json: the text in the JSON, stdout parses
    assert "p=4, m=8, F=1,1,2,2, I=1, W=1" in text and "activation limit 4,4,3,2 per device" in text
    assert "cost F(s) = 1 if s < 2 else 2\n" in text
    assert "limit memory <= 4 if d < 2 else 3 if d < 3 else 2\n" in text
    compiled = check_text(text, "synthesized.sched")
    forwards = {op.stage: op.cost for order in compiled.schedule.orders for op in order if op.kind == "F"}
    assert [forwards[s] for s in range(4)] == [1, 1, 2, 2]
    assert compiled.stats["makespan"] == summary["makespan"]


def test_the_op_limit_counts_the_kinds_the_order_runs():
    """F and B: 2 p m ops (p=2, m=2,500 is 10,000, budget.SYNTHESIS_OPS's limit); F, I and W: 3 p m."""
    assert make_problem(2, 2_500, {"F": (1.0,), "B": (2.0,)}, 0.0, (2.0,)).m == 2_500
    with pytest.raises(SchedError) as caught:
        make_problem(2, 2_500, {"F": (1.0,), "I": (1.0,), "W": (1.0,)}, 0.0, (2.0,))
    assert caught.value.exit_code == 2
    assert "(2 stages x 2,500 microbatches x 3 op kinds) would make 15,000 ops, past the limit of 10,000" \
        in caught.value.render()


@pytest.mark.slow
def test_32_devices_are_synthesized_or_refused_in_seconds(tmp_path):
    """p = 32: within the op budget the whole synthesis (greedy variants, local search, the .sched
    compiled back) finishes, its order as the written file compiles; past it the refusal comes before
    any work, naming the limit."""
    import time
    out = tmp_path / "p32.sched"
    result = CliRunner().invoke(main, ["tune", "--synthesize", "-D", "p=32", "-D", "m=64", "--activation-limit",
                                       "8", "-o", str(out)])
    assert result.exit_code == 0 and "peak activations 8 8 8 8 8 8 8 8" in result.output, result.output
    assert CliRunner().invoke(main, ["check", str(out)]).exit_code == 0
    started = time.process_time()
    refused = CliRunner().invoke(main, ["tune", "--synthesize", "-D", "p=32", "-D", "m=1000", "--activation-limit",
                                        "8", "-o", str(tmp_path / "no.sched")])
    assert refused.exit_code == 2 and "64,000 ops, past the limit of 10,000" in refused.output, refused.output
    assert time.process_time() - started < 5 and not (tmp_path / "no.sched").exists()


def test_a_whole_measured_backward_is_not_dropped_for_given_halves(tmp_path):
    """A costs file that times B (not I and W) with --cost I and --cost W: the measured B would be
    thrown away unsaid and milliseconds mixed with the given units, so it is refused, as the mirror
    case (--cost B over a split file) is."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"F": [2.011054, 1.44], "B": [3.0, 3.0]}))
    with pytest.raises(SchedError) as caught:
        problem_from_options({"p": "2", "m": "4"}, ("I=1", "W=1"), 0.0, "2", str(costs))
    assert f"--cost I and --cost W with --costs {costs}, which times the backward whole as B: give --cost B " \
           "instead" in caught.value.render()
    with pytest.raises(SchedError) as caught:
        problem_from_options({"p": "2", "m": "4"}, ("W=1",), 0.0, "2", str(costs))
    assert f"--cost W with --costs {costs}, which times the backward whole as B" in caught.value.render()


def test_the_written_costs_are_exact_so_the_file_times_what_was_searched(tmp_path):
    """Costs are written in their shortest exact form (2.011054 was written 2.01105): the file's
    makespan is the search's, never below the search's lower bound."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"F": [2.011054, 1.440811, 1.440811, 1.440811], "B": [3.0000004] * 4}))
    result = _tune("--synthesize", "-D", "p=4", "-D", "m=8", "--activation-limit", "4", "--costs", str(costs),
                   "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert "cost F(s) = 2.011054 if s < 1 else 1.440811" in summary["sched"] and "cost B = 3.0000004" in summary["sched"]
    assert summary["makespan"] >= summary["lower_bound"]
    assert number(1.0) == "1" and number(0.5) == "0.5" and number(1e6) == "1e+06" and number(0.1 + 0.2) == repr(0.1 + 0.2)


# Deferred W's memory in bytes: the cost model's, through its one function ---------------------------

SPLIT = {"F": (1.0,), "I": (1.0,), "W": (1.0,)}

def _deferred_w_reference(s: int, b: int, h: int, f: int, width: int) -> float:
    """What a deferred W reads, written afresh from Qi et al. 2024 (section 2: W needs the inputs of the
    weight GEMMs and their output gradients), one layer at t = 1: the inputs of QKV (h), the projection
    (h), the MLP's two GEMMs (h, f) and the gradients out of them (3h, h, f, h) per token."""
    inputs, gradients = h + h + h + f, 3 * h + h + f + h
    return width * s * b * (inputs + gradients)


@pytest.mark.parametrize("shape", [dict(layers=8, hidden=1024, heads=16, seq=1024, ffn=4096, b=2, p=4),
                                   dict(layers=6, hidden=768, heads=12, seq=512, ffn=2304, b=4, p=3)],
                         ids=["f=4h", "f=3h"])
def test_synthesis_charges_a_deferred_w_the_cost_models_bytes(shape):
    """make_problem with a model charges, per stage, F what it keeps, I what it frees less what its W
    reads, W what it frees: the cost model's stage_backward_bytes (what the compile's memory asks),
    equal to the reference above (32·s·b·h at 16 bits with f = 4h: the paper's M_W) times the layers."""
    from schedc.costmodel.bytes import layer_activation_bytes, stage_backward_bytes
    from schedc.costmodel.specs import ModelSpec
    from schedc.layout import Layout
    model = ModelSpec(shape["layers"], shape["hidden"], shape["heads"], shape["seq"], 51200, shape["ffn"], "bf16")
    layout = Layout(microbatch_size=shape["b"], recompute="none")
    p = shape["p"]
    problem = make_problem(p, 8, SPLIT, 0.0, (1e12,), bytes_of=(model, layout))
    layers = shape["layers"] // p
    want = layers * _deferred_w_reference(shape["seq"], shape["b"], shape["hidden"], shape["ffn"], 2)
    if shape["ffn"] == 4 * shape["hidden"]:
        assert want == layers * 32 * shape["seq"] * shape["b"] * shape["hidden"]
    kept = layers * layer_activation_bytes(model, layout)
    assert problem.unit == "bytes"
    for s in range(p):
        assert -problem.memory[2][s] == pytest.approx(want, rel=1e-12)
        assert -problem.memory[2][s] == stage_backward_bytes(model, layout, p)[s][1]
        assert problem.memory[0][s] == pytest.approx(kept, rel=1e-12)
        assert problem.memory[1][s] == pytest.approx(want - kept, rel=1e-12)


def _most_deferred(order) -> int:
    """The most weight gradients a device's order holds deferred at once (I run, its W not yet)."""
    held = most = 0
    for kind, _, _ in order:
        held += (kind == "I") - (kind == "W")
        most = max(most, held)
    return most


def test_a_tight_memory_limit_keeps_fewer_ws_deferred_and_the_compile_agrees(tmp_path):
    """Under a limit of p forwards' activations (selective recomputation: a deferred W holds nearly
    what a forward keeps), the synthesis defers fewer Ws than without a limit, and the order written
    as .sched, compiled on a cluster with the model (the normal path), peaks within the limit on every
    device, by the cost model's own count."""
    from schedc.costmodel import Setting
    from schedc.costmodel.bytes import activation_peak_parts, stage_backward_bytes
    from schedc.costmodel.specs import ModelSpec, load_cluster
    from schedc.driver.cluster import compile_for
    from schedc.layout import Layout
    model = ModelSpec(4, 1024, 16, 2048, 51200, 4096, "bf16")
    layout = Layout(microbatch_size=1, recompute="selective")
    p, m = 4, 8
    kept, deferred = stage_backward_bytes(model, layout, p)[0]
    deferrals = {}
    for name, limit in (("loose", m * (kept + deferred)), ("tight", p * kept)):
        problem = make_problem(p, m, SPLIT, 0.0, (limit,), bytes_of=(model, layout))
        result = synthesize(problem)
        assert result.makespan >= problem.lower_bound() - 1e-9
        deferrals[name] = [_most_deferred(order) for order in result.orders]
        path = tmp_path / f"{name}.sched"
        path.write_text(to_sched(result))
        on = compile_for(str(path), {}, Setting(model, load_cluster("dgx-a100-80gb"), layout), lower=False)
        assert on.compiled.ok, [d.message for d in on.compiled.diagnostics]
        peaks = [peak for peak, _ in activation_peak_parts(model, layout, on.compiled.schedule)]
        assert max(peaks) <= limit * (1 + 1e-12)
        assert peaks == pytest.approx(list(result.peak), rel=1e-12)
    assert sum(deferrals["tight"]) < sum(deferrals["loose"])
    assert max(deferrals["tight"]) < max(deferrals["loose"])


def test_a_memory_limit_below_one_forward_is_refused_in_bytes():
    from schedc.costmodel.specs import ModelSpec
    from schedc.layout import Layout
    model = ModelSpec(4, 1024, 16, 2048, 51200, 4096, "bf16")
    problem = make_problem(2, 4, SPLIT, 0.0, (1e6,), bytes_of=(model, Layout(microbatch_size=1)))
    with pytest.raises(SchedError) as caught:
        synthesize(problem)
    assert "device 0 has a memory limit of 1e+06 bytes, and a forward holds" in caught.value.render()


def test_tune_synthesizes_in_the_models_bytes_with_model_and_memory_limit(tmp_path):
    """`--model M --microbatch-size b --recompute R --memory-limit X`: the synthesis counts the cost
    model's bytes; `--activation-limit` with --model, and `--memory-limit` without it, are refused."""
    model = tmp_path / "m.toml"
    model.write_text("layers = 4\nhidden = 1024\nheads = 16\nseq = 2048\nvocab = 51200\n")
    base = ["--synthesize", "-D", "p=4", "-D", "m=8", "--cost", "I=1", "--cost", "W=1"]
    sized = [*base, "--model", str(model), "--microbatch-size", "1", "--recompute", "selective"]
    made = _tune(*sized, "--memory-limit", "0.5GiB", "--json")
    assert made.exit_code == 0, made.output
    summary = json.loads(made.stdout)
    assert summary["memory_unit"] == "bytes" and summary["activation_limit"] == [0.5 * 2**30] * 4
    assert max(summary["peak_activations"]) <= 0.5 * 2**30 and "\nlimit memory" not in summary["sched"]
    wrong = _tune(*sized, "--activation-limit", "4")
    assert wrong.exit_code == 2 and "with --model the limit is --memory-limit" in wrong.output
    alone = _tune(*base, "--memory-limit", "0.5GiB")
    assert alone.exit_code == 2 and "or with --model, --microbatch-size b, --memory-limit in bytes" in alone.output
    small = _tune(*sized, "--memory-limit", "0.05GiB")  # a forward keeps 34·s·b·h bytes, 71 MB
    assert small.exit_code == 1 and "device 0 has a memory limit of 5.36871e+07 bytes, and a forward holds " \
        f"{34 * 2048 * 1024:g}" in small.output


def _paper_count(order, deferred):
    """The zero bubble scheduler's memory, counted afresh along one device's order: a forward's whole
    activation (1) until its I, then its deferred W's share until W; the peak."""
    alive = peak = 0.0
    for kind, _, _ in order:
        alive += {"F": 1.0, "I": deferred - 1.0, "W": -deferred}[kind]
        peak = max(peak, alive)
    return peak


def test_a_deferred_w_holding_part_of_an_activation_lets_more_of_them_wait():
    """With `deferred` (the paper's M_W / M_B) a W from its I on holds only that share: the orders stay
    within the limit under that count, hold more whole units than the limit somewhere (what a unit held
    until W could not), are no slower than under the unit count, and stay above the lower bound."""
    p, m, limit, share = 4, 16, 4, 0.25
    costs = {"F": (1,), "I": (1,), "W": (1,)}
    shared = synthesize(make_problem(p, m, costs, 0.0, (limit,), deferred=share))
    whole = synthesize(make_problem(p, m, costs, 0.0, (limit,)))
    assert all(_paper_count(order, share) <= limit + 1e-9 for order in shared.orders)
    assert max(ref.simulate([list(o) for o in shared.orders], UNIT)[1]) > limit
    assert ref.simulate([list(o) for o in shared.orders], UNIT)[0] == pytest.approx(shared.makespan)
    assert shared.makespan <= whole.makespan + 1e-9
    assert shared.makespan >= shared.problem.lower_bound() - 1e-9
    assert max(shared.peak) == pytest.approx(max(_paper_count(o, share) for o in shared.orders))
    assert "limit memory" not in [line.split(" <=")[0] for line in to_sched(shared).splitlines()]


@pytest.mark.parametrize("share,costs", [(0.0, {"I": (1,), "W": (1,)}), (1.5, {"I": (1,), "W": (1,)}),
                                         (0.5, {"B": (2,)})])
def test_a_deferred_share_outside_zero_to_one_or_without_a_split_backward_is_refused(share, costs):
    with pytest.raises(SchedError, match="deferred W's share"):
        make_problem(4, 8, {"F": (1,), **costs}, 0.0, (4,), deferred=share)


@pytest.mark.parametrize("args, message", [
    (["--activation-limit", "-1"], "schedc tune: error: --activation-limit: expected finite numbers >= 0, got '-1'"),
    (["--activation-limit", "nan"], "--activation-limit: expected finite numbers >= 0"),
    (["--model", "gpt-1.7b", "--microbatch-size", "1", "--memory-limit", "1e400GiB"],
     "schedc: error: --memory-limit 1e400GiB: more than 1e+18 bytes"),
])
def test_synthesis_limits_out_of_range_are_usage_errors_of_the_command(args, message):
    result = CliRunner().invoke(main, ["tune", "--synthesize", "-D", "p=4", "-D", "m=8", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "schedc check" not in result.output


def test_a_rows_own_costs_give_zb_1p_and_simulate_cluster_predicts_the_file(tmp_path):
    """`tune --synthesize --model M --cluster C` (ZB-1p: a limit of p activations) writes the order with
    the cost model's F, I and W of the row's stages in seconds; `simulate --cluster` under the same
    options elaborates the file with the cost model's costs and times it to the synthesis's makespan
    (the messages of one A100 node's NVLink add under 0.1 %)."""
    row = ["--model", "zb-1.5b", "--cluster", "a100-80gb-roce", "--microbatch-size", "6", "--recompute", "none",
           "--blocking-p2p", "--account-for-embedding", "--account-for-loss"]
    out = tmp_path / "zb1p.sched"
    made = _tune("--synthesize", *row, "-D", "p=8", "-D", "m=8", "--activation-limit", "8", "-o", str(out), "--json")
    assert made.exit_code == 0, made.output
    summary = json.loads(made.output[made.output.index("{"):])
    assert summary["p"] == 8 and summary["activation_limit"] == [8] * 8
    assert summary["costs"]["F"][1] > summary["costs"]["F"][0]  # stage 0: two layers and the embedding, 1: three
    assert max(summary["peak_activations"]) <= 8 + 1e-9  # a deferred W counted as its share, as synthesized
    predicted = CliRunner().invoke(main, ["simulate", str(out), *row, "--global-batch", "48", "--json"])
    assert predicted.exit_code == 0, predicted.output
    assert json.loads(predicted.output)["makespan"] == pytest.approx(summary["makespan"], rel=1e-3)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 16)])
def test_the_eager_variant_is_order_greedys_rule(p, m, monkeypatch):
    """The two list-scheduling clocks (docs/internals.md, "One timing engine") agree where their rules
    do: the synthesis's variant without warm-up caps below the limit, guard or alternation places every
    op as `greedy by ([I, F, W], i) inflight <= limit` does, latency included."""
    import functools

    from schedc.diagnostics import Source
    from schedc.driver.inputs import compile_source
    from schedc.frontend import elaborate
    from schedc.frontend.greedy import order_greedy
    from schedc.synthesize.problem import EAGER
    from schedc.synthesize.scheduler import _list_schedule
    for limit in (2, p):
        for latency in (0.0, 1.0):
            for f, i, w in ((1, 1, 1), (1, 2, 1), (2, 1, 1)):
                problem = make_problem(p, m, {"F": (f,), "I": (i,), "W": (w,)}, latency, (limit,))
                synthesized = _list_schedule(problem, (min(limit, m),) * p, EAGER, False)
                monkeypatch.setattr(elaborate, "order_greedy", functools.partial(order_greedy, latency=latency))
                text = (f'schedule g "greedy"\nparam p = {p}\nparam m = {m}\n'
                        "pipeline main { stages p; device s -> s; microbatches m }\nbackward split\n"
                        f"cost F = {f}\ncost I = {i}\ncost W = {w}\ngreedy by ([I, F, W], i) inflight <= {limit}\n")
                greedy = compile_source(Source("greedy.sched", text)).schedule.orders
                assert [[(op.kind, op.mb) for op in order] for order in greedy] == \
                    [[(problem.name(k), mb) for k, _, mb in order] for order in synthesized], (limit, latency, f, i, w)
