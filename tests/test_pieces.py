"""schedc/search/pieces.py: the layout's pieces of tune's walk, each cached under what it reads. Held to the
plain forms, computed here afresh for every candidate of a space from the uncached functions (the shape
from elaborate.shape_of, the bounds of schedc/search/bounds.py on it, the stage costs from the cost
model), with the candidates visited in a shuffled order so that no cache is filled by the one it serves."""
from __future__ import annotations

import random

import pytest

from schedc.costmodel import Part, costs_problem, layer_parts, link_times, message_times, stage_costs
from schedc.costmodel.hardware import B, F, I, R, W
from schedc.costmodel.stages import embedding_parts, head_parts, layer_overhead
from schedc.diagnostics import SchedError
from schedc.frontend.elaborate import shape_of, stage_count
from schedc.layout import Layout
from schedc.search import Refusal, Request, Searcher, candidates
from schedc.search.bounds import Shape, makespan_bound, state_bound, tail_bound

CLUSTER = "dgx-a100-80gb"


def plain_shape(searcher: Searcher, c) -> Shape | Refusal:
    """The shape, or the refusal: stages that do not divide the layers first, then the schedule's own."""
    entry, layers = searcher.entries[c.schedule], searcher.model.layers
    try:
        _, devices, pipelines = shape_of(entry.decl, entry.source, c.params())
    except SchedError as exc:
        stages = stage_count(entry.decl, entry.source, c.params())
        if stages and layers % stages:
            return Refusal(f"{stages} stages do not divide the {layers} layers", layers=True)
        return Refusal(exc.diagnostics[0].message)
    if layers % pipelines[0].stages:
        return Refusal(f"{pipelines[0].stages} stages do not divide the {layers} layers", layers=True)
    return Shape(devices, pipelines)


def plain_bound(searcher: Searcher, c):
    """The candidate's bound from the uncached functions: ("shape", refusal), ("state", bytes, device),
    ("costs", problem), or the seconds."""
    shape = plain_shape(searcher, c)
    if not isinstance(shape, Shape):
        return "shape", shape
    st, r, entry = searcher.setting(c), searcher.request, searcher.entries[c.schedule]
    state, device = state_bound(st, shape)
    if state > searcher.limit:
        return "state", state, device
    times = message_times(st, shape.devices) if r.layout.blocking_p2p else None
    table = stage_costs(st, shape.stages, shape.pipelines[0].placement, times).costs()
    if costs_problem(table, st) is not None:
        return "costs", costs_problem(table, st)
    if entry.plain or r.exhaustive:
        return 0.0
    links = link_times(st, shape.devices)
    return makespan_bound(shape, table, links, entry.split, entry.mixed, entry.pairs) + tail_bound(st, shape)


def cached_bound(searcher: Searcher, c):
    found = searcher.bound(c)
    if not isinstance(found, Refusal):
        return found
    if found.bound:
        return "state", found.memory, int(found.message.rsplit("at device ", 1)[1].split(" ")[0])
    shape = searcher.shape(c)
    return ("shape", shape) if isinstance(shape, Refusal) else ("costs", found.message)


@pytest.mark.parametrize("kw", [{}, {"distributed_optimizer": True, "overlap_grad_reduce": True},
                                {"blocking_p2p": True}, {"overlap_grad_reduce": True, "sequence_parallel": True}])
def test_every_cached_bound_is_the_plain_one_bit_for_bit(kw):
    request = Request("gpt-1.7b", CLUSTER, 32, 128, memory_limit=6 * 2**30,
                      layout=Layout(**kw))  # some refused by state alone
    searcher = Searcher(request)
    space = candidates(searcher.model, list(searcher.entries.values()), request)
    random.Random(5).shuffle(space)
    kinds = set()
    for c in space[::4]:
        want, got = plain_bound(searcher, c), cached_bound(searcher, c)
        assert got == want, c
        kinds.add(want[0] if isinstance(want, tuple) else "seconds" if want else "zero")
    assert {"shape", "state", "seconds"} <= kinds


def test_a_schedules_two_pipelines_and_a_v_take_their_own_terms():
    """Chimera (two pipelines, placed in opposite directions) and a V (two stages per device) next to 1F1B
    with the same p, b and t: each reads its own placement's terms from the cache."""
    request = Request("gpt-1.7b", CLUSTER, 32, 128, schedules=("1f1b", "chimera", "zbv", "interleaved_1f1b"))
    searcher = Searcher(request)
    space = [c for c in candidates(searcher.model, list(searcher.entries.values()), request) if c.p == 4]
    seen = set()
    for c in space:
        want = plain_bound(searcher, c)
        assert cached_bound(searcher, c) == want, c
        if not isinstance(want, tuple):
            seen.add(c.schedule)
    assert seen == {"1f1b", "chimera", "zbv", "interleaved_1f1b"}


def test_the_stage_costs_of_an_uneven_split_are_each_stages_own_sum():
    """Per stage: its layers times a layer's parts and the per-layer overhead, the embedding on the first,
    the logits and loss on the last (layers 3, 5, 5, 3, 4 over five stages: two middle stages alike, the
    other three each their own)."""
    from schedc.costmodel import Setting
    from schedc.costmodel.specs import load_cluster, load_cluster_model
    cluster = load_cluster(CLUSTER)
    model = load_cluster_model("gpt-1.7b", cluster)
    split = (3, 5, 5, 3, 4)
    split = split[:-1] + (model.layers - sum(split[:-1]),)
    for recompute in ("none", "selective", "full"):
        st = Setting(model, cluster, Layout(tp=2, dp=1, microbatch_size=2, global_batch=8, recompute=recompute,
                                            stage_layers=split))
        parts = stage_costs(st, len(split)).parts
        layer, over = layer_parts(st), layer_overhead(st)
        for s, n in enumerate(split):
            extra = [embedding_parts(st)] * (s == 0) + [head_parts(st)] * (s == len(split) - 1)
            def part(kind, n=n, extra=extra):
                total = layer[kind] * n
                for more in extra:
                    total = total + more[kind]
                return total
            want = {F: part(F) + Part(over[F] * n), I: part(I) + part(R) + Part(over[I] * n),
                    W: part(W) + Part(over[W] * n), B: part(I) + part(R) + part(W) + Part(over[B] * n)}
            for kind, value in want.items():
                assert parts[kind][s].total == pytest.approx(value.total, rel=1e-12), (recompute, s, kind)
