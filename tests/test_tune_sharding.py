"""tune over context parallelism and the ZeRO level: the bounded search against --exhaustive on a small
flash-attention model, every bound of a ZeRO 2/3 candidate at or below its whole compile's iteration,
the memory pre-check refusing levels before anything is compiled, and the winner's commands simulating
to the row's figures."""
from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.search import Refusal, Request, Searcher, candidates, search
from schedc.search.bounds import lane_bound
from schedc.costmodel.sharding import sharded_collectives

MODEL = """layers = 4
hidden = 64
heads = 4
seq = 256
vocab = 100
attention = "flash"
"""
BIG = MODEL.replace("hidden = 64", "hidden = 1024").replace("heads = 4", "heads = 8").replace("vocab = 100", "vocab = 32000")
CLUSTER = "dgx-h100-80gb"


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "flash.toml"
    path.write_text(MODEL)
    return str(path)


@pytest.fixture
def big(tmp_path):
    """About 0.1e9 parameters (a 32,000-word embedding of width 1,024, four layers): what a GPU holds
    differs by level by hundreds of MB, so a 1.5 GiB limit refuses some levels and admits others."""
    path = tmp_path / "big.toml"
    path.write_text(BIG)
    return str(path)


def merged_key(ranked, top):
    rows = sorted((r.iteration_s, c) for r in ranked for c in (r.candidate, *r.same))
    return [(c, round(t, 12)) for t, c in rows][:top]


def sharded(model, **kw) -> Request:
    return Request(model, CLUSTER, 8, 16, kw.pop("schedules", ("1f1b", "zb_h1", "interleaved_1f1b")),
                   cp=(), zero=(), **kw)


def test_the_space_holds_every_cp_size_and_level_the_model_allows(model):
    """seq 256 splits into 2·cp chunks for every cp dividing 8; t x cp x p x d = 8 in every candidate;
    levels 2 and 3 only where there is a shard group (d x cp > 1)."""
    searcher = Searcher(sharded(model))
    space = candidates(searcher.model, list(searcher.entries.values()), searcher.request)
    assert {c.cp for c in space} == {1, 2, 4, 8} and {c.zero for c in space} == {0, 1, 2, 3}
    assert all(c.t * c.cp * c.p * c.d == 8 for c in space)
    assert not [c for c in space if c.zero and c.d * c.cp == 1]  # over one GPU a level is the unsharded run


@pytest.mark.parametrize("kw", [{}, {"top": 3, "per": "zero"}])
def test_the_bounded_search_over_cp_and_zero_ranks_as_the_exhaustive_one(model, kw):
    """The top 10 (or the top 3 of each level) of the bounded walk, which bounds ZeRO 2/3 candidates by
    their busiest lane, equals --exhaustive's, iteration times to 1e-12 s; and it compiles fewer of
    them whole."""
    fast = search(sharded(model, **kw))
    reference = search(sharded(model, exhaustive=True, **kw))
    assert merged_key(fast.ranked, len(reference.ranked)) == [(r.candidate, round(r.iteration_s, 12))
                                                              for r in reference.ranked]
    assert fast.counts["compiled_whole"] < reference.counts["compiled_whole"]
    assert fast.counts["bounded"] > 0


def test_every_bound_of_a_zero_2_or_3_candidate_is_at_most_its_iteration(model):
    """The bound the walk prunes by (the compute, the busiest lane, the tail) never exceeds the whole
    compile's iteration time, for every ZeRO 2/3 candidate that runs; the lane's share is positive."""
    searcher = Searcher(sharded(model, schedules=("1f1b", "zb_h1"), memory_limit=10**12))
    space = candidates(searcher.model, list(searcher.entries.values()), searcher.request)
    checked = 0
    for c in (c for c in space if c.zero >= 2 and c.b <= 2):
        bound, result = searcher.bound(c), searcher.evaluate(c)
        if isinstance(bound, Refusal) or isinstance(result, Refusal):
            continue
        st, shape = searcher.setting(c), searcher.shape(c)
        assert 0 < lane_bound(sharded_collectives(st, shape), shape) <= result.iteration_s
        assert bound <= result.iteration_s * (1 + 1e-12), (c, bound, result.iteration_s)
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize("schedule", ["1f1b", "zb_h1", "interleaved_1f1b", "dualpipev", "v_half"])
def test_a_zero_2_or_3_candidate_on_the_cached_order_predicts_as_its_whole_compile(model, schedule):
    """The walk times a ZeRO 2/3 candidate on its cached order with the lanes simulate builds; its
    prediction (with the message-free run of a ranked row) equals driver.cluster.compile_for's, the
    whole compile --exhaustive runs, field for field, for every such candidate of the schedule."""
    searcher = Searcher(sharded(model, schedules=(schedule,), memory_limit=10**12))
    space = [c for c in candidates(searcher.model, list(searcher.entries.values()), searcher.request) if c.zero >= 2]
    timed = 0
    for c in space:
        assert not searcher.compiled_whole(c)
        fast, whole = searcher.evaluate(c, free=True), searcher._compile_whole(c, True)
        assert isinstance(fast, Refusal) == isinstance(whole, Refusal), (c, fast, whole)
        if not isinstance(fast, Refusal):
            assert fast == whole, c
            timed += 1
    assert timed >= 40 and searcher.counts["compiled_whole"] == 0


