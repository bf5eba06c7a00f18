"""A prediction in words (the lines under a schedule's summary), and `schedc calibrate`'s fit of a
cluster's compute rates to a measured profile. The compile for a cluster is the driver's
(schedc/driver/cluster.py)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .layout import Layout, switches_on
from .costmodel.specs import check_layout, load_cluster, load_model_spec
from .diagnostics import usage
from .costmodel import Setting, stage_costs
from .ops import OpKind
from .text import gib, rate


_LABELS = {"data_parallel_comm_s": "gradient all-reduce"}  # over d, and the tied embedding's between the end stages
def summary(on) -> str:  # a driver.cluster.OnCluster
    """The prediction as a few lines under the schedule's summary."""
    p, lay = on.prediction, on.setting.layout
    b = p.breakdown
    parts = p.memory_parts
    lines = [f"  on {on.setting.cluster.name}: {p.gpus} GPUs (t={lay.tp}, p={on.compiled.schedule.devices}, "
             f"d={lay.dp}), b={lay.microbatch_size}, global batch {p.global_batch}, recompute {lay.recompute}"
             + "".join(f", {text}" for text in switches_on(lay)),
             f"  iteration_s {p.iteration_s:.4f}  tflops_per_gpu {rate(p.tflops_per_gpu)}  "
             f"peak_fraction {p.peak_fraction:.3f}",
             f"  memory_gib_per_gpu {gib(p.memory_bytes)} (weights+gradients+optimizer "
             f"{gib(parts['weights_gradients_optimizer'])}, activations {gib(parts['activations'])}, "
             f"{memory_more(parts)})",
             "  breakdown (s): " + "  ".join(f"{_label(k, lay)} {v:.4f}" for k, v in b.items())]
    return "\n".join(lines)


def _label(key: str, lay: Layout) -> str:
    """A breakdown part in words: the data-parallel exchange as what it is under the layout."""
    if key == "data_parallel_comm_s" and lay.distributed_optimizer:
        return "gradient reduce-scatter + all-gather"
    return _LABELS.get(key, key[:-2].replace("_", " "))


def memory_more(parts: dict[str, float], unit: str = "") -> str:
    """The memory parts beyond the backward's peak tensors, in words (GiB)."""
    return (f"optimizer step beyond the activations {gib(parts['optimizer_step'])}{unit}, "
            f"allocator and CUDA context {gib(parts['allocator_and_context'])}{unit}")


def fit_to_profile(cluster, model, layout: Layout, measured: dict[str, Any]):
    """The cluster with its compute rates (peak FLOP/s and memory-bound bandwidth) scaled so that the
    cost model's F + B, summed over the stages of a measured profile (the runtime's --profile-out:
    ms per stage), equals the measured sum; communication is left as measured by the microbenchmarks.
    Returns (the scaled cluster, the factor measured / predicted)."""
    forward, backward = measured.get(OpKind.F.value), measured.get(OpKind.B.value)
    if not isinstance(forward, (list, tuple)) or not isinstance(backward, (list, tuple)) or len(forward) != len(backward):
        raise usage("--costs: the profile needs per-stage F and B lists (schedc run --profile-out)")
    stages = len(forward)
    if model.layers % stages:
        raise usage(f"--costs: the profile has {stages} stages, which do not divide the model's {model.layers} layers")
    _check_signal(forward, backward)
    costs = stage_costs(Setting(model, cluster, layout), stages).costs()
    predicted = sum(costs[OpKind.F.value]) + sum(costs[OpKind.B.value])
    factor = (sum(forward) + sum(backward)) / 1000.0 / predicted  # the profile is in ms
    if not MIN_FIT <= factor <= 1 / MIN_FIT:  # a fit this far off is of another model, size or unit
        raise usage(f"--costs: the profile's F + B ({sum(forward) + sum(backward):.3g} ms) is {factor:.3g} times the "
                    f"cost model's prediction for this model on {cluster.name}: no fit is that far off (was the "
                    f"profile run with this model, microbatch size and tensor parallelism, in ms?)")
    return replace(cluster, peak_flops=cluster.peak_flops / factor, hbm_bandwidth=cluster.hbm_bandwidth / factor,
                   dtype=model.dtype), factor  # its peak is now the model's dtype's, as measured


MIN_FIT = 1e-6  # a profile measured / predicted outside [1e-6, 1e6] is refused, not fitted


def _check_signal(forward, backward) -> None:
    """A profile to fit needs time measured in every stage's F and B: a zero (or an empty list) is no
    signal, and a fit to it would make compute free or infinite."""
    if not forward:
        raise usage("--costs: the profile has no stages (empty F and B lists)")
    for kind, values in ((OpKind.F.value, forward), (OpKind.B.value, backward)):
        quiet = [s for s, v in enumerate(values) if not v > 0]
        if quiet:
            raise usage(f"--costs: the profile's {kind} is 0 at stage {quiet[0]}: no time measured, nothing to fit "
                        "(profile a run of at least one step: schedc run PLAN --profile-out costs.json)")


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
    from .costmodel.specs import dump_cluster
    from .outputs import STDOUT, write_output
    if (costs is None) != (model_file is None):
        raise usage("--costs and --model go together: the profile and the model it ran")
    if out == STDOUT:
        raise usage("calibrate writes a cluster file (which --cluster then reads): give -o a path, not -")
    if cluster_name is not None and costs is None:  # it would measure nothing, fit nothing and write nothing
        raise usage("--cluster is the cluster to fit to a profile: give --costs and --model with it (or leave it "
                    "out to measure this machine)")
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
    report.append(f"wrote {out}: {_summary(load_cluster(out))}")
    return "\n".join(report)


def _summary(cluster) -> str:
    """What a written cluster file says, read back as --cluster will read it."""
    return (f"{cluster.name}: {cluster.gpus_per_node} per node, peak {cluster.peak_flops / 1e12:.4g} TFLOP/s "
            f"({cluster.dtype}), memory {cluster.memory_bytes / 2**30:.4g} GiB at {cluster.hbm_bandwidth / 1e9:.4g} GB/s, "
            f"messages {cluster.intra_bandwidth / 1e9:.4g} GB/s after {cluster.intra_latency * 1e6:.4g} us")
