"""schedc/search: the configuration search. Its shortcuts (one elaboration per order, simulate's timing
over a cached predecessor index, the bound, the cache) are held to the plain form: driver.cluster.compile_for
of the same candidate, and the same search with --exhaustive. References for the bound come from the
bubble formulas of the papers, written here."""
from __future__ import annotations

import json
import random
import re
import shlex

import pytest
from click.testing import CliRunner

from conftest import ROOT
from schedc.cli import main
from schedc.driver.cluster import compile_for
from schedc.search.bounds import Shape, makespan_bound, tail_bound
from schedc.layout import SWITCH_NAMES, Layout
from schedc.search import Candidate, Refusal, Request, Searcher, candidates, search
from schedc.cli.tune_report import matching, report, why_lines
from schedc.text import ordinal

SMALL = """layers = 8
hidden = 1024
heads = 16
seq = 512
vocab = 8192
"""
CLUSTER = "dgx-a100-80gb"
LIBRARY = ("1f1b", "interleaved_1f1b", "gpipe", "chimera")


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return str(path)


def request(model, gpus=16, batch=32, **kw) -> Request:
    """The request, the layout's switches among `kw` gathered into its Layout."""
    switches = {name: kw.pop(name) for name in SWITCH_NAMES if name in kw}
    return Request(model, CLUSTER, gpus, batch, kw.pop("schedules", LIBRARY), layout=Layout(**switches), **kw)


def key(ranked):
    return [(r.candidate, round(r.iteration_s, 12)) for r in ranked]


def merged_key(ranked, top):
    """The rows with every schedule merged into one listed as its own, best first (ties by candidate, as
    the exhaustive search breaks them), the first `top`: what the exhaustive search ranks."""
    rows = sorted((r.iteration_s, c) for r in ranked for c in (r.candidate, *r.same))
    return [(c, round(t, 12)) for t, c in rows][:top]


@pytest.mark.parametrize("blocking", [False, True])
def test_the_shortcut_prediction_is_compile_fors(model, blocking):
    """Every field of the prediction, for a sample of the space across the four schedules, equals
    driver.cluster.compile_for's (whole elaboration with the costs, analyse, simulate with links and without),
    with sends that let the sender go on and with blocking ones."""
    searcher = Searcher(request(model, memory_limit=1e15, blocking_p2p=blocking))
    space = candidates(searcher.model, list(searcher.entries.values()), searcher.request)
    assert compared_with_compile_for(searcher, random.Random(7).sample(space, 40)) >= 20


def compared_with_compile_for(searcher, sample) -> int:
    """How many candidates of `sample` the searcher's shortcut predicts field for field as
    driver.cluster.compile_for does; a candidate the schedule refuses must be refused by both."""
    compared = 0
    for c in sample:
        fast = searcher.evaluate(c, free=True)
        try:
            plain = compile_for(c.schedule, c.params(), searcher.setting(c), lower=False).prediction
        except Exception:  # noqa: BLE001 - the schedule refuses the params: so must the shortcut
            assert isinstance(fast, Refusal)
            continue
        assert not isinstance(fast, Refusal), (c, fast)
        assert fast.iteration_s == plain.iteration_s and fast.memory_bytes == plain.memory_bytes
        assert fast.tflops_per_gpu == plain.tflops_per_gpu and fast.breakdown == plain.breakdown
        assert fast.device_memory == plain.device_memory
        compared += 1
    return compared


@pytest.mark.parametrize("blocking", [False, True])
def test_dualpipes_overlapped_pairs_take_the_shortcut_and_match_compile_for(model, blocking):
    """DualPipe and DualPipeV (a mixed backward, F & B pairs): one order per (schedule, p, m), timed
    per cost vector with each pair fused as simulate fuses it, field for field compile_for's."""
    searcher = Searcher(request(model, batch=64, memory_limit=1e15, blocking_p2p=blocking,
                                schedules=("dualpipe", "dualpipev")))
    assert not any(entry.plain for entry in searcher.entries.values())
    space = candidates(searcher.model, list(searcher.entries.values()), searcher.request)
    compared = compared_with_compile_for(searcher, [c for c in space if c.p in (2, 4) and c.b <= 2])
    assert compared >= 20 and searcher.counts["structures"] < compared


def test_a_search_with_dualpipe_ranks_as_the_exhaustive_one(model):
    kw = {"schedules": ("1f1b", "zb_h1", "dualpipe", "dualpipev"), "batch": 64, "blocking_p2p": True}
    cached, reference = search(request(model, **kw)), search(request(model, exhaustive=True, **kw))
    assert merged_key(cached.ranked, len(reference.ranked)) == key(reference.ranked)
    assert cached.counts["simulated"] < reference.counts["simulated"]


@pytest.mark.parametrize("kw", [{}, {"gpus": 8, "batch": 64, "memory_limit": 3 * 2**30},
                                {"per": "schedule", "top": 3}, {"per": "t", "top": 2},
                                {"overlap_grad_reduce": True, "recompute": ("full",)},
                                {"blocking_p2p": True, "gpus": 8, "batch": 64},
                                {"distributed_optimizer": True, "overlap_grad_reduce": True, "gpus": 8, "batch": 64,
                                 "memory_limit": 3 * 2**30}])
