"""`schedc simulate|compile|render ... --model M --cluster C --tp T --dp D --microbatch-size b
--global-batch B`: a schedule compiled with the costs of a model on a cluster (schedc/costmodel.py),
simulated with every message timed on its link, and the step's prediction.

    schedc simulate interleaved_1f1b -D p=8 -D v=2 --model gpt-145b.toml --cluster dgx-a100-80gb \\
        --tp 8 --dp 24 --microbatch-size 2 --global-batch 2304
    -> iteration_s, tflops_per_gpu, peak_fraction, memory_gib_per_gpu (+ memory_breakdown), breakdown

m = B / (b * d) microbatches per pipeline unless -D m=... says it (then B may be left out).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Any

import click

from .layout import RECOMPUTE, Layout
from .cluster import (MAX_GPUS, check_layout, check_stages, load_cluster, load_cluster_model,
                      load_model_spec, usage)
from .costmodel import Prediction, Setting, costs_problem, link_times, predict, stage_costs
from .diagnostics import error
from .ops import OpKind


@dataclass(frozen=True)
class ClusterRequest:
    """The command line's cluster options: files and the layout (microbatch size from --microbatch-size)."""

    model: str
    cluster: str
    layout: Layout


_OPTIONS = (
    click.option("--cluster", "cluster_name", default=None, metavar="NAME|FILE",
                 help="Predict on a cluster: a library name (dgx-a100-80gb, dgx-h100-80gb) or a TOML file; "
                      "needs --model, takes --microbatch-size as the microbatch size b."),
    click.option("--tp", type=int, default=None, help="Tensor-parallel size t (with --cluster; default 1)."),
    click.option("--dp", type=int, default=None, help="Data-parallel size d (with --cluster; default 1)."),
    click.option("--global-batch", type=int, default=None,
                 help="Global batch B in sequences (with --cluster): m = B / (b d) unless -D m= is given."),
    click.option("--recompute", type=click.Choice(RECOMPUTE), default=None,
                 help="Activation recomputation (with --cluster; default full, as in Megatron-LM's Table 1)."),
    click.option("--sequence-parallel", is_flag=True, default=False,
                 help="Sequence parallelism (with --cluster): reduce-scatter/all-gather, activations split t ways."),
    click.option("--overlap-grad-reduce", is_flag=True, default=False,
                 help="The data-parallel all-reduce overlaps the last backward (torch DDP), with --cluster."),
    click.option("--blocking-p2p", is_flag=True, default=False,
                 help="A send holds its sender until the message is through, as Megatron-LM's point-to-point "
                      "calls do (default: it does not, as in schedc's runtime), with --cluster."),
    click.option("--distributed-optimizer", is_flag=True, default=False,
                 help="Shard the optimizer state over data parallelism (Megatron-LM's --use-distributed-optimizer, "
                      "ZeRO stage 1), with --cluster."),
)
_MODEL_OPTION = click.option("--model", "model_file", type=click.Path(dir_okay=False), default=None,
                             help="Model description (TOML: layers, hidden, heads, seq, vocab), with --cluster; "
                                  "the same file check --model and the runtime's --config read (the "
                                  "runtime's --model is model code, PKG.MOD:FN).")
_NAMES = ("cluster_name", "tp", "dp", "global_batch", "recompute", "sequence_parallel", "overlap_grad_reduce",
          "blocking_p2p", "distributed_optimizer")


def cluster_options(command):
    """Add the cluster options (and --model) to a command; it gets `model_file` and `cluster`: a
    ClusterRequest or None. The command's own `microbatch_size` (the --profile row option) is the
    microbatch size b with --cluster, and is passed on as None then."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        values = {name: kwargs.pop(name) for name in _NAMES}
        kwargs["cluster"] = request_from(values, kwargs.get("model_file"), kwargs.get("microbatch_size"),
                                         kwargs.get("costs"), kwargs.get("profile"), option_given("latency"))
        if kwargs["cluster"] is not None:
            kwargs["microbatch_size"] = None
        return command(*args, **kwargs)

    for option in reversed((*_OPTIONS, _MODEL_OPTION)):
        wrapper = option(wrapper)
    return wrapper


def option_given(name: str) -> bool:
    """Whether the running command's option `name` was given by the user, not left at its default."""
    context = click.get_current_context(silent=True)
    return context is not None and name in context.params and \
        context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT


