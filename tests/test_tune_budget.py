"""tune's walk budget (--walk-ops, budget.TUNE_WALK): past it the walk stops, and the rows it calls
certain are those of the whole walk, held against the exhaustive search of the same request."""
from __future__ import annotations

import json

from click.testing import CliRunner

from schedc.budget import TUNE_WALK
from schedc.search.results import BOUND_SLACK
from schedc.cli import main
from schedc.search import Request, Searcher, search

CLUSTER = "dgx-a100-80gb"
ARGS = ["tune", "--model", "gpt-1.7b", "--cluster", CLUSTER, "--gpus", "16", "--global-batch", "64",
        "--schedules", "1f1b,interleaved_1f1b,zb_h1,v_half"]


def request(**kw) -> Request:
    return Request("gpt-1.7b", CLUSTER, 16, 64, ("1f1b", "interleaved_1f1b", "zb_h1", "v_half"), **kw)


def rows(ranked) -> list[tuple]:
    """Every candidate of the rows (merged twins too), by time, as the exhaustive search lists them."""
    return sorted((round(r.iteration_s, 12), c) for r in ranked for c in (r.candidate, *r.same))


def test_a_search_under_the_default_budget_walks_every_candidate():
    outcome = search(request())
    assert outcome.stopped is None and "left" not in outcome.counts


def test_a_stopped_walks_certain_rows_are_the_exhaustive_searchs():
    whole = Searcher(request(walk_ops=0, top=40))
    walked = whole.run()
    reference = rows(search(request(exhaustive=True, walk_ops=0, top=40)).ranked)
    assert rows(walked.ranked) == reference[:len(rows(walked.ranked))]
    certains = []
    for share in (0.05, 0.2, 0.5):
        limit = max(1, int(share * whole.work))
        stopped = search(request(walk_ops=limit, top=40))
        stop = stopped.stopped
        assert stop is not None and stop.left > 0 and stop.work >= limit
        certain = stop.exact(stopped.ranked)
        below = stop.bound * (1 - BOUND_SLACK)  # nothing left below the bound was missed
        assert [row for row in rows(stopped.ranked) if row[0] < below] == [row for row in reference if row[0] < below]
        assert rows(stopped.ranked)[:certain] == reference[:certain]
        assert stopped.counts["left"] == stop.left
        certains.append(certain)
    assert certains[0] < certains[-1]  # a larger budget leaves more rows certain


def test_the_stop_is_said_in_the_table_and_beside_the_json():
    result = CliRunner().invoke(main, ARGS + ["--walk-ops", "300"])
    assert result.exit_code == 0, result.output
    assert "note: the walk stopped at its budget of 300 ops (--walk-ops" in result.output
    assert "--walk-ops 0 walks them all" in result.output and "left at the walk's budget" in result.output
    as_json = CliRunner().invoke(main, ARGS + ["--walk-ops", "300", "--json"])
    assert as_json.exit_code == 0
    assert "the walk stopped at its budget of 300 ops" in as_json.stderr
    assert json.loads(as_json.stdout)[0]["schedule"]


def test_a_budget_spent_before_any_candidate_ran_is_refused_not_called_too_big():
    result = CliRunner().invoke(main, ARGS + ["--walk-ops", "1", "--memory-limit", "12GiB"])
    assert result.exit_code == 2
    assert "budget of 1 ops (--walk-ops" in result.stderr and "no configuration fits" not in result.stderr
    assert "Traceback" not in result.output


def test_the_option_defaults_to_the_budget_and_refuses_negative_values():
    assert Request("m", "c", 1, 1).walk_ops == TUNE_WALK.limit
    result = CliRunner().invoke(main, ARGS + ["--walk-ops", "-1"])
    assert result.exit_code == 2 and "--walk-ops" in result.output
