"""plan/trace: the one naming of trace events, written by hand here, and both writers (the simulated
trace of schedc/render/trace.py, the runtime's measured one) naming every instruction of a plan alike."""
from __future__ import annotations

import json

import pytest

from conftest import compile_library
from schedc.plan.trace import NOT_COMPUTE, WAIT, event_name, half_args, is_compute, pair_name
from schedc.render import render


def test_names_by_hand():
    assert event_name("F", 1, 3) == "F1.3"
    assert event_name("B", 0, None) == "B0"
    assert event_name("STEP") == "STEP" and event_name("SEND_F", 2, 0) == "SEND_F2.0"
    assert pair_name((("F", 1, 6), ("B", 6, 2))) == "F1.6 & B6.2"
    assert half_args("curvature_A1.2") == {"op": "curvature_A", "stage": 1, "mb": 2}
    assert half_args({"op": "F", "stage": 0, "mb": 4}) == {"op": "F", "stage": 0, "mb": 4}
    assert half_args("F") == {"op": "F"}
    assert WAIT in NOT_COMPUTE and not is_compute(WAIT) and not is_compute("RECV_B") and not is_compute("STEP")
    assert is_compute("F") and is_compute("W") and is_compute("OVERLAP_F_B") and is_compute("kfac")


@pytest.mark.parametrize("name,params", [("1f1b", {"p": 2, "m": 2}), ("dualpipev", {"p": 2, "m": 4}),
                                         ("pipefisher", {"p": 2, "m": 2})])
def test_simulated_and_measured_traces_name_alike(name, params):
    """The runtime's event for each compute instruction of the plan is named as the simulated trace
    names the op (an OVERLAP_F_B by its halves), rank by rank in program order."""
    from schedc.runtime.execution import trace as runtime_trace
    compiled = compile_library(name, **params)
    simulated = json.loads(render(compiled, "json", "x.json"))["traceEvents"]
    for rank, steps in enumerate(compiled.plan.ranks):
        ours = [e["name"] for e in simulated if e["ph"] == "X" and e["pid"] == rank and e["args"]["step"] == 0]
        measured = [runtime_trace.record(rank, 0, instr, 0, 1, 0).name for instr in steps[0]
                    if is_compute(instr.op)]
        assert ours == measured and ours
