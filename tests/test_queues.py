"""frontend/queues.py: the queues made when a cursor first asks for them (DeviceQueues) against
build_queues here, which makes every one at once (the form before queues were made on demand), and against queues sorted afresh here from the key's rule; the
starts run over them against the whole orders elaboration gives; and the reports that read every queue
(an empty pop, ops left over, a key's error) as before."""
from __future__ import annotations

import pytest

from schedc.diagnostics import SchedError, Source
from schedc.driver import compile_source, load_declaration
from schedc.frontend import ast
from schedc.frontend.elaborate import Options, build_ops, elaborate, shape_of
from schedc.frontend.expr import PipeRef
from schedc.frontend.prefix import order_starts
from schedc.frontend.queues import (DeviceQueues, Queue, QueueKey, _by_kind, _chunk_queues, _kind_key, _pipe_ops,
                                    chunk_index, sort_queue)
from schedc.ops import MIXED_KINDS, builtin_kinds
from schedc.search.space import library_entries

BACKWARD = {"B", "I", "W"}


def build_queues(device_ops, keys, pipelines, chunk, mixed: bool = False) -> dict:
    """Every queue of a device at once, in DeviceQueues' key order: per kind its whole queue, its
    chunks, then each pipeline's queue and its chunks."""
    queues = {}
    for kind, ops in _by_kind(device_ops, mixed).items():
        ordered = sort_queue(ops, _kind_key(keys, kind, mixed), pipelines, chunk)
        queues[(kind, None, None)] = Queue(ordered)
        _chunk_queues(queues, kind, None, ordered, chunk)
        for k, pipe in enumerate(pipelines):
            mine = _pipe_ops(ordered, k, keys.get((kind, pipe.name)), pipelines, chunk)
            if mine:
                queues[(kind, pipe.name, None)] = Queue(mine)
                _chunk_queues(queues, kind, pipe.name, mine, chunk)
    return queues


def _device_ops(name: str, params: dict[str, str]):
    """A library schedule's built-in ops per device, its queue keys, pipelines and chunk indices."""
    entry = library_entries([name])[0]
    decls = entry.decl.decls
    split = any(isinstance(d, ast.SplitBackward) for d in decls)
    mixed = any(isinstance(d, ast.MixedBackward) for d in decls)
    env, devices, pipelines = shape_of(entry.decl, entry.source, params)
    kinds = MIXED_KINDS if mixed else builtin_kinds(split)
    ops = build_ops(pipelines, {kind: (1.0,) * pipelines[0].stages for kind in kinds}, split, mixed)
    env = {**env, **{p.name: PipeRef(p.name) for p in pipelines}}
    keys = {(q.kind, q.pipe): QueueKey(q.key, env) for q in decls if isinstance(q, ast.QueueDecl)}
    per_device = [[op for op in ops if op.device == d] for d in range(devices)]
    return per_device, keys, pipelines, chunk_index(pipelines), mixed


@pytest.mark.parametrize("name,params", [
    ("interleaved_zb", {"p": "4", "v": "3", "m": "8"}), ("dualpipe", {"p": "4", "m": "8"}),
    ("looped_bfs", {"p": "4", "v": "2", "m": "6"}), ("zbv", {"p": "4", "m": "8"}),
    ("chimera", {"p": "4", "m": "8"}), ("interleaved_1f1b", {"p": "2", "v": "3", "m": "4"})])
def test_each_queue_made_on_demand_is_build_queues_queue(name, params):
    """Asked in a scrambled order, queues that exist and queues that do not (a chunk, a pipeline or a
    kind the device lacks): the same ops in the same order, None where build_queues has none; all()
    gives build_queues' keys in its order."""
    per_device, keys, pipelines, chunk, mixed = _device_ops(name, params)
    for mine in per_device:
        every = build_queues(mine, keys, pipelines, chunk, mixed)
        lazy = DeviceQueues(mine, keys, pipelines, chunk, mixed)
        asked = sorted({*every, ("W", None, 7), ("F", "nowhere", None), ("X", None, None), ("B", None, -1)},
                       key=lambda k: (k[2] is None, str(k[2]), str(k[1]), k[0]), reverse=True)
        for key in asked:
            got = lazy[key]
            assert (got is None) == (key not in every), (name, key)
            assert got is None or got.ops == every[key].ops, (name, key)
        again = DeviceQueues(mine, keys, pipelines, chunk, mixed)
        assert list(again.all()) == list(every)
        assert all(again.all()[key].ops == every[key].ops for key in every)


