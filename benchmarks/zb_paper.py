"""The zero bubble paper's measurements (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, table 4
and figure 5): predicted samples per GPU per second and peak memory of 1F1B, ZB-1p and ZB-2p next to the
measured ones, with the errors, on the paper's machine (schedc/clusters/a100-80gb-roce.toml, the
dgx-a100-80gb constants that Megatron-LM's Table 1 is predicted with: one constant set).

The rows: 8 GPUs, pure pipeline parallelism (p = 8, t = d = 1), sequence 1,024, no recomputation, fp16,
the model's layers plus the embedding and the output layer split evenly over the stages (22 + 2 = 3 x 8:
stages of 2, 3, ..., 3, 2 layers; the repository's --allow-padding-num-layers), m = 24, 32 and 64
microbatches. ZB-1p and ZB-2p are automatic, as the paper's are: the order `schedc tune --synthesize
--model M --cluster C` finds for the cost model's own F, I and W of each stage under a limit of p and 2p
microbatches' activations (--activation-limit 8, 16), counted as the paper's scheduler counts them (its mem_f until I, then mem_w = 32h until
W; it does the same with profiled times). They run on the zero bubble repository's runtime, whose
launch script turns on the optimizer's post-validation with zero bubble in fp16: no all-reduce before
the optimizer step, so a device starts its next step once its own is done and the steps overlap; their
iteration is that steady step's (`schedc simulate --cluster ... --post-validation`). 1F1B is Megatron-LM's, synchronized at every step.
The hand-made shapes (zb_h1; zb_2p, ZB-H2's shape under ZB-2p's limit of 2p) and the newer schedules
(interleaved zero bubble, ZB-V, V-Half, V-Min, DualPipe and DualPipeV) are predicted on the same rows,
one step alone, each with its activations against 1F1B's; the newer ones run on 2p half stages (the
V's and interleaving's chunks) or on two copies of the model (DualPipe).

Measured memory is read as GiB of torch's max_memory_allocated: the paper does not name its counter,
but the zero bubble repository measures memory with that one everywhere it does (its
--measure-activation-memory and its scheduler's free-memory estimate; Megatron-LM's report_memory
prints it in MiB beside the reserved counters). So the error the targets count is the most loaded
GPU's allocated bytes (its tensors: weights, gradients, optimizer state, activations and the step's
transients); its reserved estimate, with the cluster's allowance for the allocator's fragmentation and
the CUDA context (what `schedc simulate --cluster` holds against the GPU's memory), is printed beside it.

    python benchmarks/zb_paper.py        # the table, then the errors' summary
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from schedc.costmodel import Setting  # noqa: E402
from schedc.costmodel.bytes import activation_peaks  # noqa: E402
from schedc.costmodel.specs import load_cluster, load_cluster_model  # noqa: E402
from schedc.driver.cluster import compile_for  # noqa: E402
from schedc.layout import Layout  # noqa: E402
from schedc.synthesize.cluster import OnCluster  # noqa: E402
from schedc.synthesize.options import run_tune  # noqa: E402
from schedc.text import GIB  # noqa: E402

CLUSTER = "a100-80gb-roce"
P = 8
MICROBATCHES = (24, 32, 64)
# name in the paper -> (schedule, extra params)
AUTOMATIC = "automatic"  # synthesized for the row's costs (automatic()); its param: the limit in units of p
MEASURED_SCHEDULES = {"1F1B": ("1f1b", {}), "ZB-1p": (AUTOMATIC, {"limit": 1}), "ZB-2p": (AUTOMATIC, {"limit": 2})}
NEWER = {"zb_h1": ("zb_h1", {}), "zb_2p": ("zb_2p", {}), "interleaved_zb": ("interleaved_zb", {"v": 2}), "zbv": ("zbv", {}), "v_half": ("v_half", {}),
         "v_min": ("v_min", {}), "dualpipe": ("dualpipe", {}), "dualpipev": ("dualpipev", {})}
# model file, microbatch size, per schedule: samples/GPU/s at m = 24, 32, 64 and peak memory (GB)
ROWS = [
    ("zb-1.5b", 6, {"1F1B": ((11.8, 12.5, 13.6), 30), "ZB-1p": ((12.9, 13.4, 14.2), 32),
                    "ZB-2p": ((14.5, 14.8, 14.9), 59)}),
    ("zb-6.2b", 3, {"1F1B": ((3.50, 3.70, 4.03), 39), "ZB-1p": ((3.88, 4.00, 4.20), 42),
                    "ZB-2p": ((4.32, 4.35, 4.39), 70)}),
]
TARGETS = {"throughput": 0.10, "gain": 0.03, "memory": 0.15}


def layout(b: int, m: int) -> Layout:
    """The paper's runs: p = 8 only, no recomputation, blocking sends as Megatron-LM's, the embedding and
    the output layer counted as a layer each in the split."""
    return Layout(microbatch_size=b, global_batch=b * m, recompute="none", blocking_p2p=True,
                  account_for_embedding=True, account_for_loss=True)


def automatic(model: str, cluster: str, b: int, m: int, limit: int, folder: Path) -> str:
    """ZB-1p (limit 1) or ZB-2p (limit 2) as a user makes it: `schedc tune --synthesize --model M
    --cluster C -D p=8 -D m=M --activation-limit (limit x p)` with the row's layout, the order for the
    stages' F, I and W in seconds (blocking sends included), activations counted as the paper's
    scheduler counts them (a forward's M_B until its I, then its deferred W's M_W until W); the path of
    the .sched file written."""
    path = folder / f"zb_{limit}p_{model}_m{m}.sched"
    made = run_tune({"p": str(P), "m": str(m)}, (), 0.0, str(limit * P), str(path),
                    on_cluster=OnCluster(model_file(model), cluster, layout(b, m)))
    assert made.ok, made.report
    return str(path)


def model_file(name: str) -> str:
    return str(HERE.parent / "schedc" / "models" / f"{name}.toml")


def predict(schedule: str, params: dict, name: str, cluster: tuple, b: int, m: int):
    """(samples per GPU per second, peak GiB of the most loaded GPU, its activations' GiB, the prediction,
    the bubble). An automatic row runs as zero bubble's runtime runs it, with the optimizer's
    post-validation (`--post-validation`): its iteration is the steady step's, two steps' makespan less
    one step's, plus one step's tail. `cluster`: its name (or file) and its description."""
    given, cluster = cluster
    model = load_cluster_model(model_file(name), cluster)
    if schedule == AUTOMATIC:
        st = Setting(model, cluster, replace(layout(b, m), post_validation=True))
        with tempfile.TemporaryDirectory() as folder:  # a synthesized order has its sizes written in
            on = compile_for(automatic(name, given, b, m, params["limit"], Path(folder)), {}, st, lower=False)
    else:
        st = Setting(model, cluster, layout(b, m))
        on = compile_for(schedule, {k: str(v) for k, v in {"p": P, **params}.items()}, st, lower=False)
    pred = on.prediction
    samples = pred.global_batch / (pred.iteration_s * pred.gpus)
    activations = max(activation_peaks(model, st.layout, on.compiled.schedule, ()))
    return samples, pred.memory_bytes / GIB, activations / GIB, pred, pred.extra["bubble"]


def measured_table(cluster) -> dict[str, list[float]]:
    """Print the measured schedules' rows; return the errors by kind."""
    errors: dict[str, list[float]] = {"throughput": [], "gain": [], "memory": []}
    print(f"{'model':<8} {'schedule':<8} {'m':>3}  {'samples/GPU/s':>13} {'measured':>8} {'error':>7}  "
          f"{'gain':>6} {'measured':>8} {'diff':>6}  {'allocated':>9} {'measured':>8} {'error':>7}  "
          f"{'reserved':>8} {'error':>7}  bubble")
    for name, b, measured in ROWS:
        base: dict[int, float] = {}
        for label, (schedule, params) in MEASURED_SCHEDULES.items():
            speeds, memory = measured[label]
            for m, speed in zip(MICROBATCHES, speeds):
                samples, gib, _, pred, bubble = predict(schedule, params, name, cluster, b, m)
                error = samples / speed - 1
                errors["throughput"].append(abs(error))
                base.setdefault(m, samples)
                gain = samples / base[m] - 1
                measured_gain = speed / measured["1F1B"][0][MICROBATCHES.index(m)] - 1
                gain_text = ""
                if label != "1F1B":
                    errors["gain"].append(abs(gain - measured_gain))
                    gain_text = f"{100 * gain:>+5.1f}% {100 * measured_gain:>+7.1f}% {100 * (gain - measured_gain):>+5.1f}"
                memory_text = ""
                if m == MICROBATCHES[0]:
                    tensors = (pred.memory_bytes - pred.memory_parts["allocator_and_context"]) / GIB
                    memory_error = tensors / memory - 1
                    errors["memory"].append(abs(memory_error))
                    memory_text = (f"{tensors:>9.1f} {memory:>8} {100 * memory_error:>+6.1f}%  {gib:>8.1f} "
                                   f"{100 * (gib / memory - 1):>+6.1f}%")
                print(f"{name:<8} {label:<8} {m:>3}  {samples:>13.2f} {speed:>8.2f} {100 * error:>+6.1f}%  "
                      f"{gain_text:<22}  {memory_text:<44}  {bubble:.3f}")
    return errors


