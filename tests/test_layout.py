"""layout: one value, one set of options. The runtime's flags written for a Layout read back into the
same value; the rank order is a bijection with tensor innermost."""
from __future__ import annotations

import itertools

import pytest

from schedc.layout import SWITCHES, Layout, coordinates, flag, rank_at, run_flags, switches_on


@pytest.mark.parametrize("layout", [
    Layout(tp=2, dp=1, microbatch_size=4, recompute="selective", sequence_parallel=True),
    Layout(tp=1, dp=2, microbatch_size=2, recompute="none", distributed_optimizer=True, scatter_gather=False),
    Layout(tp=4, dp=3, microbatch_size=1, recompute="full")])
def test_the_runtime_reads_back_the_layout_its_flags_describe(layout):
    from schedc.runtime.options import parse_options
    assert parse_options(["plan.json", *run_flags(layout)]).layout == layout


def test_the_rank_order_is_tensor_innermost_and_invertible():
    t, d, p = 2, 3, 4
    ranks = [rank_at(pp, dd, tt, t, d) for pp, dd, tt in itertools.product(range(p), range(d), range(t))]
    assert ranks == list(range(t * d * p))  # pipeline outermost, tensor innermost: in order
    assert all(rank_at(*(lambda c: (c.pipeline, c.data, c.tensor))(coordinates(r, t, d)), t, d) == r for r in ranks)


def test_the_switches_are_named_once():
    assert [name for name, _, _ in SWITCHES] == ["sequence_parallel", "overlap_grad_reduce", "blocking_p2p",
                                                "distributed_optimizer", "tp_comm_overlap", "overlap_param_gather",
                                                "fp8"]
    assert flag("sequence_parallel") == "--sequence-parallel"
    assert switches_on(Layout(sequence_parallel=True, blocking_p2p=True)) == ["sequence parallel", "blocking sends"]
    assert switches_on({"distributed_optimizer": True}) == ["distributed optimizer"]
