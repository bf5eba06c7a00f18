"""`schedc calibrate`'s fit of a cluster's compute rates to measured profiles, and the calibration
run that measures them and writes the cluster description."""
from __future__ import annotations

from dataclasses import replace
from typing import Any
from ..layout import Layout
from .specs import check_layout, load_cluster, load_model_spec
from ..diagnostics import usage
from . import Setting, stage_costs
from .hardware import stage_layers
from ..ops import OpKind


def sharding_words(lay: Layout) -> str:
    """The context- and expert-parallel sizes and the ZeRO level above 1, as the layout's words add them:
    ", cp=2, zero 3 resharding after the forward"."""
    words = f", cp={lay.cp}" if lay.cp > 1 else ""
    words += f", ep={lay.ep}" if lay.ep > 1 else ""
    if lay.zero >= 2:
        words += f", zero {lay.zero}"
    if lay.zero == 3:
        words += " resharding after the forward" if lay.reshard_after_forward else " kept gathered"
    return words
def fit_to_profile(cluster, model, layout: Layout, measured: dict[str, Any]):
    """The cluster with its compute rates (peak FLOP/s and memory-bound bandwidth) scaled so that the
    cost model's F + B, summed over the stages of a measured profile (the runtime's --profile-out:
    ms per stage), equals the measured sum; communication is left as measured by the microbenchmarks.
    Returns (the scaled cluster, the factor measured / predicted)."""
    forward, backward = measured.get(OpKind.F.value), measured.get(OpKind.B.value)
    if not isinstance(forward, (list, tuple)) or not isinstance(backward, (list, tuple)) or len(forward) != len(backward):
        raise usage("--costs: the profile needs per-stage F and B lists (schedc run --profile-out)")
    _check_signal(forward, backward)  # first: an empty profile has no stages to divide the layers
    stages = len(forward)
    if model.layers % stages:
        raise usage(f"--costs: the profile has {stages} stages, which do not divide the model's {model.layers} layers")
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
FITTED = (OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value)  # the op kinds a fit reads
def fit_to_profiles(cluster, runs: list[tuple[Any, Layout, dict[str, Any]]]):
    """The cluster fitted to profiles of runs at two or more sizes ((model, layout, profile) each).
    Per layer, an op of kind k measured y = g x_g + r x_m + o_k, where x_g and x_m are the cost model's
    GEMM and memory-bound times at the cluster's rates, g and r how many times slower the run's kernels
    are (the microbenchmarks time kernels alone; a run shares the cores and caches), o_k the kind's
    overhead (what a layer's op costs beyond its kernels' work: the CPU's op dispatch and autograd), by
    least squares over every stage and kind. Where g and r cannot be told apart (or one comes out
    negative) one factor is fitted for both. Returns (the cluster with peak FLOP/s / g, memory
    bandwidth / r and the overheads in [overhead], {"gemm": g, "memory": r}, {kind: s per layer})."""
    if len({(model, layout.microbatch_size) for model, layout, _ in runs}) < 2:
        raise usage("--costs: profiles at one size give no overhead to fit: give profiles of two model (or "
                    "microbatch) sizes")
    points = _fit_points(replace(cluster, overhead=()), runs)
    kinds = sorted({k for k, *_ in points}, key=FITTED.index)
    solution, rates = None, [0.0, 0.0]
    for shared in (False, True):
        rows = [([xg + xm] if shared else [xg, xm]) + [float(k == j) for j in kinds] for k, xg, xm, _ in points]
        solution = _least_squares(rows, [y for *_, y in points])
        if solution is not None:
            rates = solution[:1] * 2 if shared else solution[:2]
            if min(rates) > 0:
                break
    if solution is None or not min(rates) > 0:
        raise usage("--costs: the profiles cannot tell the kernels' time from the overheads (no positive rate "
                    "fits them): give profiles of sizes further apart")
    slower = {"gemm": rates[0], "memory": rates[1]}
    if not all(MIN_FIT <= v <= 1 / MIN_FIT for v in slower.values()):
        raise usage(f"--costs: the profiles fit kernels {max(slower.values()):.3g} times slower than the cost model's "
                    f"prediction on {cluster.name}: no fit is that far off (were they run with these models, in ms?)")
    overhead = {k: max(0.0, o) for k, o in zip(kinds, solution[len(solution) - len(kinds):])}
    fitted = replace(cluster, peak_flops=cluster.peak_flops / rates[0], hbm_bandwidth=cluster.hbm_bandwidth / rates[1],
                     dtype=runs[0][0].dtype, overhead=tuple(overhead.items()))
    return fitted, slower, overhead