def test_the_bounded_search_ranks_as_the_exhaustive_one(model, kw):
    pruned = search(request(model, **kw))
    reference = search(request(model, exhaustive=True, **kw))
    assert merged_key(pruned.ranked, len(reference.ranked)) == key(reference.ranked)
    assert pruned.counts["simulated"] < reference.counts["simulated"]
    assert pruned.counts["bounded"] > 0 and reference.counts["bounded"] == 0


def test_the_whole_librarys_best_of_each_schedule_is_the_exhaustive_searchs():
    """Every library schedule (split, mixed and V-shaped backwards, two pipelines) at GPT 1.7B's sizes under
    a limit that refuses some by their state or their orders' starts: the bounded, cached walk's best
    of each schedule is the exhaustive one's, iteration times to 1e-12 s."""
    kw = {"top": 1, "per": "schedule", "memory_limit": 12 * 2**30}
    fast = search(Request("gpt-1.7b", CLUSTER, 16, 64, **kw))
    reference = search(Request("gpt-1.7b", CLUSTER, 16, 64, exhaustive=True, **kw))
    assert key(fast.ranked) == key(reference.ranked)
    assert len(reference.ranked) >= 12 and {"v_half", "zbv", "dualpipe", "chimera"} <= {
        r.candidate.schedule for r in reference.ranked}
    assert fast.counts["started"] > 0 and fast.counts["bounded"] > 0 and fast.counts["over_memory"] > 0


@pytest.mark.parametrize("kw", [{}, {"overlap_grad_reduce": True},
                                {"overlap_grad_reduce": True, "distributed_optimizer": True},
                                {"distributed_optimizer": True, "blocking_p2p": True}])
def test_the_bound_never_exceeds_the_simulated_iteration(model, kw):
    searcher = Searcher(request(model, memory_limit=1e15, **kw))
    checked = 0
    for c in candidates(searcher.model, list(searcher.entries.values()), searcher.request)[::3]:
        shape, result = searcher.shape(c), searcher.evaluate(c)
        if isinstance(shape, Refusal) or isinstance(result, Refusal):
            continue
        st = searcher.setting(c)
        costs = searcher.stage_costs(st, c, shape)
        bound = makespan_bound(shape, costs.costs(), searcher.link_times(st, c, shape.devices), False)
        assert bound + tail_bound(st, shape) <= result.iteration_s * (1 + 1e-12)
        checked += 1
    assert checked > 50


@pytest.mark.parametrize("blocking", [False, True])
def test_the_mixed_backward_bound_never_exceeds_the_simulated_iteration(model, blocking):
    """DualPipe and DualPipeV (overlapped F & B pairs, full or split backwards): the bound with each F
    less what its pair can save (bounds.mixed_costs) is below every simulated iteration; so is V-Half's
    and V-Min's (a mixed backward without pairs), whose F saves nothing."""
    searcher = Searcher(request(model, batch=64, memory_limit=1e15, blocking_p2p=blocking,
                                schedules=("dualpipe", "dualpipev", "v_half", "v_min")))
    assert [e.pairs for e in searcher.entries.values()] == [True, True, False, False]
    checked = 0
    for c in candidates(searcher.model, list(searcher.entries.values()), searcher.request)[::2]:
        bound, result = searcher.bound(c), searcher.evaluate(c)
        if isinstance(bound, Refusal) or isinstance(result, Refusal):
            continue
        assert 0 < bound <= result.iteration_s * (1 + 1e-12), c
        checked += 1
    assert checked > 60


def test_a_mixed_backward_without_pairs_keeps_its_forwards_whole():
    """bounds.mixed_costs: F = 3, B = 6, I + W = 5, FB = 7 (2 hidden): with pairs the F is bounded by
    3 - 2 = 1, without (V-Half's programs place none) by its own 3; the backward by min(B, I + W) = 5."""
    from schedc.search.bounds import mixed_costs
    table = {"F": (3.0,), "B": (6.0,), "I": (3.0,), "W": (2.0,), "FB": (7.0,)}
    assert mixed_costs(table)["F"] == (1.0,) and mixed_costs(table, pairs=False)["F"] == (3.0,)
    assert mixed_costs(table)["B"] == mixed_costs(table, pairs=False)["B"] == (5.0,)


def test_candidates_of_one_order_and_layout_are_one_row_naming_every_schedule(model):
    """At p = 1 with one microbatch 1F1B and GPipe run the same order (F B), so do ZB-H1, ZB-H2 and
    ZB-2P (F I W): each layout's row names the others, evaluated once, and the expanded rows are the
    exhaustive search's ranking. Each merged candidate, compiled whole on its own, predicts the row's time."""
    kw = {"gpus": 8, "batch": 32, "schedules": ("1f1b", "gpipe", "zb_h1", "zb_h2", "zb_2p", "zbv")}
    fast, reference = search(request(model, **kw)), search(request(model, exhaustive=True, **kw))
    assert fast.counts["merged"] > 0 and reference.counts["merged"] == 0
    assert merged_key(fast.ranked, len(reference.ranked)) == key(reference.ranked)
    rows = [r for r in fast.ranked if r.same]
    assert {r.label() for r in rows} >= {"1f1b=gpipe"}
    searcher = Searcher(request(model, **kw))
    for row in rows:
        for twin in row.same:
            c = row.candidate
            assert (twin.t, twin.p, twin.d, twin.b, twin.m, twin.recompute) == (c.t, c.p, c.d, c.b, c.m, c.recompute)
            alone = compile_for(twin.schedule, twin.params(), searcher.setting(twin), lower=False).prediction
            assert alone.iteration_s == pytest.approx(row.iteration_s, rel=1e-12)
    assert "1f1b=gpipe" in report(fast) and "merged into the row of the same order" in report(fast)