def test_the_memory_pre_check_refuses_levels_before_anything_is_compiled(big):
    """Under 1.5 GiB the levels whose weights and state alone do not fit are refused by that lower bound
    before any order is elaborated or compiled; the ranking is still --exhaustive's, and fewer
    candidates are compiled whole."""
    kw = {"schedules": ("1f1b", "zb_h1"), "memory_limit": 3 * 2**29}
    fast = search(sharded(big, **kw))
    reference = search(sharded(big, exhaustive=True, **kw))
    assert merged_key(fast.ranked, len(reference.ranked)) == [(r.candidate, round(r.iteration_s, 12))
                                                              for r in reference.ranked]
    assert fast.ranked and fast.counts["over_memory"] > 0
    assert fast.counts["compiled_whole"] < reference.counts["compiled_whole"]
    assert any("weights, gradients, optimizer state" in line for line in fast.pruned), fast.pruned


def test_the_winners_commands_simulate_to_the_rows_figures(model):
    """`schedc tune` without --cp or --zero searches both; the printed simulate line (with the winner's
    --cp and --zero) predicts the row's iteration time and memory."""
    args = ["tune", "--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16",
            "--schedules", "1f1b,zb_h1", "--top", "3"]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert " zero " in text.stdout.splitlines()[1] and "zero in {0, 1, 2, 3}" in text.stdout
    rows = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    simulate = text.stdout.split("the winner:")[1].splitlines()[1].strip()
    best = rows[0]
    assert (f"--cp {best['cp']}" in simulate) == (best["cp"] > 1)
    again = CliRunner().invoke(main, shlex.split(simulate)[1:] + ["--json"])
    assert again.exit_code == 0, again.output
    predicted = json.loads(again.stdout)
    assert predicted["iteration_s"] == best["iteration_s"]
    assert predicted["memory_gib_per_gpu"] == pytest.approx(best["memory_gib_per_gpu"], abs=1e-3)


def test_given_cp_and_zero_stay_constraints(model):
    """--cp 2 --zero 3: every candidate has them, the table shows no searched zero column."""
    args = ["tune", "--model", model, "--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16",
            "--schedules", "1f1b", "--cp", "2", "--zero", "3", "--top", "2", "--json"]
    rows = json.loads(CliRunner().invoke(main, args).stdout)
    assert rows and all((r["cp"], r["zero"]) == (2, 3) for r in rows)


@pytest.mark.parametrize("cluster, noted", [("dgx-h100-80gb", True), ("dgx-a100-80gb", False)])
def test_the_table_notes_the_assumptions_that_decide_its_rows(model, cluster, noted):
    """Under the table: DualPipeV's overlapped pairs say what a pair hides; an H100 whose GEMM half-speed
    dimension and network efficiency equal the A100 file's says they are the A100's (its GEMM share and
    HBM are measured on Hopper; the A100 itself says nothing)."""
    result = CliRunner().invoke(main, ["tune", "--model", model, "--cluster", cluster, "--gpus", "8",
                                       "--global-batch", "16", "--schedules", "dualpipev", "--zero", "0", "--top", "2"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if line.startswith("note: ")]
    assert any("an overlapped F & B pair hides" in line for line in notes), notes
    unmeasured = [line for line in notes if "are the A100's" in line]
    assert bool(unmeasured) == noted
    if noted:
        assert "GEMM half-speed dimension 128" in unmeasured[0] and "network 0.8" in unmeasured[0]
        assert "GEMM 0.85" not in unmeasured[0] and "HBM" not in unmeasured[0] and "NVLink" not in unmeasured[0]


def test_the_speed_benchmark_times_the_fast_search_alone_with_no_exhaustive_run(monkeypatch, capsys):
    """benchmarks/tune_speed.py --exhaustive-runs 0 (it raised IndexError at its compare step): the fast
    ranking and its median, a line saying nothing was compared, exit status 0."""
    import importlib.util
    import sys

    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("tune_speed", ROOT / "benchmarks" / "tune_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(sys, "argv", ["tune_speed.py", "--quick", "--runs", "1", "--exhaustive-runs", "0", "--top", "2"])
    bench.main()
    out = capsys.readouterr().out
    assert "(fast, median CPU)" in out and out.rstrip().endswith("top K: not compared (--exhaustive-runs 0)")
