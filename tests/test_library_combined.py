"""Megatron-Core's combined 1F1B in the library: its per-rank order equals one built here from
Megatron-LM's rules (schedules.py: the warm-up count of the interleaved schedule plus one, the
virtual-microbatch to (chunk, microbatch) maps; combined_1f1b.py: every steady-state step one
forward and one backward as a single overlapped op), it passes the checks and lowers, and each
device holds one activation more than its warm-up count (the pending backward of the pair)."""
from __future__ import annotations

import pytest

from test_library_zb import compile_zb, neutral


def megatron_combined(p: int, v: int, m: int) -> list[list]:
    """Per device: Megatron's virtual microbatch k runs chunk (k // p) % v of microbatch
    (k // (p v)) p + k % p, backwards with the chunks reversed; warm-up 2 (p - d - 1) + (v - 1) p + 1
    forwards, then pairs (forward k + warm-up, backward k), then the remaining backwards."""
    total = m * v

    def op(kind: str, d: int, k: int) -> tuple:
        chunk = (k // p) % v
        if kind == "B":
            chunk = v - 1 - chunk
        return (kind, chunk * p + d, (k // (p * v)) * p + k % p)

    orders = []
    for d in range(p):
        warm = min(2 * (p - d - 1) + (v - 1) * p + 1, total)
        order = [op("F", d, k) for k in range(warm)]
        order += [(op("F", d, warm + k), op("B", d, k)) for k in range(total - warm)]
        order += [op("B", d, k) for k in range(total - warm, total)]
        orders.append(order)
    return orders


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (2, 2, 4), (4, 1, 8), (2, 3, 6), (4, 2, 12)])
def test_order_equals_megatrons_rules(p, v, m):
    result = compile_zb("combined_1f1b", p=p, v=v, m=m)
    assert result.ok, [d.message for d in result.diagnostics]
    assert neutral(result.schedule) == megatron_combined(p, v, m)
    assert result.plan is not None and len(result.plan.ranks) == p


def test_by_hand_p2_m4_device_1():
    """p = 2, v = 2, m = 4, the last device: warm-up 2 + 1 = 3 forwards, 5 pairs, 3 backwards."""
    order = neutral(compile_zb("combined_1f1b", p=2, v=2, m=4).schedule)[1]
    assert order[:3] == [("F", 1, 0), ("F", 1, 1), ("F", 3, 0)]
    assert order[3] == (("F", 3, 1), ("B", 3, 0))
    assert order[-1] == ("B", 1, 3) and len(order) == 3 + 5 + 3


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (8, 2, 16)])
def test_peak_is_the_warm_up_plus_the_pending_backward(p, v, m):
    peaks = compile_zb("combined_1f1b", p=p, v=v, m=m).stats["peak_memory"]
    assert list(peaks) == [min(2 * (p - d - 1) + (v - 1) * p + 1, m * v) + 1 for d in range(p)]
