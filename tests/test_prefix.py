"""frontend/prefix.py: the starts of the devices' orders (each program run until its first backward),
held to elaborate's whole orders for every library schedule at several sizes; the memory bound tune
takes from them never above the exact figure of the whole order; and the level walk of
costmodel/bytes.py (distinct levels, kept per order) against its plain form and a float walk of the
per-op byte deltas."""
from __future__ import annotations

import pytest

from schedc.costmodel import device_memory
from schedc.costmodel.bytes import (activation_deltas, activation_peak_parts, deferred_weight_bytes,
                                    layer_activation_bytes, layer_levels)
from schedc.costmodel.hardware import stage_layers
from schedc.diagnostics import SchedError
from schedc.frontend import ast
from schedc.frontend.elaborate import Options, elaborate
from schedc.frontend.library import library_files
from schedc.frontend.elaborate import build_ops, shape_of
from schedc.frontend.expr import PipeRef
from schedc.frontend.prefix import BACKWARDS, WEIGHTS, _DeviceOps, _LazyQueues, order_starts
from schedc.frontend.queues import DeviceQueues, QueueKey, chunk_index
from schedc.ops import MIXED_KINDS, builtin_kinds
from schedc.search import Request, Searcher
from schedc.search.bounds import state_bound
from schedc.search.results import Refusal
from schedc.search.space import Candidate, library_entries

BACKWARD = {"B", "I", "W"}
SIZES = [(2, 4, 2), (4, 8, 2), (4, 3, 3), (8, 16, 2), (4, 16, 4)]  # (p, m, v)
# what makes elaborate's order other than the programs' alone
REORDERED = (ast.Greedy, ast.Squeeze, ast.TaskDecl, ast.Fill, ast.Recompute, ast.Offload, ast.MemoryDecl)


def _params(entry, p: int, m: int, v: int) -> dict[str, str]:
    return {"p": str(p), "m": str(m), **({"v": str(v)} if "v" in entry.params else {})}


def _start_of(order, kinds=BACKWARD) -> list[tuple]:
    """The order up to and including its first op of `kinds`, B, I or W by default (all of it without
    one), by op identity."""
    cut = next((n + 1 for n, op in enumerate(order) if op.kind in kinds), len(order))
    return [op.key for op in order[:cut]]


@pytest.mark.parametrize("name", [path.stem for path in library_files()])
@pytest.mark.parametrize("kinds", [BACKWARD, {"W"}])
def test_the_starts_are_the_whole_orders_starts_for_every_library_schedule(name, kinds):
    """Until each device's first backward (the default), and until its first W."""
    entry = library_entries([name])[0]
    reordered = any(isinstance(d, REORDERED) for d in entry.decl.decls)
    until = frozenset(kinds)
    built = 0
    for p, m, v in SIZES:
        params = _params(entry, p, m, v)
        try:
            whole = elaborate(entry.decl, entry.source, Options(dict(params)))
        except SchedError:
            assert order_starts(entry.decl, entry.source, params, until) is None
            continue
        starts = order_starts(entry.decl, entry.source, params, until)
        if reordered:
            assert starts is None, (name, params)
            continue
        built += 1
        assert [[op.key for op in start] for start in starts] == [_start_of(order, kinds) for order in whole.orders]
        assert [[(op.device, op.parts) for op in start] for start in starts] == [
            [(op.device, op.parts) for op in order[:len(start)]] for start, order in zip(starts, whole.orders)]
    assert reordered or built >= 3, name


@pytest.mark.parametrize("name", [path.stem for path in library_files()])
def test_the_lazy_queues_are_the_device_queues(name):
    """Every queue of every device, made over the integer columns (each op made when read) and sorted
    there, pops the ops DeviceQueues pops over build_ops' list, in the same order."""
    entry = library_entries([name])[0]
    split = any(isinstance(d, ast.SplitBackward) for d in entry.decl.decls)
    mixed = any(isinstance(d, ast.MixedBackward) for d in entry.decl.decls)
    kinds = MIXED_KINDS if mixed else builtin_kinds(split)
    compared = 0
    for p, m, v in SIZES + [(8, 32, 4), (16, 64, 2)]:
        try:
            env, devices, pipelines = shape_of(entry.decl, entry.source, _params(entry, p, m, v))
        except SchedError:
            continue
        env = {**env, **{pipe.name: PipeRef(pipe.name) for pipe in pipelines}}
        keys = {(q.kind, q.pipe): QueueKey(q.key, env) for q in entry.decl.decls if isinstance(q, ast.QueueDecl)}
        ops = build_ops(pipelines, {kind: (0.0,) * pipelines[0].stages for kind in kinds}, split, mixed)
        chunk = chunk_index(pipelines)
        ascending = [list(pipe.microbatches) == sorted(pipe.microbatches) for pipe in pipelines]
        for dev in range(devices):
            plain = DeviceQueues([op for op in ops if op.device == dev], keys, pipelines, chunk, mixed).all()
            lazy = _LazyQueues(_DeviceOps(dev, pipelines, kinds, ascending), keys, pipelines, chunk, mixed).all()
            assert list(lazy) == list(plain), (name, p, m, v, dev)
            for where, queue in plain.items():
                assert [op.key for op in lazy[where].ops] == [op.key for op in queue.ops], (name, where)
            compared += len(plain)
    assert compared >= 10, name


