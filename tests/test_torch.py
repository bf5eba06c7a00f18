"""schedc.torch's arguments (the one-line API for torch.distributed.pipelining): each checked by name and
refused with its documented ScheduleError before anything is compiled (torch's runtime itself is
tests/test_torch_runtime.py's)."""
from __future__ import annotations

import pytest

import schedc.torch as api
from schedc.torch import ScheduleError


@pytest.mark.parametrize("call, message", [
    (lambda: api.stage_indices("v_half", rank=5, p=4), "rank must be an integer 0..3 (a rank of the 4-rank pipeline), got 5"),
    (lambda: api.stage_indices("v_half", rank=-1, p=4), "got -1"),
    (lambda: api.stage_indices("v_half", rank=0, p=0), "p must be an integer >= 1, got 0"),
    (lambda: api.stage_indices("v_half", rank=1, p=4, n_microbatches=0), "n_microbatches must be an integer >= 1, got 0"),
    (lambda: api.schedule("1f1b", [], 4), "stages must be this rank's PipelineStage, or a non-empty list of them"),
    (lambda: api.orders("1f1b", 4, 4, format="compute_comm"), "format must be one of 'compute_comms', 'compute_only'"),
    (lambda: api.orders("1f1b", 4, 4, m=16), "give the pipeline's size and microbatches as p= and n_microbatches="),
    (lambda: api.orders("1f1b", 4, 0), "n_microbatches must be an integer >= 1, got 0"),
    (lambda: api.orders("1f1b", 4, True), "n_microbatches must be an integer >= 1, got True"),
])
def test_bad_arguments_raise_the_apis_error_naming_them(call, message):
    with pytest.raises(ScheduleError) as caught:
        call()
    assert message in str(caught.value)


def test_good_arguments_give_the_placement_and_the_cells():
    assert api.stage_indices("v_half", rank=1, p=4) == (1, 6)
    cells = api.orders("1f1b", 2, 4, format="compute_only")
    assert len(cells) == 2 and cells[0][0] == "0F0"
