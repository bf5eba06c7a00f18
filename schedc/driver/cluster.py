"""Compiling for a model on a cluster (--cluster; tune's whole compiles): the schedule elaborated with
each stage's costs from the cost model, the passes run with every message timed on its link, and the
step's prediction put in the stats (and the plan).

    schedc simulate interleaved_1f1b -D p=8 -D v=2 --model gpt-145b.toml --cluster dgx-a100-80gb \\
        --tp 8 --dp 24 --microbatch-size 2 --global-batch 2304
    -> iteration_s, tflops_per_gpu, peak_fraction, memory_gib_per_gpu (+ memory_breakdown), breakdown

m = B / (b * d) microbatches per pipeline unless -D m=... says it (then B may be left out).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..budget import COMPILE_OPS
from ..costmodel.specs import MAX_GPUS, check_layout, check_stages, check_switches, load_cluster, load_cluster_model
from ..diagnostics import USAGE, usage
from ..costmodel.bytes import layer_activation_bytes
from ..costmodel.hardware import stage_layers
from ..costmodel.stages import chunk_multipliers
from ..costmodel import Prediction, Setting, costs_problem, link_times, predict, stage_costs
from ..costmodel.experts import expert_collectives
from ..costmodel.sharding import declared_collectives, sharded_collectives
from ..diagnostics import Diagnostic, error
from ..layout import ClusterRequest, Layout
from ..ops import OpKind
from ..text import memory_more
from ..text import gib


@dataclass(frozen=True)
class OnCluster:
    """A schedule compiled for a cluster: the compile, its prediction and what it was made from."""

    compiled: Any
    prediction: Prediction
    setting: Setting
    over_memory: Diagnostic | None = None  # the error of a prediction beyond the GPU's memory, if any


def compile_on_cluster(file: str, overrides: dict[str, str], request: ClusterRequest,
                       lower: bool = True, addons: tuple[str, ...] = (), max_ops: int | None = None) -> OnCluster:
    """Compile FILE (with the `--with` add-ons) with the costs of request's model on its cluster;
    SchedError on user errors. Without `lower` the schedule is checked and timed but not lowered (no
    plan: `simulate`). max_ops: the most ops it may expand to (--max-ops; budget.COMPILE_OPS)."""
    cluster = load_cluster(request.cluster)
    model = load_cluster_model(request.model, cluster, request.seq)
    check_layout(model, request.layout, request.model)
    check_switches(request.layout, cluster)
    return compile_for(file, overrides, Setting(model, cluster, request.layout), request, lower, addons,
                       max_ops=max_ops)


def compile_for(file: str, overrides: dict[str, str], st: Setting, request: ClusterRequest | None = None,
                lower: bool = True, addons: tuple[str, ...] = (), free: bool = True,
                max_ops: int | None = None) -> OnCluster:
    """compile_on_cluster from descriptions already read (benchmarks and tests call this). The schedule
    is loaded as compile_file loads it (composed: `extends`, `use`, `--with`; the model's layers per
    stage given to its tasks, as `--model` does), then elaborated twice: its shape alone (its stages and
    declared F; no order run), then whole with the costs. Without `free` the message-free simulation is
    left out: the iteration time is the same, the breakdown's bubble and pipeline share are not computed."""
    from ..frontend.elaborate import Options, elaborate
    from ..frontend.library import resolve
    from ..frontend.parse import read_source
    from .inputs import TORCH_CSV, kind_of, load_declaration
    from ..passes.simulate import makespan
    from .passes import analyse, collector_paused, compile_schedule
    path = resolve(file)
    if kind_of(path) == TORCH_CSV:
        raise usage(f"{file}: --cluster reads .sched schedules (a torch CSV has no stages to give layers to)")
    source = read_source(path)
    layout, max_ops = st.layout, max_ops or COMPILE_OPS.limit
    with collector_paused():
        decl = load_declaration(source, addons)
        overrides = _microbatches(decl, dict(overrides), layout, max_ops)
        probe = elaborate(decl, source, Options(overrides, model_layers=st.model.layers, layer_split=_split(st.layout),
                                                max_ops=max_ops, shape_only=True))
        batch = _check_fit(probe, st.model, layout, request.model if request else "")
        costs = stage_costs(st, probe.stages, probe.pipelines[0].placement)
        problem = costs_problem(costs.costs(), st)
        if problem:
            raise usage(problem)
        placed, by_chunk = _placed_costs(probe, st, costs, source)
        schedule = elaborate(decl, source, Options(overrides, {**costs.costs(), **placed}, model_layers=st.model.layers, layer_split=_split(st.layout),
                                                   task_scale=_forward_scale(probe, costs), chunk_costs=by_chunk,
                                                   max_ops=max_ops))
        schedule = replace(schedule, collectives=expert_collectives(st, schedule.stages)  # declared in the plan
                           + declared_collectives(st, schedule))
        links, sharded = link_times(st, schedule.devices), sharded_collectives(st, schedule)
        compiled = (compile_schedule if lower else analyse)(schedule, 0.0, links, collectives=sharded)
        if free:  # no messages: for the bubble of the breakdown (a fill is chosen again for it)
            without = (analyse(schedule, collectives=sharded).timing.makespan if schedule.fill
                       else makespan(schedule, collectives=sharded))
        else:  # the search's walk: the iteration time does not depend on it (tune ranks its best with it)
            without = compiled.timing.makespan
        unsharded = makespan(schedule) if sharded is not None and free else without
        timing, gathers = compiled.timing, without - unsharded
        if layout.post_validation:  # steps that overlap: the steady step's makespans, with and without messages
            timing, without = _post_validated(st, compiled.schedule, timing, without, links, free)
        result = predict(st, compiled.schedule, timing, without, costs, batch, gathers)  # (its walk: 10^5 tuples)
    over = _over_memory(result, st)
    return OnCluster(_with_prediction(compiled, result, st, request, over), result, st, over)