def request_from(values: dict[str, Any], model_file: str | None, microbatch_size: int | None,
                 costs: str | None, profile: str | None, latency: bool = False) -> ClusterRequest | None:
    """The request the options make, or None without --cluster; a usage error (exit 2) for layout
    options without --cluster, --cluster without --model, or with measured costs or a --latency
    (`latency`: whether one was given)."""
    if values["cluster_name"] is None:
        given = [f"--{n.replace('_', '-')}" for n in _NAMES[1:] if values[n] not in (None, False)]
        if given:
            raise click.UsageError(f"{', '.join(given)} need{'s' * (len(given) == 1)} --cluster")
        return None
    if model_file is None:
        raise click.UsageError("--cluster needs a model description: --model model.toml")
    if costs or profile:
        raise click.UsageError("--cluster derives the costs: give it without --costs or --profile")
    if latency:
        raise click.UsageError("--cluster derives each message's time from the cluster's links: give it "
                               "without --latency")
    def given(value: int | None) -> int:  # 0 is refused by Layout as a negative is, never taken as 1
        return 1 if value is None else value

    layout = Layout(tp=given(values["tp"]), dp=given(values["dp"]), microbatch_size=given(microbatch_size),
                    global_batch=values["global_batch"], recompute=values["recompute"] or "full",
                    sequence_parallel=values["sequence_parallel"], overlap_grad_reduce=values["overlap_grad_reduce"],
                    blocking_p2p=values["blocking_p2p"], distributed_optimizer=values["distributed_optimizer"])
    return ClusterRequest(model_file, values["cluster_name"], layout)


@dataclass(frozen=True)
class OnCluster:
    """A schedule compiled for a cluster: the compile, its prediction and what it was made from."""

    compiled: Any
    prediction: Prediction
    setting: Setting


def compile_on_cluster(file: str, overrides: dict[str, str], request: ClusterRequest,
                       lower: bool = True, addons: tuple[str, ...] = ()) -> OnCluster:
    """Compile FILE (with the `--with` add-ons) with the costs of request's model on its cluster;
    SchedError on user errors. Without `lower` the schedule is checked and timed but not lowered (no
    plan: `simulate`)."""
    cluster = load_cluster(request.cluster)
    model = load_cluster_model(request.model, cluster)
    check_layout(model, request.layout, request.model)
    return compile_for(file, overrides, Setting(model, cluster, request.layout), request, lower, addons)


def compile_for(file: str, overrides: dict[str, str], st: Setting, request: ClusterRequest | None = None,
                lower: bool = True, addons: tuple[str, ...] = (), free: bool = True) -> OnCluster:
    """compile_on_cluster from descriptions already read (benchmarks and tests call this). The schedule
    is loaded as compile_file loads it (composed: `extends`, `use`, `--with`; the model's layers per
    stage given to its tasks, as `--model` does), then elaborated twice: once to learn its stages (and
    its declared F), once with the costs. Without `free` the message-free simulation is left out: the
    iteration time is the same, the breakdown's bubble and pipeline share are not computed."""
    from .compiler import analyse, collector_paused, compile_schedule, load_declaration, read_source
    from .frontend.elaborate import Options, elaborate
    from .frontend.library import resolve
    from .simulate import simulate
    path = resolve(file)
    if path.suffix == ".csv":
        raise usage(f"{file}: --cluster reads .sched schedules (a torch CSV has no stages to give layers to)")
    source = read_source(path)
    layout = st.layout
    with collector_paused():
        decl = load_declaration(source, addons)
        overrides = _microbatches(decl, dict(overrides), layout)
        probe = elaborate(decl, source, Options(overrides, model_layers=st.model.layers))
        batch = _check_fit(probe, st.model, layout, request.model if request else "")
        costs = stage_costs(st, probe.stages, probe.pipelines[0].placement)
        problem = costs_problem(costs.costs(), layout)
        if problem:
            raise usage(problem)
        schedule = elaborate(decl, source, Options(overrides, costs.costs(), model_layers=st.model.layers,
                                                   task_scale=_forward_scale(probe, costs)))
        links = link_times(st, schedule.devices)
        compiled = (compile_schedule if lower else analyse)(schedule, 0.0, links)
        if free:  # no messages: for the bubble of the breakdown (a fill is chosen again for it)
            without = analyse(schedule).timing if schedule.fill else simulate(schedule)
        else:  # the search's walk: the iteration time does not depend on it (tune ranks its best with it)
            without = compiled.timing
    result = predict(st, compiled.schedule, compiled.timing, without, costs, batch)
    return OnCluster(_with_prediction(compiled, result, st, request), result, st)


