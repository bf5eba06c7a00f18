"""`tune --synthesize --model M --cluster C`: the problem of a row's own costs, zero bubble's automatic
schedules (Qi et al. 2024, section 3; ZB-1p under a limit of p activations per device, ZB-2p of 2p).

    tune --synthesize --model zb-1.5b --cluster a100-80gb-roce --microbatch-size 6 --recompute none \\
        --blocking-p2p --account-for-embedding --account-for-loss -D p=8 -D m=24 --activation-limit 8 -o zb1p.sched
    -> zb1p.sched: each stage's F, I and W in seconds from the cost model; `simulate --cluster` with the
       same options predicts it

The limit counts activations as the paper's scheduler does: a forward's activation M_B until its I,
then the part its deferred W still needs, M_W (the cost model's bytes of both: 32h of 34h + 5as per
token and layer without recomputation), until its W.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..diagnostics import usage
from ..layout import Layout
from ..ops import OpKind
from .problem import Problem, make_problem


@dataclass(frozen=True)
class OnCluster:
    """The cost model's side of a synthesis: the model and cluster files (or names) and the layout."""

    model: str
    cluster: str
    layout: Layout
    seq: int | None = None


def cluster_problem(setting: Any, p: int, m: int, limit: tuple[float, ...]) -> Problem:
    """The Problem of p stages and m microbatches with the cost model's F, I and W of each stage (in
    seconds; costmodel.Setting `setting`), the limit in activations with a deferred W counted as M_W
    over M_B (at most one)."""
    from ..costmodel import stage_costs
    from ..costmodel.bytes import deferred_weight_bytes, layer_activation_bytes
    costs = stage_costs(setting, p, tuple(range(p))).costs()
    deferred = deferred_weight_bytes(setting.model, setting.layout) / layer_activation_bytes(setting.model,
                                                                                             setting.layout)
    kinds = (OpKind.F.value, OpKind.I.value, OpKind.W.value)  # the split backward the paper's schedules run
    return make_problem(p, m, {k: costs[k] for k in kinds}, 0.0, limit, deferred=min(1.0, deferred))


def problem_on_cluster(given: OnCluster, p: int, m: int, limit: tuple[float, ...]) -> Problem:
    """cluster_problem from the command line's files: the model checked against the layout, its layers
    split over p stages as the layout splits them (usage errors, exit 2)."""
    from ..costmodel import Setting
    from ..costmodel.specs import check_layout, check_switches, load_cluster, load_cluster_model
    from ..layout import SplitError
    cluster = load_cluster(given.cluster)
    model = load_cluster_model(given.model, cluster, given.seq)
    check_layout(model, given.layout, given.model)
    check_switches(given.layout, cluster)
    try:
        given.layout.layer_split(model.layers, p)
    except SplitError as exc:
        raise usage(f"--model {given.model}: {exc}") from None
    return cluster_problem(Setting(model, cluster, given.layout), p, m, limit)


__all__ = ["OnCluster", "cluster_problem", "problem_on_cluster"]