@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (4, 12, 1), (8, 16, 1), (4, 8, 2), (2, 8, 4)])
def test_the_bound_is_the_bubble_formula_with_uniform_stages(p, m, v):
    """Uniform F and B, free messages: 1F1B's makespan (m + p - 1)(F + B) (Narayanan et al. 2021), and
    the interleaved schedule's (m v + p - 1)(F + B) in chunk costs; the bound is exactly that."""
    from schedc.frontend.elaborate import shape_of
    from schedc.frontend.library import resolve
    from schedc.frontend.parse import parse_source, read_source
    name = "1f1b" if v == 1 else "interleaved_1f1b"
    source = read_source(resolve(name))
    params = {"p": str(p), "m": str(m), **({"v": str(v)} if v > 1 else {})}
    _, devices, pipelines = shape_of(parse_source(source), source, params)
    f, b = 0.25, 0.5
    table = {"F": (f,) * (p * v), "B": (b,) * (p * v)}
    bound = makespan_bound(Shape(devices, pipelines), table, [[0.0] * p] * p, False)
    assert bound == pytest.approx((m * v + p - 1) * (f + b), rel=1e-12)


def test_the_ranking_is_sorted_fits_and_lays_out_every_gpu(model):
    limit = 2.5 * 2**30
    outcome = search(request(model, memory_limit=limit, top=8))
    assert len(outcome.ranked) == 8
    times = [r.iteration_s for r in outcome.ranked]
    assert times == sorted(times)
    for r in outcome.ranked:
        c = r.candidate
        assert c.t * c.p * c.d == 16 and c.b * c.d * c.m == 32
        assert r.prediction.memory_bytes <= limit
        assert r.prediction.gpus == 16 and r.prediction.global_batch == 32


def test_a_tighter_limit_never_finds_a_faster_configuration(model):
    loose = search(request(model, top=1)).ranked[0]
    tight = search(request(model, top=1, memory_limit=loose.prediction.memory_bytes * 0.9)).ranked[0]
    assert tight.iteration_s >= loose.iteration_s
    assert tight.prediction.memory_bytes <= loose.prediction.memory_bytes * 0.9


def test_simulations_are_cached_per_order_and_cost_vector(model):
    searcher = Searcher(request(model))
    c = Candidate("1f1b", 2, 4, 2, None, 2, 8, "full")
    first = searcher.evaluate(c)
    simulated = searcher.counts["simulated"]
    again = searcher.evaluate(c)
    assert again.iteration_s == first.iteration_s
    assert searcher.counts["simulated"] == simulated and searcher.counts["cache_hits"] == 1
    other = searcher.evaluate(Candidate("1f1b", 2, 4, 2, None, 2, 8, "selective"))  # same order, new costs
    assert searcher.counts["structures"] == 1 and searcher.counts["simulated"] == simulated + 1
    assert other.iteration_s < first.iteration_s


def test_pruned_families_say_why(model):
    outcome = search(request(model, memory_limit=1.2 * 2**30, top=3))
    text = "\n".join(outcome.pruned)
    assert "does not fit: " in text and "GiB > 1.2 GiB at device" in text
    assert "t=16 crosses nodes (8 GPUs per node)" in text
    assert "slower than the 3rd best" in text
    assert "requirement failed: p must be even" in text  # chimera with p = 1
    bounds = re.findall(r"at best ([0-9.e+]+) s per iteration \(a lower bound; memory not checked\), slower than "
                        r"the 3rd best \(([0-9.e+]+) s\)", text)
    assert bounds and all(float(a) > float(b) for a, b in bounds)  # printed apart, never "1.421 ... (1.421 s)"


def test_a_bound_and_its_threshold_are_printed_apart():
    from schedc.search import distinct_figures
    assert distinct_figures(1.4213, 1.4209) == ("1.4213", "1.4209")
    assert distinct_figures(2.5, 1.25) == ("2.5", "1.25")


def run_cli(*args):
    return CliRunner().invoke(main, ["tune", *args])


def test_the_bubble_is_one_number_in_simulate_its_json_and_the_tune_row():
    """ZB-V, p = 2, d = 4, b = 2 of GPT 1.7B on an A100 node with blocking sends: simulate's text, its
    JSON and tune's row (and JSON) give the same bubble, idle over busy time of the simulated step (the
    tune row said 0.013, bubble_s over the iteration, where simulate said 0.0604)."""
    model = str(__import__("conftest").ROOT / "schedc" / "models" / "gpt-1.7b.toml")
    layout = ["--model", model, "--cluster", CLUSTER, "--global-batch", "64", "--recompute", "none", "--blocking-p2p"]
    simulated = CliRunner().invoke(main, ["simulate", "zbv", "-D", "p=2", "--dp", "4", "--microbatch-size", "2",
                                          *layout, "--json"])
    assert simulated.exit_code == 0, simulated.output
    bubble = json.loads(simulated.output)["bubble"]
    text = CliRunner().invoke(main, ["simulate", "zbv", "-D", "p=2", "--dp", "4", "--microbatch-size", "2", *layout])
    assert f"  bubble {bubble:.4f}  " in text.output
    tuned = run_cli(*layout, "--gpus", "8", "--schedules", "zbv", "--tp", "1", "--pp", "2", "--top", "5", "--zero", "0")
    assert tuned.exit_code == 0, tuned.output
    row = next(line.split() for line in tuned.output.splitlines() if line.split()[1:2] == ["zbv"]
               and line.split()[6] == "2")
    assert row[-2] == f"{bubble:.4f}"  # the bubble column, before MFU
    listed = json.loads(run_cli(*layout, "--gpus", "8", "--schedules", "zbv", "--tp", "1", "--pp", "2",
                                "--zero", "0", "--json").stdout)
    assert next(r["bubble"] for r in listed if r["b"] == 2) == round(bubble, 4)