def _post_validated(st: Setting, schedule, timing, without: float, links, free: bool):
    """The optimizer's post-validation (--post-validation, post_validation.py): the timing of one step with its
    makespan the steady step's, two steps back to back less one, and the same of the message-free
    makespan (the breakdown's pipeline share)."""
    from ..passes.simulate import makespan, simulate
    from .post_validation import repeat_steps, steady
    if st.layout.zero >= 2:
        raise usage(f"--post-validation with --zero {st.layout.zero}: the lanes' collectives are timed per step "
                    "here; give --zero 0 or 1")
    twice = repeat_steps(schedule)
    two = simulate(twice, 0.0, link_times(st, twice.devices))
    free_two = makespan(twice) if free else two.makespan
    return replace(timing, makespan=steady(timing.makespan, two.makespan)), steady(without, free_two)


def _placed_costs(probe, st: Setting, costs, source) -> tuple[dict, dict | None]:
    """What a schedule's placed ops and sequence chunks cost on the cluster: O and L, one microbatch's
    activation bytes of the stage over the GPU's host link; per chunk, its attention's growth
    (chunk_multipliers). Refused: chunks that do not divide the model's sequence, offload on a cluster
    that gives no host link, `recompute F` beside the layout's own recomputation (B would redo it)."""
    from ..frontend.params import fail_at
    pipe, placed = probe.pipelines[0], {}
    if probe.chunks > 1 and st.model.seq % probe.chunks:
        raise fail_at(f"{probe.chunks} sequence chunks do not divide the model's sequence of {st.model.seq:,} "
                      "tokens", pipe.span, source, kind=USAGE)
    if probe.recompute and st.layout.recompute != "none":
        raise usage(f"the schedule places its recomputation (recompute F, R ops): give --recompute none, not "
                    f"{st.layout.recompute}")
    if probe.offload:
        if not st.cluster.host_bandwidth:
            raise usage(f"the schedule offloads activations (offload F), but cluster '{st.cluster.name}' gives no "
                        "host link: add [host] bandwidth_gbps")
        per_layer = layer_activation_bytes(st.model, st.layout) / st.cluster.host_bandwidth
        copy = tuple(n * per_layer for n in stage_layers(st.model, probe.stages, st.layout))
        placed = {OpKind.O.value: copy, OpKind.L.value: copy}
    return placed, (chunk_multipliers(st, costs, probe.chunks) if probe.chunks > 1 else None)


def _forward_scale(probe, costs) -> tuple[float, ...]:
    """Seconds per declared cost unit, per stage: a task's declared cost (and `cost piece`) counts
    forwards of its stage (the library's costs are in units of F = 1), so it is scaled by the stage's F
    in seconds over its declared F."""
    forward = costs.costs()[OpKind.F.value]
    declared_f = probe.costs.get(OpKind.F.value, (1.0,) * probe.stages)
    return tuple(f / (df or 1.0) for f, df in zip(forward, declared_f))