def newer_table(cluster) -> None:
    """The newer schedules on the same rows: predicted only, activations against 1F1B's."""
    print(f"\n{'model':<8} {'schedule':<15} {'m':>3}  {'samples/GPU/s':>13} {'vs 1F1B':>8}  {'memory GiB':>10}  "
          f"{'activations GiB':>15} {'vs 1F1B':>8}")
    for name, b, _ in ROWS:
        for m in MICROBATCHES:
            base, _, base_act, _, _ = predict("1f1b", {}, name, cluster, b, m)
            for label, (schedule, params) in NEWER.items():
                samples, gib, act, _, _ = predict(schedule, params, name, cluster, b, m)
                print(f"{name:<8} {label:<15} {m:>3}  {samples:>13.2f} {samples / base:>8.3f}  {gib:>10.1f}  "
                      f"{act:>15.1f} {act / base_act:>8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default=CLUSTER, help="cluster name or file (default %(default)s)")
    parser.add_argument("--no-newer", action="store_true", help="only the paper's measured schedules")
    args = parser.parse_args()
    cluster = (args.cluster, load_cluster(args.cluster))
    errors = measured_table(cluster)
    if not args.no_newer:
        newer_table(cluster)
    print()
    for kind, values in errors.items():
        within = sum(v <= TARGETS[kind] for v in values)
        unit = "points" if kind == "gain" else "%"
        print(f"{kind}: mean {100 * sum(values) / len(values):.1f} {unit}, max {100 * max(values):.1f} {unit}; "
              f"{within} of {len(values)} within {100 * TARGETS[kind]:.0f} {unit}")


if __name__ == "__main__":
    main()