def test_the_command_prints_the_table_and_the_winners_command_lines(model):
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "16", "--global-batch", "32",
                     "--schedules", "1f1b,interleaved_1f1b", "--top", "3", "--zero", "0")
    assert result.exit_code == 0, result.output
    assert re.match(r"schedc tune: searching [\d,]+ candidates \.\.\.\n", result.stderr)  # off a terminal: no bar
    lines = result.stdout.splitlines()
    assert lines[1].split()[:3] == ["#", "schedule", "t"] and "TFLOP/s/GPU" in lines[1] and "bubble" in lines[1]
    assert [line.split()[0] for line in lines[2:5]] == ["1", "2", "3"]
    simulate = next(line.strip() for line in lines if line.strip().startswith("schedc simulate"))
    assert any(line.strip().startswith("schedc compile") for line in lines)
    assert any(line.strip().startswith("schedc render") for line in lines)
    again = CliRunner().invoke(main, shlex.split(simulate)[1:] + ["--json"])
    assert again.exit_code == 0, again.output
    assert f"{json.loads(again.output)['iteration_s']:.4f}" == lines[2].split()[10]


def test_json_is_a_list_best_first(model):
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16", "--json",
                     "--top", "4", "--schedules", "1f1b,gpipe")
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)  # stdout only: why families were pruned goes to stderr
    assert len(entries) == 4
    for entry in entries:
        assert {"schedule", "t", "p", "d", "v", "b", "recompute", "tflops_per_gpu", "iteration_s",
                "memory_gib_per_gpu"} <= set(entry)
    assert [e["iteration_s"] for e in entries] == sorted(e["iteration_s"] for e in entries)
    table = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16", "--top", "4",
                    "--schedules", "1f1b,gpipe")
    pruned = table.stdout.split("pruned families")[1].split("the winner:")[0]
    assert result.stderr == f"schedc tune: pruned families{pruned}" and pruned.count("\n  ") >= 1


@pytest.mark.parametrize("args,code,message", [
    (["--gpus", "16", "--global-batch", "32", "--schedules", "nosuch"], 2,
     "--schedules: no library schedule or .sched file named 'nosuch'"),
    (["--gpus", "16", "--global-batch", "32", "--memory-limit", "0.01GiB"], 1, "no configuration fits in 0.01 GiB"),
    (["--gpus", "3", "--global-batch", "4", "--schedules", "1f1b"], 2,
     "no layout of 3 GPUs whose pipeline stages divide the model's layers"),
    (["--gpus", "3", "--global-batch", "4", "--schedules", "chimera"], 2,  # its require (p even) fails first
     "no layout of 3 GPUs whose pipeline stages divide the model's layers"),
    (["--gpus", "3", "--global-batch", "4"], 2, "no layout of 3 GPUs whose pipeline stages divide the model's layers"),
    (["--gpus", "16", "--global-batch", "3", "--tp", "1", "--pp", "2"], 2, "no layout of 16 GPUs: --tp 1 with --pp 2: no t x p x d = 16 GPUs among them with d dividing the global batch 3"),
    (["--gpus", "16", "--global-batch", "32", "--memory-limit", "lots"], 2, "--memory-limit: cannot read 'lots'"),
    (["--gpus", "16", "--global-batch", "32", "--recompute", "some"], 2, "--recompute: unknown value 'some'"),
    (["--gpus", "16"], 2, "the configuration search needs --global-batch"),
])
def test_bad_input_is_a_message_and_an_exit_code(model, args, code, message):
    result = run_cli("--model", model, "--cluster", CLUSTER, *args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (TypeError, ValueError, KeyError))


@pytest.mark.parametrize("schedule", ["extends", pytest.param("pipefisher_1f1b", marks=pytest.mark.slow),
                                      pytest.param("pipefisher", marks=pytest.mark.slow)])
def test_composed_schedules_rank_and_their_winner_commands_run(model, schedule):
    """An `extends` chain (top.sched extends mid.sched, which extends ../base.sched) and the library's
    PipeFisher schedules (`extends` + `use kfac`) are searched whole, and the simulate line printed for
    the winner runs as pasted, predicting the ranked iteration time."""
    from conftest import FIXTURES
    name = str(FIXTURES / "compose" / "chain" / "sub" / "top.sched") if schedule == "extends" else schedule
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "2", "--global-batch", "8", "--tp", "1",
                     "--pp", "2", "--recompute", "full", "--top", "1", "--zero", "0", "--schedules", name)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    whole = schedule != "extends"  # the chain is a plain order: it takes the cached path
    assert (f"note: {name} is compiled whole for each of up to" in result.output) == whole  # on stderr, first
    row = next(line.split() for line in lines if line.split()[:1] == ["1"])
    assert row[:3] == ["1", name, "1"]
    simulate = next(line.strip() for line in lines if line.strip().startswith("schedc simulate"))
    again = CliRunner().invoke(main, shlex.split(simulate)[1:] + ["--json"])
    assert again.exit_code == 0, again.output
    assert f"{json.loads(again.output)['iteration_s']:.4f}" == row[10]