def _forward_scale(probe, costs) -> tuple[float, ...]:
    """Seconds per declared cost unit, per stage: a task's declared cost (and `cost piece`) counts
    forwards of its stage (the library's costs are in units of F = 1), so it is scaled by the stage's F
    in seconds over its declared F."""
    forward = costs.costs()[OpKind.F.value]
    declared_f = probe.costs.get(OpKind.F.value, (1.0,) * probe.stages)
    return tuple(f / (df or 1.0) for f, df in zip(forward, declared_f))


def _microbatches(decl, overrides: dict[str, str], layout: Layout) -> dict[str, str]:
    """-D m from --global-batch: m = B / (b d), unless -D m is given (then they must agree)."""
    from .frontend import ast
    m = layout.microbatches()
    if m is None:
        return overrides
    names = {d.name for d in decl.decls if isinstance(d, ast.Param)}
    if "m" not in names:
        return overrides
    if "m" in overrides:
        if overrides["m"] != str(m):
            raise usage(f"-D m={overrides['m']} disagrees with --global-batch {layout.global_batch} / "
                        f"(--microbatch-size {layout.microbatch_size} x --dp {layout.dp}) = {m}")
        return overrides
    return {**overrides, "m": str(m)}


def _check_fit(schedule, model, layout: Layout, model_path: str) -> int:
    """The model's layers divide over the schedule's stages; the batch the schedule runs is the global
    batch asked for. Returns the global batch (sequences per step)."""
    check_stages(model, schedule, model_path)
    gpus = layout.tp * schedule.devices * layout.dp
    if gpus > MAX_GPUS:
        raise usage(f"t x p x d = {layout.tp} x {schedule.devices} x {layout.dp:,} = {gpus:,} GPUs, more than the "
                    f"{MAX_GPUS:,} a prediction takes (as tune's --gpus)")
    per_replica = schedule.microbatches  # all pipelines' (Chimera's two halves make one replica's batch)
    batch = per_replica * layout.microbatch_size * layout.dp
    if layout.global_batch is not None and batch != layout.global_batch:
        raise usage(f"the schedule runs {per_replica} microbatches per step: --global-batch "
                    f"{layout.global_batch} needs {layout.microbatches()} (set its microbatch param)")
    return batch


