"""What a trace calls an instruction, once: the event names of the runtime's measured Chrome traces
(schedc/runtime/execution/trace.py) and of the compiler's simulated ones (schedc/render/trace.py), and
what the measured report and the renderer (schedc/render/measured.py) read back as compute.

    event_name("F", 1, 3) -> "F1.3"      event_name("B", 0, None) -> "B0"      event_name("STEP") -> "STEP"
    pair_name((("F", 1, 6), ("B", 6, 2))) -> "F1.6 & B6.2"   (an OVERLAP_F_B, its halves in order)
    half_args("curvature_A1.2") -> {"op": "curvature_A", "stage": 1, "mb": 2}   (older traces' halves)
"""
from __future__ import annotations

import re

from ..ops import NOT_COMPUTE as NOT_COMPUTE_INSTRS, Opcode, label

WAIT = "wait"  # the runtime's event for the time an instruction is blocked on a receive
NOT_COMPUTE = NOT_COMPUTE_INSTRS | {WAIT}  # events that are not compute: messages, sync, STEP, waits

_HALF_NAME = re.compile(r"([A-Za-z_]\w*?)(\d+)\.(\d+)$")  # event_name read back: `F0.3`, `curvature_A1.2`


def event_name(op: str, stage: int | None = None, mb: int | None = None) -> str:
    """An instruction's event: `F1.3` (kind, stage, microbatch), `B0` (no microbatch), `STEP`."""
    if stage is None:
        return op
    return f"{op}{stage}" if mb is None else f"{op}{stage}.{mb}"


def pair_name(halves: tuple[tuple[str, int | None, int | None], ...]) -> str:
    """An overlapped pair's one event, named by its halves ((op, stage, mb) each) in the pair's order."""
    return label(Opcode.OVERLAP_F_B.value, halves=tuple(event_name(*half) for half in halves))


def half_args(half) -> dict:
    """An overlapped event's half as {op, stage, mb}: as written, or read back from older traces' `F0.3`."""
    if isinstance(half, dict):
        return half
    found = _HALF_NAME.match(str(half))
    return {"op": found.group(1), "stage": int(found.group(2)), "mb": int(found.group(3))} if found else {"op": str(half)}


def is_compute(op: str) -> bool:
    """Whether an event's op is counted as compute (not a message, a sync, STEP nor a wait)."""
    return op not in NOT_COMPUTE