@pytest.mark.parametrize("fixture", ["deadlock_sized.sched", "deadlock_task.sched"])
def test_a_deadlocking_order_is_reported_as_a_deadlock_not_as_memory(model, fixture):
    """An order that deadlocks at every size, under a limit (3.3 GiB, the allocator's allowance
    included) that its largest size alone is over: the family's line says it deadlocks, not that it
    does not fit, for the order alone and, compiled whole, with a task filled into its bubbles (whose
    memory figure, of a partial run, is not looked at)."""
    from conftest import FIXTURES
    path = str(FIXTURES / "broken" / fixture)
    outcome = search(request(model, gpus=2, batch=8, schedules=(path,), pp=(2,), recompute=("none",), top=1,
                             memory_limit=3.3 * 2**30))
    assert not outcome.ranked and outcome.counts["deadlocked"] >= 2
    if fixture == "deadlock_sized.sched":
        assert outcome.counts["over_memory"] == 1
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "2", "--global-batch", "8", "--pp", "2",
                     "--recompute", "none", "--schedules", path, "--memory-limit", "3.3GiB")
    assert result.exit_code == 1, result.output
    assert "error: no configuration runs" in result.output and "does not fit" not in result.output
    assert f"{path} t=1 p=2: " in result.output and "deadlock" in result.output


def test_per_group_rows_are_ranked_best_first_and_the_winner_is_the_best(model):
    """With --per the K best of each group are kept, but listed best first all together: the first
    row (the winner whose commands are printed, the first JSON entry) is the fastest of them."""
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "16", "--global-batch", "32",
                     "--schedules", "1f1b,interleaved_1f1b", "--top", "1", "--per", "t", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    times = [row["iteration_s"] for row in rows]
    assert len({row["t"] for row in rows}) == len(rows) > 2 and times == sorted(times)
    text = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "16", "--global-batch", "32",
                   "--schedules", "1f1b,interleaved_1f1b", "--top", "1", "--per", "t").output
    best = rows[0]
    assert "ranked by iteration time, the 1 best of each t;" in text
    assert f"--tp {best['t']} --dp {best['d']} --microbatch-size {best['b']}" in text.split("the winner:")[1]


@pytest.mark.parametrize("args,message", [
    (["--memory-limit", "80"], "--memory-limit 80: 80 bytes per GPU, less than 1 MiB; give a unit"),
    (["--memory-limit", "1e3GiB"], "--memory-limit 1000 GiB is more than the 80 GiB of the cluster's GPUs"),
    (["--pp", "2,,4"], "--pp: expected positive integers separated by commas, got '2,,4'"),
    (["--tp", "3"], "--tp 3 does not divide the model's heads (16)"),
    (["--pp", "5"], "--pp 5: no t x 5 x d = 24 GPUs with d dividing the global batch 48"),
    (["--schedules", "1f1b,,zb_h1"], "--schedules: expected a list separated by commas, got '1f1b,,zb_h1'"),
    (["--microbatch-size", "0"], "--microbatch-size: expected positive integers"),
])
def test_search_options_a_user_gets_wrong_are_usage_errors(model, args, message):
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "24", "--global-batch", "48",
                     "--schedules", "1f1b", *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_repeated_list_values_are_searched_once_and_json_refusals_are_json(model, tmp_path):
    once = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16",
                   "--schedules", "1f1b", "--recompute", "full", "--tp", "1,2", "--zero", "0", "--json")
    twice = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16",
                    "--schedules", "1f1b", "--recompute", "full,full", "--tp", "1,1,2", "--zero", "0", "--json")
    assert once.exit_code == twice.exit_code == 0
    rows = json.loads(twice.stdout)
    assert len(rows) == len({(r["t"], r["p"], r["b"]) for r in rows})
    assert json.loads(once.stdout) == rows
    refused = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16",
                      "--schedules", "1f1b", "--memory-limit", "1MiB", "--json")
    assert refused.exit_code == 1
    answer, _ = json.JSONDecoder().raw_decode(refused.output)  # the JSON, then the error on stderr
    assert answer["valid"] is False and "no configuration fits in 0.000976562 GiB per GPU" in \
        answer["diagnostics"][0]["message"]


