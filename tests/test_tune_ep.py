"""tune searches expert parallelism for a model with experts: every ep dividing the experts and d x cp
by default, only --ep's values when given; a dense model's space has none (and no combined 1F1B);
--why splits the expert all-to-all into exposed and hidden, and the split is the same all-to-all
however a schedule places it (1F1B hides none: its exposed is DualPipeV's exposed plus hidden)."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.search import Request, search

BASE = ["tune", "--model", "mixtral-8x7b", "--seq", "4096", "--cluster", "dgx-h100-80gb", "--gpus", "64",
        "--global-batch", "128", "--tp", "1", "--pp", "4", "--microbatch-size", "1", "--recompute", "none",
        "--pruned", "0"]
MIXTRAL = dict(model="mixtral-8x7b", cluster="dgx-h100-80gb", gpus=64, global_batch=128, tp=(1,), pp=(4,),
               microbatch=(1,), recompute=("none",), seq=4096)


def tune(*args: str) -> str:
    result = CliRunner().invoke(main, [*BASE, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_ep_is_searched_and_the_best_is_the_best_of_each_ep_alone():
    assert "ep in {1, 2, 4, 8}" in tune("--schedules", "1f1b,dualpipev", "--top", "1")  # d = 16, 8 experts
    searched = search(Request(schedules=("1f1b", "dualpipev"), top=1, **MIXTRAL))
    alone = [search(Request(schedules=("1f1b", "dualpipev"), top=1, ep=(ep,), **MIXTRAL)).ranked
             for ep in (1, 2, 4, 8)]
    best = min((ranked[0] for ranked in alone if ranked), key=lambda r: r.iteration_s)
    assert searched.ranked[0].candidate == best.candidate
    assert searched.ranked[0].iteration_s == best.iteration_s


def test_ep_given_is_a_constraint_and_shows_in_the_table_and_the_commands():
    out = tune("--schedules", "1f1b", "--ep", "4,8", "--top", "20")
    assert "ep in {4, 8}" in out
    lines = out.splitlines()
    column = next(line.split() for line in lines if line.split()[:2] == ["#", "schedule"]).index("ep")
    rows = [line.split() for line in lines if re.match(r"\s+\d+\s+1f1b\s", line)]
    assert rows and {row[column] for row in rows} <= {"4", "8"}  # the ep column (after cp where cp varies)
    assert re.search(r"--ep [48]\b", out.split("the winner:")[1])


def test_a_dense_model_searches_no_ep_and_no_combined_1f1b():
    out = CliRunner().invoke(main, ["tune", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "8",
                                    "--global-batch", "16", "--tp", "1", "--pp", "2", "--microbatch-size", "1",
                                    "--recompute", "none", "--pruned", "0"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert "combined_1f1b" not in out.output and "ep in" not in lines[1] and " ep " not in lines[2]
    assert "--ep" not in out.output


@pytest.mark.parametrize("why", ["1f1b t=1 cp=1 p=4 ep=8", "dualpipev t=1 cp=1 p=4 ep=8",
                                 "combined_1f1b t=1 cp=1 p=4 ep=8"])  # cp=1: d = 16 in each
def test_why_shows_the_all_to_all_exposed_and_hidden(why):
    out = tune("--schedules", "1f1b,dualpipev,combined_1f1b", "--why", why)
    line = next(x for x in out.splitlines() if "expert all-to-all per step" in x)
    exposed, hidden = map(float, re.search(r"([\d.]+) s exposed, ([\d.]+) s hidden in", line).groups())
    pipeline_alone = tune("--schedules", "1f1b", "--ep", "8", "--why", "1f1b t=1 cp=1 p=4")
    carried = float(re.search(r"([\d.]+) s exposed, 0\.0000 s hidden in", pipeline_alone).group(1))
    assert exposed + hidden == pytest.approx(carried, abs=2e-4)  # the same all-to-all, placed otherwise
    assert (hidden == 0) == why.startswith("1f1b")


def test_ep_is_carved_from_d_x_cp_when_cp_is_set():
    out = tune("--schedules", "1f1b", "--cp", "4", "--top", "20")  # d = 64 / (1 x 4 x 4) = 4: ep = 8 only via cp
    lines = out.splitlines()
    head = next(line.split() for line in lines if line.split()[:2] == ["#", "schedule"])
    rows = [line.split() for line in lines if re.match(r"\s+\d+\s+1f1b\s", line)]
    assert "ep in {1, 2, 4, 8}" in out and {row[head.index("d")] for row in rows} == {"4"}
    assert "8" in {row[head.index("ep")] for row in rows}
