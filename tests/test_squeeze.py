"""frontend/squeeze.py: the squeeze of V-Half and V-Min keeps every check green, stays within the block's
memory peak, never idles more than the plain block, and reproduces the sail-sg generator's orders also
for odd p and multiples of 3 (tests/reference_zb.py follows its rules)."""
from __future__ import annotations

import pytest

import reference_zb as Z
from conftest import SCHEDULES, compile_library
from schedc.driver import compile_source
from schedc.diagnostics import Source
from schedc.frontend.elaborate import Options

CASES = [(name, p, m) for name in ("v_half", "v_min") for p in (3, 5, 6) for m in (1, p - 1, p, 2 * p + 1)]


def plain(name: str, p: int, m: int):
    """The library file without its `squeeze`: the repeated building block."""
    text = (SCHEDULES / f"{name}.sched").read_text().replace("\nsqueeze\n", "\n")
    return compile_source(Source(f"{name}.sched", text), Options({"p": str(p), "m": str(m)}))


@pytest.mark.parametrize("name,p,m", CASES)
def test_squeeze_keeps_the_checks_the_peak_and_the_reference(name, p, m):
    squeezed, block = compile_library(name, p=p, m=m), plain(name, p, m)
    assert squeezed.ok and block.ok, [d.message for d in squeezed.diagnostics + block.diagnostics]
    assert max(squeezed.stats.peak_memory) <= max(block.stats.peak_memory)
    assert max(squeezed.stats.idle_inside) <= max(block.stats.idle_inside)
    assert squeezed.stats.makespan <= block.stats.makespan
    reference = Z.v_half(p, m) if name == "v_half" else Z.v_min(p, m)
    assert [[(op.kind, op.stage, op.mb) for op in order] for order in squeezed.schedule.orders] == reference


def test_squeeze_moves_only_the_warm_up_and_the_cool_down():
    # p = 4, m = 12: the middle of every device's order is the block's, shifted in time only
    p, m = 4, 12
    squeezed, block = compile_library("v_half", p=p, m=m).schedule, plain("v_half", p, m).schedule
    for got, was in zip(squeezed.orders, block.orders):
        middle = len(was) // 2
        assert [str(op) for op in got[middle - 12:middle + 12]] == [str(op) for op in was[middle - 12:middle + 12]]
        assert [str(op) for op in got[:8]] != [str(op) for op in was[:8]] or got[-8:] != was[-8:]