def _with_prediction(compiled, result: Prediction, st: Setting, request: ClusterRequest):
    """The compile with the prediction in its stats (and plan), and an error when it does not fit."""
    stats = {**compiled.stats, **result.to_json()}
    plan = compiled.plan
    if plan is not None:
        lay = st.layout
        plan = replace(plan, meta={**plan.meta, "stats": stats, "cluster": {
            "model": request.model if request else None, "cluster": st.cluster.name, "tp": lay.tp, "dp": lay.dp,
            "microbatch_size": lay.microbatch_size, "global_batch": result.global_batch,
            "recompute": lay.recompute, "sequence_parallel": lay.sequence_parallel,
            "overlap_grad_reduce": lay.overlap_grad_reduce, "blocking_p2p": lay.blocking_p2p,
            "distributed_optimizer": lay.distributed_optimizer, "unit": "s"}})
    diagnostics = list(compiled.diagnostics)
    limit = st.cluster.memory_bytes
    if result.memory_bytes > limit:
        d = result.extra["largest_memory_device"]
        parts = result.memory_parts
        diagnostics.append(error(
            f"device {d}: predicted {result.memory_bytes / 2**30:.2f} GiB per GPU exceeds the GPU's "
            f"{limit / 2**30:.0f} GiB (weights, gradients and optimizer state "
            f"{parts['weights_gradients_optimizer'] / 2**30:.2f} GiB, activations "
            f"{parts['activations'] / 2**30:.2f} GiB, {_more(parts, ' GiB')})"))
    return replace(compiled, stats=stats, plan=plan, diagnostics=diagnostics)


_LABELS = {"data_parallel_comm_s": "gradient all-reduce"}  # over d, and the tied embedding's between the end stages
LAYOUT_FLAGS = (("sequence_parallel", "sequence parallel"), ("overlap_grad_reduce", "overlapped gradient reduce"),
                ("blocking_p2p", "blocking sends"), ("distributed_optimizer", "distributed optimizer"))  # as shown


def layout_flags(layout: dict[str, Any]) -> list[str]:
    """The layout's switches that are on, in words (a plan's "cluster" metadata or a Layout's fields)."""
    return [text for name, text in LAYOUT_FLAGS if layout.get(name)]


def summary(on: OnCluster) -> str:
    """The prediction as a few lines under the schedule's summary."""
    p, lay = on.prediction, on.setting.layout
    b = p.breakdown
    parts = p.memory_parts
    lines = [f"  on {on.setting.cluster.name}: {p.gpus} GPUs (t={lay.tp}, p={on.compiled.schedule.devices}, "
             f"d={lay.dp}), b={lay.microbatch_size}, global batch {p.global_batch}, recompute {lay.recompute}"
             + "".join(f", {text}" for text in layout_flags(asdict(lay))),
             f"  iteration_s {p.iteration_s:.4f}  tflops_per_gpu {p.tflops_per_gpu:.1f}  "
             f"peak_fraction {p.peak_fraction:.3f}",
             f"  memory_gib_per_gpu {p.memory_bytes / 2**30:.2f} (weights+gradients+optimizer "
             f"{parts['weights_gradients_optimizer'] / 2**30:.2f}, activations {parts['activations'] / 2**30:.2f}, "
             f"{_more(parts)})",
             "  breakdown (s): " + "  ".join(f"{_label(k, lay)} {v:.4f}" for k, v in b.items())]
    return "\n".join(lines)


def _label(key: str, lay: Layout) -> str:
    """A breakdown part in words: the data-parallel exchange as what it is under the layout."""
    if key == "data_parallel_comm_s" and lay.distributed_optimizer:
        return "gradient reduce-scatter + all-gather"
    return _LABELS.get(key, key[:-2].replace("_", " "))


def _more(parts: dict[str, float], unit: str = "") -> str:
    """The memory parts beyond the backward's peak tensors, in words (GiB)."""
    return (f"optimizer step beyond the activations {parts['optimizer_step'] / 2**30:.2f}{unit}, "
            f"allocator and CUDA context {parts['allocator_and_context'] / 2**30:.2f}{unit}")


