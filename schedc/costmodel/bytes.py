"""Memory in bytes: parameters per stage, a layer's activations (Korthikanti et al. 2022), a backward's
working memory, and each device's total at its activation peak."""
from __future__ import annotations

from dataclasses import replace

from ..activations import Sizes, layer_bytes, megatron
from .specs import ClusterSpec, ModelSpec
from ..layout import Layout
from .hardware import stage_layers, DDP_BUCKET_BYTES_PER_PARAM, REPLICATED_BYTES_PER_PARAM, STATE_BYTES_PER_PARAM, STEP_GRADIENT_BYTES_PER_PARAM, Setting


def layer_params(model: ModelSpec, t: int) -> float:
    """Parameters of one layer on one GPU: the split weights over t, biases of the row-parallel GEMMs
    and the layer norms replicated."""
    h, f = model.hidden, model.ffn
    return (4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h


def stage_params(model: ModelSpec, t: int, stages: int, s: int) -> float:
    """Parameters of stage s on one GPU: its layers, the embedding (stage 0: words split over t,
    positions), the final layer norm and the tied word embedding's copy (the last stage)."""
    params = stage_layers(model, stages) * layer_params(model, t)
    words = model.vocab * model.hidden / t
    if s == 0:
        params += words + model.seq * model.hidden
    if s == stages - 1:
        params += 2 * model.hidden + (words if stages > 1 else 0.0)
    return params


def layer_activation_bytes(model: ModelSpec, layout: Layout) -> float:
    """Activation bytes one layer keeps per microbatch until its backward (Korthikanti et al. 2022,
    table 2, at 16 bits): sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34 + 5as/h)/t with
    sequence parallelism too; selective recomputation drops the 5as/h term; full recomputation keeps
    only the layer's input, 2sbh (2sbh/t with sequence parallelism). schedc/activations.py's table
    with Megatron's facts, at f = 4h as Korthikanti's table has it."""
    sizes = Sizes(model.seq, layout.microbatch_size, model.hidden, model.heads, 4 * model.hidden)
    return layer_bytes(sizes, megatron(model.width), layout.tp, layout.sequence_parallel, layout.recompute)


def working_bytes(model: ModelSpec, layout: Layout, last: bool) -> float:
    """Memory a backward needs on top of what is kept: one layer's full activations rebuilt by
    recomputation, and on the last stage the fp32 logits of the cross entropy (4·s·b·V/t)."""
    full = replace(layout, recompute="none")
    extra = layer_activation_bytes(model, full) if layout.recompute != "none" else 0.0
    if last:
        extra += 4 * model.seq * layout.microbatch_size * model.vocab / layout.tp
    return extra


def stage_holders(schedule) -> dict[int, list[int]]:
    """Per stage, the devices holding it (one per pipeline: two with Chimera's replicas)."""
    holders: dict[int, list[int]] = {}
    for pipe in schedule.pipelines:
        for s, d in enumerate(pipe.placement):
            holders.setdefault(s, []).append(d)
    return holders


def shards(lay: Layout, holders: dict[int, list[int]], s: int) -> int:
    """Over how many GPUs stage s's optimizer state is split: the d (times replicas) holding the
    stage with the distributed optimizer, else 1 (not sharded)."""
    return lay.dp * len(holders[s]) if lay.distributed_optimizer else 1


def device_memory(st: Setting, schedule, peaks) -> tuple[list[float], list[dict[str, float]]]:
    """Per device, bytes at its peak (device_bytes) under the setting's model, layout and cluster;
    peaks: the activation peaks in units (Timing.peak_memory)."""
    return device_bytes(st.model, st.layout, schedule, peaks, st.cluster)


def device_bytes(m: ModelSpec, lay: Layout, schedule, peaks, cluster: ClusterSpec | None = None
                 ) -> tuple[list[float], list[dict[str, float]]]:
    """Per device, bytes at its peak: weights, gradients and optimizer state of the stages it holds
    (with torch DDP, overlap_grad_reduce, its gradient buckets too; with the distributed optimizer the
    fp32 state and the step's gradients split over shards()), plus the larger of the backward's
    peak (the activations alive at the simulated peak, `peaks` in activation units per device: x layers
    per stage x bytes per layer, and the working memory of one backward) and the optimizer step's (the
    fp32 gradients it makes, after the last backward has freed every activation); then, on a cluster,
    what the allocator's fragmentation and the process outside it take (ClusterSpec.reserved_bytes).
    The one rule for memory in bytes: `simulate --cluster` and `check --model` (no cluster: the
    tensors only) both ask it."""
    stages = schedule.stages
    per_unit = stage_layers(m, stages) * layer_activation_bytes(m, lay)
    holders = stage_holders(schedule)
    # torch DDP's buckets: the distributed optimizer's reduce-scatter works on views of its gradient buffer
    buckets = DDP_BUCKET_BYTES_PER_PARAM if lay.overlap_grad_reduce and not lay.distributed_optimizer else 0
    totals, parts = [], []
    for d in range(schedule.devices):
        mine = sorted({s for s, ds in holders.items() if d in ds})
        state = step = 0.0
        for s in mine:
            params, k = stage_params(m, lay.tp, stages, s), shards(lay, holders, s)
            state += params * (REPLICATED_BYTES_PER_PARAM + buckets
                               + (STATE_BYTES_PER_PARAM - REPLICATED_BYTES_PER_PARAM) / k)
            step += STEP_GRADIENT_BYTES_PER_PARAM * params / k
        peak = peaks[d] if d < len(peaks) else 0.0
        act = peak * per_unit + working_bytes(m, lay, stages - 1 in mine)
        allocated = state + max(act, step)
        total = cluster.reserved_bytes(allocated) if cluster is not None else allocated
        parts.append({"weights_gradients_optimizer": state, "activations": act,
                      "optimizer_step": max(0.0, step - act), "allocator_and_context": total - allocated})
        totals.append(total)
    return totals, parts