HUGE_RATE = 1e30  # a rate that makes one kind of kernel free: the other's time alone
def _fit_points(bare, runs) -> list[tuple[str, float, float, float]]:
    """(kind, GEMM seconds, memory-bound seconds, measured seconds) per layer of every stage's op of
    every profile."""
    points = []
    for model, layout, measured in runs:
        _check_profile(model, measured)
        stages = len(measured[OpKind.F.value])
        gemm, memory = (stage_costs(Setting(model, replace(bare, **{free: HUGE_RATE}), layout), stages).costs()
                        for free in ("hbm_bandwidth", "peak_flops"))
        layers = stage_layers(model, stages, layout)
        for kind in FITTED:
            for s, value in enumerate(measured.get(kind) or ()):
                points.append((kind, gemm[kind][s] / layers[s], memory[kind][s] / layers[s],
                               value / 1000.0 / layers[s]))
    return points
def _least_squares(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    """x minimising |A x - y| (the normal equations, Gauss-Jordan with partial pivoting); None when
    A's columns are dependent (the data cannot tell the unknowns apart)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys))]
         for i in range(n)]
    scale = max(abs(a[i][i]) for i in range(n)) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) <= 1e-12 * scale:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for i in range(n):
            if i != col:
                ratio = a[i][col] / a[col][col]
                a[i] = [v - ratio * w for v, w in zip(a[i], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]
def _check_profile(model, measured: dict[str, Any]) -> None:
    """A profile to fit at a size: per-stage F, and B or I and W, of as many stages as divide the model."""
    forward = measured.get(OpKind.F.value)
    backward = [k for k in FITTED[1:] if k in measured]
    rows = [measured.get(k) for k in (OpKind.F.value, *backward)]
    if not backward or not all(isinstance(r, (list, tuple)) and len(r) == len(forward or ()) for r in rows):
        raise usage("--costs: a profile needs per-stage F, and B or I and W, lists (schedc run --profile-out)")
    _check_signal(forward, measured.get(backward[0]))  # first: an empty profile has no stages
    if model.layers % len(forward):
        raise usage(f"--costs: the profile has {len(forward)} stages, which do not divide the model's "
                    f"{model.layers} layers")
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
    from ..interop.profiles import measured_microbatch_size
    recorded = measured_microbatch_size(costs)
    if recorded is not None and given is not None and given != recorded:
        raise usage(f"--microbatch-size {given} disagrees with the profile {costs}, measured at microbatch size "
                    f"{recorded} (the runtime's --microbatch-size): leave it out, or profile again at {given}")
    if recorded is None and given is None:
        raise usage(f"the profile {costs} does not record its microbatch size: give --microbatch-size (the "
                    "runtime's --microbatch-size of the run that measured it; its default is 4)")
    return recorded if recorded is not None else given
def calibrate_file(out: str, ranks: int, threads: int, quick: bool, cluster_name: str | None,
                   costs: tuple[str, ...], model_files: tuple[str, ...], microbatch_size: int | None, tp: int,
                   recompute: str) -> str:
    """`schedc calibrate`: measure (or read --cluster), then fit to the profiles if given; write OUT.
    A fit is at the microbatch size each profile records (the runtime's --microbatch-size); a different
    --microbatch-size is refused, and one is needed for a profile that does not record it. One
    profile scales the compute rates; profiles at two or more sizes fit the rates and the overheads
    (fit_to_profiles). --model is given once for all the profiles or once per profile, in order."""
    from ..outputs import STDOUT, write_output
    if bool(costs) != bool(model_files) or (costs and len(model_files) not in (1, len(costs))):
        raise usage("--costs and --model go together: the profile and the model it ran (one --model for every "
                    "--costs, or one per --costs, in order)")
    if out == STDOUT:
        raise usage("calibrate writes a cluster file (which --cluster then reads): give -o a path, not -")
    if cluster_name is not None and not costs:  # it would measure nothing, fit nothing and write nothing
        raise usage("--cluster is the cluster to fit to a profile: give --costs and --model with it (or leave it "
                    "out to measure this machine)")
    report = []
    if cluster_name is None:
        from ..runtime.calibrate import calibrate  # torch, only here
        text, raw = calibrate(ranks, threads, quick)
        write_output(out, text)
        report.append("GEMM GFLOP/s by size " + ", ".join(f"{n}: {r / 1e9:.1f}" for n, r in raw["gemm_flops"].items()))
        report.append("memory-bound GB/s " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in raw["memory_bytes_per_s"].items()))
        report.append("messages s " + ", ".join(f"{k} {v:.3g}" for k, v in raw["comm_s"].items()))
        report.extend(raw["warnings"])
        cluster_name = out
    if costs:
        models = model_files * len(costs) if len(model_files) == 1 else model_files
        report.append(_fit(out, load_cluster(cluster_name), costs, models, microbatch_size, tp, recompute))
    report.append(f"wrote {out}: {_summary(load_cluster(out))}")
    return "\n".join(report)
def _fit(out: str, cluster, costs: tuple[str, ...], models: tuple[str, ...], microbatch_size: int | None, tp: int,
         recompute: str) -> str:
    """Fit the cluster to the profiles, write it to OUT; the report's line."""
    from pathlib import Path
    from .specs import dump_cluster
    from ..interop.profiles import load_costs
    from ..outputs import write_output
    runs = []
    for path, model_file in zip(costs, models):
        layout = Layout(tp=tp, microbatch_size=_profile_microbatch_size(path, microbatch_size), recompute=recompute)
        model = load_model_spec(model_file)
        check_layout(model, layout, model_file)
        runs.append((model, layout, load_costs(path)))
    names = ", ".join(Path(c).name for c in costs)
    if len(runs) == 1:
        fitted, factor = fit_to_profile(cluster, *runs[0])
        said, line = (f"measured F + B / predicted = {factor:.4g}; peak FLOP/s and memory bandwidth divided by it",
                      f"profile {costs[0]}: measured / predicted compute {factor:.4g}; rates scaled by {1 / factor:.4g}")
    else:
        fitted, slower, overhead = fit_to_profiles(cluster, runs)
        shown = ", ".join(f"{k} {v * 1e6:.4g}" for k, v in overhead.items())
        said = (f"measured = GEMM time x {slower['gemm']:.4g} + memory-bound time x {slower['memory']:.4g} + "
                f"overhead per layer: peak FLOP/s and memory bandwidth divided by those, [overhead] in "
                f"microseconds per layer")
        line = (f"profiles {names}: GEMMs {slower['gemm']:.4g}x, memory-bound kernels {slower['memory']:.4g}x the "
                f"microbenchmarks' time; overhead per layer (us) {shown}")
    fitted = replace(fitted, name=f"{cluster.name}, compute fitted to {names}")
    write_output(out, dump_cluster(fitted, f"{fitted.name}: {said}"))
    return line
def _summary(cluster) -> str:
    """What a written cluster file says, read back as --cluster will read it."""
    return (f"{cluster.name}: {cluster.gpus_per_node} per node, peak {cluster.peak_flops / 1e12:.4g} TFLOP/s "
            f"({cluster.dtype}), memory {cluster.memory_bytes / 2**30:.4g} GiB at {cluster.hbm_bandwidth / 1e9:.4g} GB/s, "
            f"messages {cluster.intra_bandwidth / 1e9:.4g} GB/s after {cluster.intra_latency * 1e6:.4g} us")