def fit_to_profile(cluster, model, layout: Layout, measured: dict[str, Any]):
    """The cluster with its compute rates (peak FLOP/s and memory-bound bandwidth) scaled so that the
    cost model's F + B, summed over the stages of a measured profile (the runtime's --profile-out:
    ms per stage), equals the measured sum; communication is left as measured by the microbenchmarks.
    Returns (the scaled cluster, the factor measured / predicted)."""
    from .costmodel import stage_costs
    forward, backward = measured.get(OpKind.F.value), measured.get(OpKind.B.value)
    if not isinstance(forward, (list, tuple)) or not isinstance(backward, (list, tuple)) or len(forward) != len(backward):
        raise usage("--costs: the profile needs per-stage F and B lists (schedc run --profile-out)")
    stages = len(forward)
    if model.layers % stages:
        raise usage(f"--costs: the profile has {stages} stages, which do not divide the model's {model.layers} layers")
    costs = stage_costs(Setting(model, cluster, layout), stages).costs()
    predicted = sum(costs[OpKind.F.value]) + sum(costs[OpKind.B.value])
    factor = (sum(forward) + sum(backward)) / 1000.0 / predicted  # the profile is in ms
    return replace(cluster, peak_flops=cluster.peak_flops / factor, hbm_bandwidth=cluster.hbm_bandwidth / factor,
                   dtype=model.dtype), factor  # its peak is now the model's dtype's, as measured


def _profile_microbatch_size(costs: str, given: int | None) -> int:
    """The microbatch size to fit a profile at: the one it records, which --microbatch-size may repeat
    but not contradict (a fit at 1 of a profile run at the runtime's default 4 was 4x off, silently)."""
    from .interop.profiles import measured_microbatch_size
    recorded = measured_microbatch_size(costs)
    if recorded is not None and given is not None and given != recorded:
        raise usage(f"--microbatch-size {given} disagrees with the profile {costs}, measured at microbatch size "
                    f"{recorded} (the runtime's --mb-size): leave it out, or profile again at {given}")
    if recorded is None and given is None:
        raise usage(f"the profile {costs} does not record its microbatch size: give --microbatch-size (the "
                    "runtime's --mb-size of the run that measured it; its default is 4)")
    return recorded if recorded is not None else given


def calibrate_file(out: str, ranks: int, threads: int, quick: bool, cluster_name: str | None, costs: str | None,
                   model_file: str | None, microbatch_size: int | None, tp: int, recompute: str) -> str:
    """`schedc calibrate`: measure (or read --cluster), then fit to a profile if one is given; write OUT.
    The fit is at the microbatch size the profile records (the runtime's --mb-size); a different
    --microbatch-size is refused, and one is needed for a profile that does not record it."""
    from pathlib import Path
    from .cluster import dump_cluster
    from .outputs import STDOUT, write_output
    if (costs is None) != (model_file is None):
        raise usage("--costs and --model go together: the profile and the model it ran")
    if out == STDOUT:
        raise usage("calibrate writes a cluster file (which --cluster then reads): give -o a path, not -")
    report = []
    if cluster_name is None:
        from .runtime.calibrate import calibrate  # torch, only here
        text, raw = calibrate(ranks, threads, quick)
        write_output(out, text)
        report.append("GEMM GFLOP/s by size " + ", ".join(f"{n}: {r / 1e9:.1f}" for n, r in raw["gemm_flops"].items()))
        report.append("memory-bound GB/s " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in raw["memory_bytes_per_s"].items()))
        report.append("messages s " + ", ".join(f"{k} {v:.3g}" for k, v in raw["comm_s"].items()))
        cluster_name = out
    if costs is not None:
        from .interop.profiles import load_costs
        microbatch_size = _profile_microbatch_size(costs, microbatch_size)
        model, cluster = load_model_spec(model_file), load_cluster(cluster_name)
        layout = Layout(tp=tp, microbatch_size=microbatch_size, recompute=recompute)
        check_layout(model, layout, model_file)
        fitted, factor = fit_to_profile(cluster, model, layout, load_costs(costs))
        fitted = replace(fitted, name=f"{cluster.name}, compute fitted to {Path(costs).name}")
        write_output(out, dump_cluster(fitted, f"{fitted.name}: measured F + B / predicted = {factor:.4g}; "
                                                  f"peak FLOP/s and memory bandwidth divided by it"))
        report.append(f"profile {costs}: measured / predicted compute {factor:.4g}; rates scaled by {1 / factor:.4g}")
    report.append(f"wrote {out}")
    return "\n".join(report)
