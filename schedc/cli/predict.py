"""A prediction in words: the lines under a schedule's summary (the compile for a cluster is the
driver's, schedc/driver/cluster.py)."""
from __future__ import annotations

from ..layout import Layout, switches_on
from ..text import gib, rate
from ..text import memory_more
from ..costmodel.fit import sharding_words


_LABELS = {"data_parallel_comm_s": "gradient all-reduce"}  # over d, and the tied embedding's between the end stages
def summary(on) -> str:  # a driver.cluster.OnCluster
    """The prediction as a few lines under the schedule's summary."""
    p, lay = on.prediction, on.setting.layout
    b = p.breakdown
    parts = p.memory_parts
    lines = [f"  on {on.setting.cluster.name}: {p.gpus} GPUs (t={lay.tp}, p={on.compiled.schedule.devices}, "
             f"d={lay.dp}{sharding_words(lay)}), b={lay.microbatch_size}, global batch {p.global_batch}, "
             f"recompute {lay.recompute}" + "".join(f", {text}" for text in switches_on(lay)),
             f"  iteration_s {p.iteration_s:.4f}  tflops_per_gpu {rate(p.tflops_per_gpu)}  "
             f"peak_fraction {p.peak_fraction:.3f}",
             f"  parameters {p.extra['parameters']:,} ({p.extra['parameters'] / 1e9:.2f}e9)  mfu "
             f"{p.extra['mfu']:.3f} (model TFLOP/s per GPU {rate(p.extra['model_tflops_per_gpu'])}, recomputation "
             "not counted, of the 16-bit peak)",
             f"  memory_gib_per_gpu {gib(p.memory_bytes)} (weights+gradients+optimizer "
             f"{gib(parts['weights_gradients_optimizer'])}, activations {gib(parts['activations'])}, "
             f"{memory_more(parts)})",
             "  breakdown (s): " + "  ".join(f"{_label(k, lay)} {v:.4f}" for k, v in b.items())]
    return "\n".join(lines)
def _label(key: str, lay: Layout) -> str:
    """A breakdown part in words: the data-parallel exchange as what it is under the layout."""
    if key == "data_parallel_comm_s" and lay.sharding >= 2:
        return "zero gathers and reduce-scatters exposed"
    if key == "data_parallel_comm_s" and lay.distributed_optimizer:
        return "gradient reduce-scatter + all-gather"
    return _LABELS.get(key, key[:-2].replace("_", " "))