def _candidates(request: Request, searcher: Searcher):
    """Every searched schedule at several layouts (t, d, b, recompute) whose order has a start."""
    for name, entry in searcher.entries.items():
        for p, m, v in SIZES:
            if "v" not in entry.params:
                v = None
            for t, b, recompute in [(1, 1, "none"), (2, 2, "selective"), (1, 4, "full"), (4, 1, "none")]:
                d = request.gpus // (t * p)
                if d >= 1 and request.gpus % (t * p) == 0:
                    yield Candidate(name, t, p, d, v, b, m, recompute)


@pytest.mark.parametrize("model,gpus", [("gpt-1.7b", 32), ("gpt-175b", 256)])
def test_the_start_bound_never_exceeds_the_whole_orders_memory(model, gpus):
    """For every library schedule tune searches, at several sizes and layouts: the bytes of the
    largest device with only its orders' starts (what start_bound refuses by) are at most those the
    whole order gives it (what evaluate refuses by), device by device."""
    request = Request(model, "dgx-a100-80gb", gpus, 1024)
    searcher = Searcher(request)
    compared = set()
    for c in _candidates(request, searcher):
        if isinstance(searcher.shape(c), Refusal):
            continue  # the schedule refuses these params, or its stages do not divide the layers
        structure = searcher.structure(c)
        for until in (BACKWARDS, WEIGHTS):
            start = searcher._start(c, until)
            if start is None or structure.error is not None:
                continue
            st = searcher.setting(c)
            bound, _ = state_bound(st, start)
            exact, _ = device_memory(st, structure.schedule, structure.peaks)
            per_device, _ = device_memory(st, start, (0.0,) * start.devices)
            assert bound <= max(exact) and all(a <= b for a, b in zip(per_device, exact)), (c, until)
            compared.add((c.schedule, until))
    assert len(compared) >= 20, compared  # every searched schedule but the squeezed V-Half and V-Min, twice


def test_the_peak_walk_is_its_plain_form_and_the_per_op_bytes():
    """activation_peak_parts (distinct levels, kept per order) is the first largest level of the full
    walk (layer_levels, every op), bit for bit, and, to rounding, the peak of a walk that adds each
    op's bytes (activation_deltas) in program order; asked twice, the second answer is the first."""
    searcher = Searcher(Request("gpt-1.7b", "dgx-a100-80gb", 32, 1024))
    walked = 0
    for c in _candidates(searcher.request, searcher):
        structure = None if isinstance(searcher.shape(c), Refusal) else searcher.structure(c)
        if structure is None or structure.error is not None:
            continue
        st, schedule = searcher.setting(c), structure.schedule
        fast = activation_peak_parts(st.model, st.layout, schedule)
        assert activation_peak_parts(st.model, st.layout, schedule) == fast
        deltas = activation_deltas(st.model, st.layout, schedule)
        kept = layer_activation_bytes(st.model, st.layout)
        w = deferred_weight_bytes(st.model, st.layout) if "I" in deltas else 0.0
        for d, (levels, order) in enumerate(zip(layer_levels(schedule, stage_layers(st.model, schedule.stages,
                                                                                      st.layout)), schedule.orders)):
            plain = (0.0, 0.0)
            for forward, held in levels:
                if forward * kept + held * w > plain[0]:
                    plain = (forward * kept + held * w, held * w)
            assert fast[d] == plain, (c, d)
            total = peak = 0.0
            for op in order:
                total += sum(deltas.get(op.kind, ((0.0, 0.0),) * schedule.stages)[op.stage])
                peak = max(peak, total)
            assert fast[d][0] == pytest.approx(peak, rel=1e-12), (c, d)
        walked += 1
    assert walked >= 20


def test_a_split_backward_is_bounded_until_its_first_weight_gradient():
    """Megatron's 1T row (3,072 GPUs): ZB-H1 at t=8 p=64 d=6 b=1 under full recomputation fits until
    each device's first backward, but not until its first W (device d holds the d W's it deferred, what
    W reads under full recomputation); the whole order holds more still, and start_bound refuses it by
    the longer start without elaborating the order."""
    searcher = Searcher(Request("gpt-1008b", "dgx-a100-80gb", 3072, 3072, schedules=("zb_h1",)))
    c = Candidate("zb_h1", 8, 64, 6, None, 1, 512, "full")
    st = searcher.setting(c)
    first, weights = searcher._start(c, BACKWARDS), searcher._start(c, WEIGHTS)
    assert state_bound(st, first)[0] <= searcher.limit < state_bound(st, weights)[0]
    refusal = searcher.start_bound(c)
    assert refusal is not None and refusal.bound and "before its first weight gradient" in refusal.message
    assert searcher.counts["structures"] == 0
    structure = searcher.structure(c)
    assert refusal.memory <= max(device_memory(st, structure.schedule, structure.peaks)[0])