def _microbatches(decl, overrides: dict[str, str], layout: Layout, max_ops: int) -> dict[str, str]:
    """-D m from --global-batch: m = B / (b d), unless -D m is given (then they must agree)."""
    from ..frontend import ast
    m = layout.microbatches()
    if m is None:
        return overrides
    names = {d.name for d in decl.decls if isinstance(d, ast.Param)}
    if "m" not in names:
        return overrides
    if m > max_ops:  # said of the option given, not of a -D m= the user never wrote
        raise usage(f"--global-batch {layout.global_batch:,} is {m:,} microbatches per step (B / (b d) = "
                    f"{layout.global_batch:,} / ({layout.microbatch_size} x {layout.dp})), past the {max_ops:,} ops "
                    f"a schedule may expand to ({COMPILE_OPS.why})")
    if "m" in overrides:
        if overrides["m"] != str(m):
            raise usage(f"-D m={overrides['m']} disagrees with --global-batch {layout.global_batch} / "
                        f"(--microbatch-size {layout.microbatch_size} x --dp {layout.dp}) = {m}")
        return overrides
    return {**overrides, "m": str(m)}


def _check_fit(schedule, model, layout: Layout, model_path: str) -> int:
    """The model's layers divide over the schedule's stages; the batch the schedule runs is the global
    batch asked for. Returns the global batch (sequences per step)."""
    check_stages(model, schedule, model_path, layout)
    gpus = layout.tp * layout.cp * schedule.devices * layout.dp
    if gpus > MAX_GPUS:
        names, sizes = ("t x cp", f"{layout.tp} x {layout.cp}") if layout.cp > 1 else ("t", f"{layout.tp}")
        raise usage(f"{names} x p x d = {sizes} x {schedule.devices} x {layout.dp:,} = {gpus:,} GPUs, more than the "
                    f"{MAX_GPUS:,} a prediction takes (as tune's --gpus)")
    per_replica = schedule.microbatches  # all pipelines' (Chimera's two halves make one replica's batch)
    batch = per_replica * layout.microbatch_size * layout.dp
    if layout.global_batch is not None and batch != layout.global_batch:
        raise usage(f"the schedule runs {per_replica} microbatches per step: --global-batch "
                    f"{layout.global_batch} needs {layout.microbatches()} (set its microbatch param)")
    return batch


def _with_prediction(compiled, result: Prediction, st: Setting, request: ClusterRequest,
                     over: Diagnostic | None):
    """The compile with the prediction in its stats (and plan), and `over` when it does not fit."""
    stats = {**compiled.stats, **result.to_json()}
    plan = compiled.plan
    if plan is not None:
        lay = st.layout
        plan = replace(plan, meta={**plan.meta, "stats": stats, "cluster": {
            "model": request.model if request else None, "cluster": st.cluster.name, "tp": lay.tp, "dp": lay.dp,
            "microbatch_size": lay.microbatch_size, "global_batch": result.global_batch,
            "recompute": lay.recompute, "sequence_parallel": lay.sequence_parallel,
            "overlap_grad_reduce": lay.overlap_grad_reduce, "blocking_p2p": lay.blocking_p2p,
            "distributed_optimizer": lay.distributed_optimizer, **_sharding_meta(lay), "unit": "s"}})
    diagnostics = [*compiled.diagnostics, *([over] if over is not None else [])]
    return replace(compiled, stats=stats, plan=plan, diagnostics=diagnostics)


def _sharding_meta(lay: Layout) -> dict[str, Any]:
    """The plan's record of the ZeRO level and context parallelism, where they differ from the default
    (a plan of before them reads the same)."""
    meta = {"zero": lay.zero} if lay.zero >= 2 else {}
    if lay.zero == 3:
        meta["reshard_after_forward"] = lay.reshard_after_forward
    return meta | ({"cp": lay.cp} if lay.cp > 1 else {})


def _over_memory(result: Prediction, st: Setting) -> Diagnostic | None:
    """The error of a prediction beyond the GPU's memory, with its parts; None when it fits."""
    limit = st.cluster.memory_bytes
    if result.memory_bytes <= limit:
        return None
    d = result.extra["largest_memory_device"]
    parts = result.memory_parts
    return error(f"device {d}: predicted {gib(result.memory_bytes)} GiB per GPU exceeds the GPU's "
                 f"{gib(limit, 0)} GiB (weights, gradients and optimizer state "
                 f"{gib(parts['weights_gradients_optimizer'])} GiB, activations "
                 f"{gib(parts['activations'])} GiB, {memory_more(parts, ' GiB')})")


def _split(layout: Layout) -> tuple:
    """The layout's layer split as elaborate's Options take it (split_layers' last three arguments)."""
    return (layout.stage_layers, layout.account_for_embedding, layout.account_for_loss)