def test_interleaved_zb_queues_are_sorted_by_its_key():
    """interleaved_zb p=4 v=2 m=8 (rounds of r = 4 microbatches): F by (i // r, c, i % r), I and W by
    (i // r, -c, i % r), written here from the schedule's rule; a chunk's queue is that order's ops of
    the chunk (c: the stage's index among the device's, s // p)."""
    per_device, keys, pipelines, chunk, mixed = _device_ops("interleaved_zb", {"p": "4", "v": "2", "m": "8"})
    p, r = 4, 4
    for d, mine in enumerate(per_device):
        lazy = DeviceQueues(mine, keys, pipelines, chunk, mixed)
        for kind, sign in [("F", 1), ("I", -1), ("W", -1)]:
            expected = sorted((op for op in mine if op.kind == kind),
                              key=lambda op: (op.mb // r, sign * (op.stage // p), op.mb % r, op.stage))
            assert [op.key for op in lazy[(kind, None, None)].ops] == [op.key for op in expected]
            for c in (0, 1):
                assert lazy[(kind, None, c)].ops == [op for op in expected if op.stage // p == c]
                assert lazy[(kind, "main", c)].ops == [op for op in expected if op.stage // p == c]


def _cut(order) -> list[tuple]:
    stop = next((n + 1 for n, op in enumerate(order) if op.kind in BACKWARD), len(order))
    return [op.key for op in order[:stop]]


@pytest.mark.parametrize("name,params", [
    ("interleaved_zb", {"p": "8", "v": "3", "m": "24"}), ("dualpipe", {"p": "8", "m": "24"}),
    ("looped_bfs", {"p": "8", "v": "3", "m": "16"}), ("interleaved_1f1b", {"p": "8", "v": "2", "m": "24"}),
    ("zb_h2", {"p": "6", "m": "12"}), ("dualpipev", {"p": "4", "m": "10"})])
def test_a_start_over_queues_made_on_demand_is_the_whole_orders_start(name, params):
    """The reference is the whole order elaboration gives (every queue popped to its end), cut after
    each device's first backward; the start keeps the spans of the cursors that placed its ops."""
    entry = library_entries([name])[0]
    whole = elaborate(entry.decl, entry.source, Options(dict(params)))
    starts = order_starts(entry.decl, entry.source, params)
    assert [[op.key for op in start] for start in starts] == [_cut(order) for order in whole.orders]
    for start, order in zip(starts, whole.orders):
        assert [op.span for op in start] == [op.span for op in order[:len(start)]]


HEAD = ("schedule t \"t\"\nparam p = 2\nparam m = 4\n"
        "pipeline main { stages 2 * p; device s -> s % p; microbatches m }\nbackward split\n")


def _error(text: str) -> str:
    with pytest.raises(SchedError) as info:
        compile_source(Source("t.sched", text))
    return info.value.render()


def test_reports_that_read_every_queue_name_the_same_op_and_line():
    """A chunk queue never asked for before the empty pop still lists the device's chunks; ops of a
    chunk queue no cursor asked for are left over by name; a W key's error is raised though no start
    pops a W (and order_starts has no start then)."""
    missing = _error(HEAD + "on device d { F[0] * m ; F[3] }\n")
    assert "t.sched:6:26: error: devices 0, 1: program pops F[3] from an empty queue (this device holds " \
           "chunks 0, 1)" in missing, missing
    left = _error(HEAD + "on device d { F[0] * m ; F[1] * m ; (I[1] W[1]) * m ; (I[0] W[0]) * (m - 1) }\n")
    assert "t.sched:6:1: error: device 0: program leaves 2 ops unscheduled: I(0,3), W(0,3)" in left, left
    keyed = HEAD + "queue W by (i // (s - 1))\non device d { F * (2 * m) ; (I W) * (2 * m) }\n"
    assert "t.sched:6:13: error: division by zero" in _error(keyed), _error(keyed)
    source = Source("t.sched", keyed)
    assert order_starts(load_declaration(source), source, {}) is None


@pytest.mark.parametrize("name,params", [("1f1b", {"p": "4", "m": "8"}), ("gpipe", {"p": "3", "m": "5"}),
                                         ("interleaved_1f1b", {"p": "2", "v": "2", "m": "4"}),
                                         ("seq1f1b", {"p": "2", "m": "4"})])
def test_a_queue_without_key_pops_by_unit_then_stage_pipe_and_part(name, params):
    """queue_order without a key (one stage of one pipeline on a device sorted by its unit alone) against
    the default rule written out: (unit, stage negated for backwards), pipe, part; the ops scrambled."""
    import random
    from schedc.frontend.queues import queue_order
    from schedc.ops import split_unit
    per_device, _, pipelines, chunk, mixed = _device_ops(name, params)
    rng = random.Random(3)
    for mine in per_device:
        for ops in _by_kind(mine, mixed).values():
            ops = rng.sample(ops, len(ops))
            unit = [-1 if op.mb is None else split_unit(op.mb, pipelines[op.pipe].chunks)[0] for op in ops]
            plain = sorted(range(len(ops)), key=lambda n: ((unit[n], -ops[n].stage if ops[n].kind in BACKWARD
                                                            else ops[n].stage), ops[n].pipe, ops[n].part))
            assert queue_order(ops, None, pipelines, chunk) == plain, (name, ops[0].kind)
