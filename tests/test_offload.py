"""Activation offload (`offload F`, ops O and L on a device's copy engine): the rule, the library's
offload_1f1b against a construction from PipeOffload's rule, device and host memory, the copy lane's
overlap with compute, and refusals."""
from __future__ import annotations

import pytest

from conftest import FIXTURES, compile_library
from schedc.diagnostics import SchedError
from schedc.driver import compile_source, read_source
from schedc.ops import builtin_deps


def one_f_one_b(p: int, m: int, d: int) -> list[tuple[str, int]]:
    """1F1B's compute order on device d (Narayanan et al. 2021): min(p-1-d, m) forwards, then one
    forward one backward, then the remaining backwards."""
    w = min(p - 1 - d, m)
    order = [("F", i) for i in range(w)]
    for n in range(m - w):
        order += [("F", w + n), ("B", n)]
    return order + [("B", n) for n in range(m - w, m)]


def offloading_reference(p: int, m: int) -> list[list[tuple[str, int]]]:
    """PipeOffload's rule on 1F1B (Wan et al. 2025): a stage offloads a forward's activations as that
    forward ends and reloads them just in time for its backward, hidden behind compute; a forward
    directly followed by its own backward (the last stage) keeps them. In program order: after each
    compute op, the reload of the backward that comes next (issued alongside this op, so it is back
    when that backward starts), then the offload of this op if it is a forward."""
    orders = []
    for d in range(p):
        compute, out = one_f_one_b(p, m, d), []
        offloads = min(p - 1 - d, m) > 0
        for t, (kind, i) in enumerate(compute):
            out.append((kind, i))
            following = compute[t + 1] if t + 1 < len(compute) else None
            if offloads and following is not None and following[0] == "B":
                out.append(("L", following[1]))
            if offloads and kind == "F":
                out.append(("O", i))
        orders.append(out)
    return orders


def test_the_rule_puts_o_and_l_between_a_forward_and_its_backward():
    assert builtin_deps("O", 1, 3, False) == (("F", 1),)
    assert builtin_deps("L", 1, 3, False) == (("O", 1),)
    assert builtin_deps("B", 1, 3, False, offloaded=True) == (("L", 1), ("B", 2))
    assert builtin_deps("B", 1, 3, False) == (("F", 1), ("B", 2))


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("mult", [1, 2])
def test_offload_1f1b_order_is_pipeoffloads(p, mult):
    compiled = compile_library("offload_1f1b", p=p, m=mult * p)
    assert compiled.ok, [d.message for d in compiled.diagnostics]
    assert [[(op.kind, op.mb) for op in order] for order in compiled.schedule.orders] == \
        offloading_reference(p, mult * p)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_device_peak_is_flat_in_p(p):
    """1F1B's device d holds p - d activations; offloaded, at most two (the forward being copied out
    and the backward's reload) whatever p is, the rest on the host; the last stage keeps its one."""
    m = 2 * p
    ours, plain = compile_library("offload_1f1b", p=p, m=m), compile_library("1f1b", p=p, m=m)
    assert plain.timing.peak_memory == tuple(float(p - d) for d in range(p))
    assert ours.timing.peak_memory == tuple(2.0 if d < p - 1 else 1.0 for d in range(p))
    assert ours.stats["peak_host_memory"] == [float(p - 1 - d) for d in range(p)]


@pytest.mark.parametrize("p", [2, 4, 8])
def test_copies_overlap_compute(p):
    """With O = L = F = 1 and B = 2 the copies hide behind compute: the step is 1F1B's, the copy engine
    runs beside the compute (some copy overlaps a compute op in time), and busy time is compute only."""
    m = 2 * p
    ours, plain = compile_library("offload_1f1b", p=p, m=m), compile_library("1f1b", p=p, m=m)
    assert ours.stats["makespan"] == plain.stats["makespan"] and ours.stats["busy"] == plain.stats["busy"]
    timing, order = ours.timing, ours.schedule.orders[0]
    copies = [op for op in order if op.kind in ("O", "L")]
    compute = [op for op in order if op.kind in ("F", "B")]
    assert any(timing.start[c] < timing.end[x] and timing.start[x] < timing.end[c] for c in copies for x in compute)
    starts = [timing.start[c] for c in copies]
    assert all(timing.end[a] <= timing.start[b] + 1e-9 for a, b in zip(copies, copies[1:]))  # one engine
    assert starts == sorted(starts)


def test_plan_carries_o_and_l():
    plan = compile_library("offload_1f1b", p=2, m=2).plan
    assert [i.op for i in plan.ranks[0][0] if i.op in ("O", "L")] == ["O", "L", "O", "L"]
    assert [i.op for i in plan.ranks[1][0] if i.op in ("O", "L")] == []


def _errors(name: str) -> list:
    compiled = compile_source(read_source(FIXTURES / "offload" / name))
    return [d for d in compiled.diagnostics if d.severity == "error"]


def test_backward_before_its_reload_is_a_located_deadlock():
    (first, *_) = _errors("backward_before_reload.sched")
    assert first.message.startswith("deadlock: device 0 waits at B(0,0) for L(0,0)")
    assert (first.span.line, first.span.column) == (6, 19)


def test_an_offload_never_reloaded_is_refused():
    errors = _errors("lone_offload.sched")
    assert any("never runs L(0,0)" in d.message and d.span.line == 6 for d in errors)


def test_host_limit_is_checked_and_located():
    (error,) = _errors("host_limit.sched")
    assert "over the host limit 2" in error.message and "O(0,2)" in error.message
    assert any("host_limit.sched:4" in note for note in error.notes)


def test_o_without_offload_declared_is_refused_at_the_pop():
    with pytest.raises(SchedError) as caught:
        compile_source(read_source(FIXTURES / "offload" / "offload_without_declaration.sched"))
    messages = [d.message for d in caught.value.diagnostics]
    assert any("pops O" in m and "offload F" in m for m in messages)
    assert all(d.span.line == 5 for d in caught.value.diagnostics)


def test_export_refuses_what_torch_cannot_run():
    from schedc.interop.torch_csv import export_csv
    for name in ("offload_1f1b", "interleaved_1f1b_recompute", "seq1f1b"):
        with pytest.raises(SchedError) as caught:
            export_csv(compile_library(name, p=2, m=2).schedule)
        assert "torch's CSV schedule cannot represent" in caught.value.diagnostics[0].message


def test_the_timeline_draws_a_copy_engine_row_per_offloading_device():
    from schedc.render.timeline import timeline_dot
    dot = timeline_dot(compile_library("offload_1f1b", p=3, m=3))
    assert 'label="copy 0' in dot and 'label="copy 1' in dot and 'label="copy 2' not in dot
    assert "host peak 2" in dot and 'class="op O"' in dot and 'class="op L"' in dot