def test_a_schedule_compiled_whole_is_counted_so(model):
    """A greedy order depends on the costs: compiled whole for every candidate, and the count says so
    (it said `simulations 0 of 0 orders`)."""
    greedy = str(ROOT / "tests" / "fixtures" / "greedy.sched")
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16",
                     "--schedules", greedy, "--recompute", "full", "--tp", "1", "--zero", "0")
    assert result.exit_code == 0, result.output
    counted = re.search(r"(\d+) candidates: 0 distinct orders compiled, timed in 0 simulations \(one per cost "
                        r"vector and message times; the ranked are timed once more without messages, for their "
                        r"bubble\), (\d+) compiled whole \(tasks, a fill, a greedy order or placed R, O, L ops\)", result.output)
    assert counted and 0 < int(counted.group(2)) <= int(counted.group(1))
    noted = re.search(rf"note: {re.escape(greedy)} is compiled whole for each of up to (\d+) candidates", result.output)
    assert noted and int(noted.group(1)) >= int(counted.group(2))
    assert result.stdout.splitlines()[1].index(" t ") > len(greedy)  # the column fits the path


def test_pruned_families_are_listed_all_on_request(model):
    args = ("--model", model, "--cluster", CLUSTER, "--gpus", "16", "--global-batch", "32", "--schedules", "1f1b",
            "--top", "1")
    some, every = run_cli(*args, "--pruned", "2"), run_cli(*args, "--pruned", "all")
    total = int(re.search(r"pruned families \((\d+);", every.output).group(1))
    def listed(out):
        return [line for line in out.splitlines() if line.startswith("  1f1b t=")]
    assert total > 2 and len(listed(every.output)) == total and listed(some.output) == listed(every.output)[:2]
    assert f"... and {total - 2} more (--pruned all lists them)" in some.output
    assert run_cli(*args, "--pruned", "-1").exit_code == 2


def test_the_microbatch_size_can_be_fixed_and_pruned_zero_is_one_line(model):
    args = ("--model", model, "--cluster", CLUSTER, "--gpus", "16", "--global-batch", "32", "--schedules", "1f1b")
    rows = json.loads(run_cli(*args, "--microbatch-size", "1,2", "--json").stdout)
    assert rows and {row["b"] for row in rows} <= {1, 2}
    text = run_cli(*args, "--top", "1", "--pruned", "0").stdout
    assert re.search(r"^\d+ pruned famil(y|ies) \(--pruned all lists them\)$", text, re.M)
    assert "... and" not in text


def test_the_distributed_optimizer_fits_what_does_not_and_its_winner_simulates_alike(model):
    """At 3 GiB per GPU pure data parallelism (t = p = 1, d = 8) fits only with the optimizer state
    sharded over the 8 (--distributed-optimizer); the winner's command carries the flag and
    `simulate` of it gives the row's iteration time."""
    args = ["--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "64", "--memory-limit", "3GiB",
            "--schedules", "1f1b,zb_h1", "--top", "3"]
    plain = json.loads(run_cli(*args, "--zero", "0", "--json").stdout)
    sharded = json.loads(run_cli(*args, "--distributed-optimizer", "--json").stdout)
    assert all((row["t"], row["p"]) != (1, 1) for row in plain)
    assert (sharded[0]["t"], sharded[0]["p"], sharded[0]["d"]) == (1, 1, 8)
    text = run_cli(*args, "--distributed-optimizer").stdout
    simulate = text.split("the winner:")[1].splitlines()[1].strip()
    assert simulate.startswith("schedc simulate") and simulate.endswith("--distributed-optimizer")
    again = CliRunner().invoke(main, shlex.split(simulate)[1:] + ["--json"])
    assert again.exit_code == 0, again.output
    stats = json.loads(again.stdout)
    assert stats["iteration_s"] == pytest.approx(sharded[0]["iteration_s"], rel=1e-6)
    assert stats["memory_gib_per_gpu"] <= 3


@pytest.mark.slow
def test_why_ranks_exactly_as_the_exhaustive_search_does(model):
    """--why's rank of a configuration, the bounded walk's (every candidate whose bound is below its
    time simulated), is its index in the exhaustive search's whole ranking, overall and among its
    schedule's; its best over what is not given is the best of the matching candidates."""
    kw = {"schedules": ("1f1b", "interleaved_1f1b", "zb_h1"), "gpus": 8, "batch": 64}
    reference = search(request(model, exhaustive=True, top=10**6, **kw)).ranked
    order = [r.candidate for r in reference]
    for wanted in ({"schedule": "1f1b", "t": 2, "p": 2}, {"t": 1, "p": 4, "b": 2}, {"schedule": "zb_h1", "t": 4},
                   {"schedule": order[0].schedule, "t": order[0].t, "p": order[0].p, "b": order[0].b,
                    "recompute": order[0].recompute}):
        searcher = Searcher(request(model, **kw))
        space = candidates(searcher.model, list(searcher.entries.values()), searcher.request)
        outcome = searcher.run(space)
        lines = why_lines(searcher, outcome, space, "x", matching(space, wanted))
        best = next(c for c in order if all(getattr(c, k) == v for k, v in wanted.items()))
        family = [c for c in order if c.schedule == best.schedule]
        assert f"its best, {best.describe()}:" in lines[0]
        assert lines[1].startswith(f"  ranks {ordinal(order.index(best) + 1)} of the search, "
                                   f"{ordinal(family.index(best) + 1)} among {best.schedule}")
        assert (best == order[0]) == (lines[-1] == "  it is the winner")


