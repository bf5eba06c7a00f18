"""frontend/sequence.py and the chunk rule (ops.chunk_step): `microbatches m chunks k`, Seq1F1B's order
against a construction from its paper's rule, its activation peak and bubble, and refusals."""
from __future__ import annotations

import pytest

from conftest import FIXTURES, compile_library, refusal
from schedc.driver import compile_source, read_source
from schedc.ops import chunk_step, split_unit, unit_of


def seq1f1b_reference(p: int, m: int, k: int) -> list[list[tuple[str, int, int]]]:
    """Seq1F1B (Sun et al. 2024) per device d, written from the rule: the m*k chunk-forwards run in
    (microbatch, chunk) order; device d first runs min(p - d - 2 + k, m*k) of them, then alternates one
    forward with one backward, and finally drains the backwards. Backwards take microbatches in order and
    a microbatch's chunks last first (chunk j's backward needs the gradient chunk j+1's produced for
    j's keys and values). Ops are (kind, microbatch, chunk)."""
    orders = []
    for d in range(p):
        forwards = [("F", n // k, n % k) for n in range(m * k)]
        backwards = [("B", n // k, k - 1 - n % k) for n in range(m * k)]
        warm = min(p - d - 2 + k, m * k)
        order = forwards[:warm]
        for n in range(m * k - warm):
            order += [forwards[warm + n], backwards[n]]
        order += backwards[m * k - warm:]
        orders.append(order)
    return orders


def as_triples(compiled, k: int) -> list[list[tuple[str, int, int]]]:
    return [[(op.kind, *split_unit(op.mb, k)) for op in order] for order in compiled.schedule.orders]


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_seq1f1b_order_is_the_papers(p, k, m):
    compiled = compile_library("seq1f1b", p=p, m=m, k=k)
    assert compiled.ok, [d.message for d in compiled.diagnostics]
    assert as_triples(compiled, k) == seq1f1b_reference(p, m, k)


def test_one_chunk_is_1f1b():
    seq, plain = compile_library("seq1f1b", p=4, m=8, k=1), compile_library("1f1b", p=4, m=8)
    assert seq.schedule.orders == plain.schedule.orders
    assert seq.stats["makespan"] == plain.stats["makespan"]


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("k", [2, 4])
def test_activation_peak_is_about_one_kth(p, k):
    """Device d holds 1F1B's warm-up plus one in flight: p - d microbatches; Seq1F1B's p - d - 1 + k
    chunks of 1/k each, (p - d - 1 + k) / k, which tends to 1/k of 1F1B's as p grows."""
    seq, plain = compile_library("seq1f1b", p=p, m=2 * p, k=k), compile_library("1f1b", p=p, m=2 * p)
    assert plain.timing.peak_memory == tuple(float(p - d) for d in range(p))
    assert seq.timing.peak_memory == pytest.approx([(p - d - 1 + k) / k for d in range(p)])
    assert seq.timing.peak_memory[0] / plain.timing.peak_memory[0] == pytest.approx((p - 1 + k) / (k * p))


@pytest.mark.parametrize("p,k", [(4, 2), (4, 4), (8, 4)])
def test_bubble_shrinks_with_the_chunks(p, k):
    """With F=1, B=2 per microbatch (1/k per chunk), each device idles (p - 1) chunk-steps of 3/k: the
    bubble over the ideal time is (p - 1) / (m k)."""
    m = 2 * p
    compiled = compile_library("seq1f1b", p=p, m=m, k=k)
    assert compiled.stats["bubble"] == pytest.approx((p - 1) / (m * k))


def test_the_chunk_rule():
    assert [chunk_step("F", j, 3) for j in range(3)] == [None, -1, -1]
    assert [chunk_step("B", j, 3) for j in range(3)] == [1, 1, None]
    assert [chunk_step("I", j, 3) for j in range(3)] == [1, 1, None]
    assert chunk_step("W", 0, 3) is None
    assert split_unit(unit_of(5, 2, 4), 4) == (5, 2)


def test_chunk_dependencies_reach_the_deps():
    schedule = compile_library("seq1f1b", p=2, m=2, k=2).schedule
    by_key = {(op.kind, op.stage, op.mb): op for op in schedule.ops()}
    f01, b00 = by_key[("F", 0, unit_of(0, 1, 2))], by_key[("B", 1, unit_of(0, 0, 2))]
    assert ("F", 0, unit_of(0, 0, 2)) in [(d.kind, d.stage, d.mb) for d in schedule.deps[f01]]
    assert ("B", 1, unit_of(0, 1, 2)) in [(d.kind, d.stage, d.mb) for d in schedule.deps[b00]]
    assert str(f01) == "F(0,0.1)"


def test_backward_in_chunk_order_is_a_located_deadlock():
    compiled = compile_source(read_source(FIXTURES / "chunks" / "backward_in_chunk_order.sched"))
    errors = [d for d in compiled.diagnostics if d.severity == "error"]
    assert errors and errors[0].message.startswith("deadlock")
    assert "B(1,0.1)" in errors[0].message + errors[0].detail and errors[0].span is not None


def test_zero_chunks_refused_at_the_pipeline():
    diag = refusal("chunks/zero_chunks.sched")
    assert "0 sequence chunks" in diag.message and diag.span.line == 3


def test_the_plan_names_the_chunks():
    plan = compile_library("seq1f1b", p=2, m=2, k=2).plan
    assert plan.meta["chunks"] == 2 and plan.meta["microbatches"] == 4
    assert "chunks" not in compile_library("1f1b", p=2, m=2).plan.meta


def test_drawings_label_chunks_as_microbatch_dot_chunk():
    from schedc.render.style import op_label
    schedule = compile_library("seq1f1b", p=2, m=2, k=2).schedule
    labels = [op_label(op) for op in schedule.orders[0]]
    assert labels == ["0.0", "0.1", "1.0", "0.1", "1.1", "0.0", "1.1", "1.0"]