@pytest.mark.parametrize("why,message", [
    ("1f1b t=3", "--why '1f1b t=3': no candidate of this search is that"),
    ("1f1b zb_h1", "two schedules ('1f1b', 'zb_h1'); give one"),
    ("t=2 q=1", "unknown key 'q'"),
    ("t=x", "t must be a positive integer, got 'x'"),
    ("t=1_0", "t must be a positive integer, got '1_0'"),
    ("recompute=some", "recompute is one of full, selective, none, selective-ops, got 'some'"),
    ("t=2 t=4", "t= is given twice"),
])
def test_why_refuses_what_is_no_configuration(model, why, message):
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16",
                     "--schedules", "1f1b,zb_h1", "--why", why)
    assert result.exit_code == 2 and message in result.output, result.output


def test_why_of_a_configuration_that_does_not_fit_says_why(model):
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "64",
                     "--memory-limit", "3GiB", "--schedules", "1f1b", "--zero", "0", "--why", "t=1 p=1")
    assert result.exit_code == 0, result.output
    assert "why t=1 p=1 (" in result.output and ": none runs; the nearest, 1f1b t=1 p=1 d=8" in result.output
    assert "does not fit:" in result.output.split("why t=1 p=1")[1]


def test_a_deadlocking_family_says_so_when_another_schedule_runs(model):
    """Searched next to 1f1b, which runs, a schedule whose order deadlocks at every size: its families
    say it deadlocks (they said 'at best ... slower than the 2nd best', a bound, as if it were merely
    slower), and --why names the deadlock, not a size over memory, as the nearest reason."""
    from conftest import FIXTURES
    path = str(FIXTURES / "broken" / "deadlock_sized.sched")
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16", "--schedules",
                     f"1f1b,{path}", "--pp", "2", "--top", "3", "--pruned", "all", "--zero", "0", "--why",
                     f"{path} t=1 p=2")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip().startswith(f"{path} t=") and " p=2: " in line]
    assert lines and all("the order deadlocks" in line for line in lines), lines  # p = 2: where its order deadlocks
    assert "none runs; the nearest, " in result.output and "the order deadlocks" in result.output.split("why ")[1]


def test_one_schedule_named_twice_is_searched_once(model):
    result = run_cli("--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16", "--schedules",
                     "1f1b,schedc/schedules/1f1b.sched", "--top", "3", "--zero", "0", "--json")
    rows = json.loads(result.stdout)
    assert len(rows) == 3 and {r["schedule"] for r in rows} == {"1f1b"}
    assert len({(r["t"], r["p"], r["b"], r["recompute"]) for r in rows}) == 3


def test_tensor_groups_that_straddle_nodes_are_costed_and_named_as_crossing(tmp_path):
    """On 6-GPU nodes t = 4 puts ranks 4..7 across two nodes (tensor innermost): its all-reduces are
    two-level, over the network, and the pruned families say it crosses nodes; t = 2 divides the node
    and costs as on 8-GPU nodes."""
    six = tmp_path / "six.toml"
    six.write_text((ROOT / "schedc" / "clusters" / "dgx-a100-80gb.toml").read_text().replace("gpus = 8", "gpus = 6"))
    model = str(ROOT / "schedc" / "models" / "gpt-18.4b.toml")

    def tp_comm(cluster, t):
        args = ["simulate", "1f1b", "-D", "p=4", "--model", model, "--cluster", cluster, "--tp", str(t), "--dp",
                str(12 // t), "--global-batch", "96", "--json"]
        return json.loads(CliRunner().invoke(main, args).stdout)["breakdown"]["tensor_parallel_comm_s"]
    assert tp_comm(str(six), 4) > 1.5 * tp_comm("dgx-a100-80gb", 4)
    assert tp_comm(str(six), 2) == pytest.approx(tp_comm("dgx-a100-80gb", 2))
    result = run_cli("--model", model, "--cluster", str(six), "--gpus", "48", "--global-batch", "96", "--schedules",
                     "1f1b", "--tp", "4", "--pp", "1", "--top", "1", "--pruned", "all", "--memory-limit", "20GiB",
                     "--zero", "0")
    assert "t=4 crosses nodes (6 GPUs per node)" in result.output, result.output


def test_why_explains_zb_h2_against_interleaved_part_by_part(model):
    """tune over ZB-H2 and interleaved 1F1B: --why of the one that loses names, against the winner, the
    bubble and the communication (seconds) and the memory part by part, the deferred weight gradients
    ZB-H2 holds from I to W named apart (interleaved 1F1B holds none)."""
    kw = {"schedules": ("zb_h2", "interleaved_1f1b"), "gpus": 8, "batch": 64, "recompute": ("none",), "pp": (4,)}
    searcher = Searcher(request(model, **kw))
    space = candidates(searcher.model, list(searcher.entries.values()), searcher.request)
    outcome = searcher.run(space)
    winner = outcome.ranked[0].candidate
    loser = "interleaved_1f1b" if winner.schedule == "zb_h2" else "zb_h2"
    lines = why_lines(searcher, outcome, space, loser, matching(space, {"schedule": loser}))
    against, memory = lines[-2], lines[-1]
    for part in ("bubble", "pipeline comm", "tensor-parallel comm", "data-parallel comm"):
        assert f"{part} " in against
    assert memory.startswith("  memory against the winner (GiB): weights, gradients and optimizer ")
    zb = next(r.prediction for r in outcome.ranked if r.candidate.schedule == "zb_h2")
    interleaved = next(r.prediction for r in outcome.ranked if r.candidate.schedule == "interleaved_1f1b")
    assert zb.extra["deferred_w_gib"] > 0 and interleaved.extra["deferred_w_gib"] == 0
    assert "(deferred W " in memory and "activations " in memory
    result = CliRunner().invoke(main, ["tune", "--model", model, "--cluster", CLUSTER, "--gpus", "8",
                                       "--global-batch", "64", "--schedules", "zb_h2,interleaved_1f1b",
                                       "--recompute", "none", "--pp", "4", "--why", loser])
    assert result.exit_code == 0, result.output
    assert "memory against the winner (GiB)" in result.output and "deferred W" in result.output


@pytest.mark.slow
def test_the_winner_scaled_to_this_machine_runs(model, tmp_path):
    """tune prints, for its winner, a compile and a `schedc run` of the same schedule, t and
    recomputation on this machine (p = 2, at most 4 ranks); both commands work as printed (and torchrun's
    OMP_NUM_THREADS banner stays out of the run's output: schedc run sets the variable)."""
    import os
    import subprocess
    import sys
    out = CliRunner().invoke(main, ["tune", "--model", model, "--cluster", CLUSTER, "--gpus", "16", "--global-batch",
                                    "32", "--schedules", "zb_h1", "--tp", "2", "--top", "1"]).output
    local = out.split("scaled to this machine")[1].splitlines()[1:3]
    compile_line, run_line = (shlex.split(line.strip()) for line in local)
    assert compile_line[:3] == ["schedc", "compile", "zb_h1"] and "--tp" in run_line
    assert run_line[run_line.index("--tp") + 1] == "2" and run_line[run_line.index("--nproc") + 1] == "4"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # schedc run sets it: no banner
    for line in (compile_line, run_line):
        done = subprocess.run([sys.executable, "-m", "schedc.cli", *line[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert "measured over 2 steps on 4 ranks" in done.stdout and "OMP_NUM_THREADS" not in done.stderr


def test_the_layer_split_options_search_the_zero_bubble_papers_22_layer_model():
    """Qi et al.'s 1.5B model has 22 layers: on 8 stages no even split exists (22 = 8 x 2 + 6), so p = 8 is
    outside the space; with the embedding and the loss counted as layers (Megatron-LM's rule: 24 units,
    3 a stage) the first and last stages hold 2 layers and the others 3, which --stage-layers
    2,3,3,3,3,3,3,2 gives by hand: both rank the same rows at the same times; the winner's commands
    carry the flags and `simulate` of them gives the row's time. --stage-layers keeps only the
    candidates with as many stages (p v = 8)."""
    args = ["--model", "zb-1.5b", "--cluster", "a100-80gb-roce", "--gpus", "8", "--global-batch", "24",
            "--schedules", "1f1b,zb_h1", "--tp", "1", "--pp", "8", "--top", "4"]
    even = run_cli(*args)
    assert even.exit_code == 2
    assert "no layout of 8 GPUs whose pipeline stages divide the model's layers" in even.output
    counted = json.loads(run_cli(*args, "--account-for-embedding", "--account-for-loss", "--json").stdout)
    explicit = json.loads(run_cli(*args, "--stage-layers", "2,3,3,3,3,3,3,2", "--json").stdout)
    assert [row["p"] for row in counted] == [8] * 4 and counted == explicit
    text = run_cli(*args, "--account-for-embedding", "--account-for-loss").stdout
    simulate = text.split("the winner:")[1].splitlines()[1].strip()
    assert simulate.endswith("--account-for-embedding --account-for-loss")
    again = CliRunner().invoke(main, shlex.split(simulate)[1:] + ["--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["iteration_s"] == pytest.approx(counted[0]["iteration_s"], rel=1e-6)
    wide = ["--model", "zb-1.5b", "--cluster", "a100-80gb-roce", "--gpus", "8", "--global-batch", "24",
            "--schedules", "1f1b,interleaved_1f1b", "--stage-layers", "2,3,3,3,3,3,3,2", "--top", "30", "--zero", "0",
            "--json"]
    rows = json.loads(run_cli(*wide).stdout)
    assert rows and all(row["p"] * (row["v"] or 1) == 8 for row in rows)
    assert len({row["p"] for row in rows}) >= 3  # interleaved at p = 1, 2, 4 (v = 8, 4, 2)
    bad = run_cli(*args, "--stage-layers", "2,3", "--account-for-loss")
    assert bad.exit_code == 2
    assert "give one or the other" in bad.output


@pytest.mark.slow
def test_schedules_with_placed_recompute_or_offload_are_compiled_whole_and_ranked(model):
    """interleaved_1f1b_recompute and offload_1f1b, named in --schedules (the default library leaves them
    out: their R, O and L are the layout's recompute decision), are searched by the whole compile: each
    ranked row's iteration is compile_for's for that candidate (R costed as its forward, O and L on the
    copy engine), where the shortcut's cost table had no R, O or L (a KeyError traceback)."""
    for name in ("interleaved_1f1b_recompute", "offload_1f1b"):
        searcher = Searcher(request(model, gpus=8, batch=16, schedules=(name,), memory_limit=1e15))
        best = searcher.run().ranked[0]
        assert best.candidate.schedule == name and searcher.counts["compiled_whole"] > 0
        c = best.candidate
        plain = compile_for(c.schedule, c.params(), searcher.setting(c), lower=False).prediction
        assert best.iteration_s == pytest.approx(plain.iteration_s, rel=1e-12)
