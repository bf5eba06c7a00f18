"""Memory in bytes: parameters per stage, a layer's activations (Korthikanti et al. 2022), a backward's
working memory, and each device's total at its activation peak."""
from __future__ import annotations

from dataclasses import replace

from .activations import FP8_BYTES, Facts, Sizes, layer_bytes, megatron
from .specs import ClusterSpec, ModelSpec
from .. import walk
from ..layout import Layout
from ..passes.memory import timed_model
from ..ops import OpKind
from ..descriptions.moe import attention_parameters, expert_parameters, moe_mlp_parameters
from .hardware import stage_layers, stage_mix, DDP_BUCKET_BYTES_PER_PARAM, REPLICATED_BYTES_PER_PARAM, STATE_BYTES_PER_PARAM, STEP_GRADIENT_BYTES_PER_PARAM, Setting


def layer_params(model: ModelSpec, t: int) -> float:
    """Parameters of one layer on one GPU: the split weights over t (Q and the projection h x h, K and V
    h x kv_hidden, the MLP's two or, SwiGLU, three h x f) with the column-parallel GEMMs' biases; the
    row-parallel GEMMs' biases and the norms replicated. GPT: (4h^2 + 2hf + 3h + f)/t + 6h."""
    h, f, kv = model.hidden, model.ffn, model.kv_hidden
    gated = model.mlp == "swiglu"
    split = attention_parameters(model) + (3 if gated else 2) * h * f
    norms = 2 * (2 * h if model.norm == "layernorm" else h)
    if model.bias == "all":
        return (split + h + 2 * kv + (2 * f if gated else f)) / t + (2 * h + norms)
    return (split + (model.q_hidden + 2 * kv if model.bias == "qkv" else 0)) / t + norms


def moe_layer_params(model: ModelSpec, t: int, ep: int, etp: int | None = None) -> float:
    """Parameters of one MoE layer on one GPU: the attention and norms as layer_params, the router
    whole, the shared experts split over t, and experts / ep routed experts, each split over etp
    (expert tensor parallelism; None: t, Megatron-Core's default)."""
    dense_mlp = (3 if model.mlp == "swiglu" else 2) * model.hidden * model.ffn
    routed = moe_mlp_parameters(model, 0)  # the router and the shared experts
    router = model.hidden * model.experts + (model.experts if model.router == "sigmoid" else 0)
    return (layer_params(model, t) - dense_mlp / t + (routed - router) / t + router
            + expert_layer_params(model, t if etp is None else etp, ep))


def expert_layer_params(model: ModelSpec, t: int, ep: int) -> float:
    """One MoE layer's routed experts on one GPU: experts / ep of them, each split over t; their state is
    sharded over the expert-data-parallel ranks, d x cp / ep (expert_shards)."""
    return model.experts // ep * expert_parameters(model) / t


def stage_expert_params(model: ModelSpec, layout: Layout, stages: int, s: int) -> float:
    """The routed experts' parameters of stage s on one GPU (0 without experts)."""
    if not model.moe:
        return 0.0
    return stage_mix(model, stages, layout)[s][1] * expert_layer_params(model, layout.expert_tp, layout.ep)


def stage_params(model: ModelSpec, t: int, stages: int, s: int, layout: Layout | None = None) -> float:
    """Parameters of stage s on one GPU: its layers (the layout's split), the embedding (stage 0: words
    split over t, positions), the final layer norm and the tied word embedding's copy (the last stage);
    an MoE model's dense and MoE layers (stage_mix: the MTP blocks on the last stage) apart."""
    if model.moe:
        dense, routed = stage_mix(model, stages, layout)[s]
        ep = layout.ep if layout is not None else 1
        params = dense * layer_params(model, t) + routed * moe_layer_params(model, t, ep, layout and layout.etp)
    else:
        params = stage_layers(model, stages, layout)[s] * layer_params(model, t)
    words = model.vocab * model.hidden / t
    if s == 0:
        params += words + model.position_rows * model.hidden
    if s == stages - 1:  # the final norm; the output layer (vocabulary-parallel), or the tied copy
        norm = 2 * model.hidden if model.norm == "layernorm" else model.hidden
        params += norm + (words if stages > 1 or not model.tied_embeddings else 0.0)
    return params


def layer_activation_bytes(model: ModelSpec, layout: Layout) -> float:
    """Activation bytes one layer keeps per microbatch until its backward (Korthikanti et al. 2022,
    table 2, at 16 bits): sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34 + 5as/h)/t with
    sequence parallelism too; selective recomputation drops the 5as/h term; full recomputation keeps
    only the layer's input, 2sbh (2sbh/t with sequence parallelism); with context parallelism s is the
    s/cp tokens a GPU holds. schedc/costmodel/activations.py's table
    with Megatron's facts, at f = 4h as Korthikanti's table has it; a flash attention kernel (the
    model's `attention`) keeps no scores but their fp32 log-sum-exp (Facts.scores); an MoE model at the
    width its tokens' experts take (moe_width), with the top_k - 1 more copies of each token its experts
    keep as their input (split over t: sequence parallelism, as Megatron-Core runs MoE with t > 1)."""
    sizes, facts = activation_sizes(model, layout)
    kept = layer_bytes(sizes, facts, layout.tp, layout.sequence_parallel, layout.recompute)
    if model.moe and layout.recompute != "full":  # the experts' inputs: top_k copies of each token, not one
        width = FP8_BYTES if layout.fp8 else model.width  # Transformer Engine keeps a GEMM's FP8 input
        kept += width * (model.top_k - 1) * sizes.seq * sizes.batch * model.hidden / layout.tp
    if model.mla and layout.recompute != "full":
        kept += model.width * sizes.seq * sizes.batch * mla_extra_values(model, layout.tp)
    return kept


def mla_extra_values(model: ModelSpec, t: int) -> float:
    """Values per token latent attention keeps beyond what the table counts for its attention (Q and the
    output h wide, K and V kv_hidden): Q and K heads x (nope + rope) wide, V and the output heads x v,
    over t, and the latents the up-projections read, q_lora_rank and kv_lora_rank + rope, whole.

        DeepSeek-V3, t 1: 2·(24576 - 7168) + 2·(16384 - 7168) + 1536 + 576 = 55,360 values a token
    """
    qk = model.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
    v = model.heads * model.v_head_dim
    wider = (qk - model.hidden) + (qk - model.kv_hidden) + (v - model.kv_hidden) + (v - model.hidden)
    return wider / t + model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim


def activation_sizes(model: ModelSpec, layout: Layout) -> tuple[Sizes, Facts]:
    """The activation table's sizes and facts for a model: Megatron's GPT as Korthikanti counts it (f =
    4h, dropout); a Llama-family model (grouped-query attention, SwiGLU, no dropout) at its own ffn."""
    if model.family in ("gpt", "gpt2") and model.mlp == "gelu":
        sizes = Sizes(model.seq // layout.cp, layout.microbatch_size, model.hidden, model.heads, 4 * model.hidden)
        return sizes, replace(megatron(model.width), scores=not model.flash, fp8_inputs=layout.fp8)
    sizes = Sizes(model.seq // layout.cp, layout.microbatch_size, model.hidden, model.heads, moe_width(model),
                  model.vocab, model.kv_heads)
    facts = Facts(value_bytes=model.width, mask_bytes=0, scores=not model.flash, gated=model.mlp == "swiglu",
                  stat_values=1 if model.norm == "rmsnorm" else 2, fp8_inputs=layout.fp8)
    return sizes, facts


def moe_width(model: ModelSpec) -> int:
    """The MLP width a token's activations take in every layer: ffn for a dense model; an MoE model's
    top_k routed experts' and its shared experts' widths together (DeepSeek-V3: 8·2048 + 2048 = 18432,
    its dense layers' ffn too; Mixtral 8x7B: 2·14336), the dispatched copies of the tokens aside."""
    if not model.moe:
        return model.ffn
    return model.top_k * model.moe_ffn + model.shared_experts * model.shared_width


def deferred_weight_bytes(model: ModelSpec, layout: Layout) -> float:
    """Bytes one layer holds for a deferred W, from the end of its I until W (Qi et al. 2024, section
    2: W needs the inputs of the weight GEMMs and their output gradients): the inputs of QKV and the
    MLP's first GEMM (s·b·h each, replicated over t but with sequence parallelism), of the projection
    (s·b·h/t) and of the MLP's second GEMM (s·b·f/t); the output gradients of QKV (3s·b·h/t), of the
    MLP's first GEMM (s·b·f/t), of the projection and the MLP's second GEMM (s·b·h each, replicated).
    At 16 bits, f = 4h, t = 1: 32·s·b·h, the paper's M_W, whatever the recomputation (I has rebuilt
    what W reads)."""
    s, b, h, f, t, w = model.seq // layout.cp, layout.microbatch_size, model.hidden, model.ffn, layout.tp, model.width
    replicated = t if layout.sequence_parallel else 1
    fc1 = 2 * f if model.mlp == "swiglu" else f  # a SwiGLU's first GEMM makes gate and up
    inputs = 2 * h / replicated + h / t + f / t
    gradients = (h + 2 * model.kv_hidden) / t + fc1 / t + 2 * h / replicated
    if layout.fp8:  # the inputs kept as their FP8 casts (activations.py), the gradients at 16 bits
        return s * b * (FP8_BYTES * inputs + w * gradients)
    return w * s * b * (inputs + gradients)


def layer_changes(schedule) -> dict[str, tuple[int, int]]:
    """What each op kind does to its stage's layers' activations, per layer, as (forward activations,
    deferred W's): F allocates its activations and B frees them; with a split (or mixed) backward I
    frees them and allocates what W reads (deferred_weight_bytes), which W frees."""
    changes = {OpKind.F.value: (1, 0), OpKind.B.value: (-1, 0)}
    if schedule.split_backward or schedule.mixed_backward:
        changes.update({OpKind.I.value: (-1, 1), OpKind.W.value: (0, -1)})
    return changes


def activation_deltas(model: ModelSpec, layout: Layout, schedule) -> dict[str, tuple[tuple[float, float], ...]]:
    """What each op kind allocates (+) or frees (-) on its device, per stage (its layers x one layer's),
    as (forward activations, deferred W's) bytes: each kind's change (layer_changes) times its stage's
    bytes (stage_backward_bytes; under full recomputation what W reads is more than F kept)."""
    held = stage_backward_bytes(model, layout, schedule.stages)
    k = schedule.chunks  # a sequence chunk's op holds 1/k of its microbatch's bytes
    return {kind: tuple((f * kept / k, w * deferred / k) for kept, deferred in held)
            for kind, (f, w) in layer_changes(schedule).items()}


def layer_levels(schedule, split: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    """Per device, the layers whose activations are alive after each op of its program order that
    changes them, as (forward's, deferred W's) (layer_changes, each stage's layers in `split`)."""
    table = {kind: tuple((f * n, w * n) for n in split) for kind, (f, w) in layer_changes(schedule).items()}
    out = []
    for order in schedule.orders:
        changes = walk.changes_along(order, table)
        out.append(list(zip(walk.levels(f for f, _ in changes), walk.levels(w for _, w in changes))))
    return out


_LEVELS: dict[int, tuple] = {}  # id(orders) -> (orders, (split, changes), distinct levels); distinct_levels
_LEVELS_MAX = 256


def distinct_levels(schedule, split: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    """layer_levels with each device's repeats dropped, in the order they first occur (the first level
    with the most bytes is the same), kept per order: `schedc tune` asks for one order's peaks under
    many layouts (t, b, recomputation), each a walk over 10^4 ops. Kept by identity, the orders held
    so that their id is not reused; the table is emptied when full."""
    key = (split, tuple(layer_changes(schedule).items()))
    entry = _LEVELS.get(id(schedule.orders))
    if entry is None or entry[0] is not schedule.orders or entry[1] != key:
        if len(_LEVELS) >= _LEVELS_MAX:
            _LEVELS.clear()
        levels = [list(dict.fromkeys(device)) for device in layer_levels(schedule, split)]
        entry = _LEVELS[id(schedule.orders)] = (schedule.orders, key, levels)
    return entry[2]


def stage_backward_bytes(model: ModelSpec, layout: Layout, stages: int) -> tuple[tuple[float, float], ...]:
    """Per stage, (the bytes its F keeps until the backward, the bytes its deferred W holds from the end
    of I until W): its layers (the layout's split) x layer_activation_bytes and deferred_weight_bytes.
    The one rule for both: the compile's memory (activation_deltas) and `tune --synthesize`'s charges
    (synthesize.problem.bytes_held) ask it."""
    kept, deferred = layer_activation_bytes(model, layout), deferred_weight_bytes(model, layout)
    return tuple((n * kept, n * deferred) for n in stage_layers(model, stages, layout))


def activation_peak_parts(model: ModelSpec, layout: Layout, schedule) -> list[tuple[float, float]]:
    """Per device, (activation bytes at its peak, of which deferred W's) along its own program order (a
    device runs one op at a time, as memory.peak_memory walks it): the first of its levels
    (layer_levels) with the most bytes, a forward's layer at layer_activation_bytes, a deferred W's at
    deferred_weight_bytes (two chunks of a V each at their stage's layers); with k sequence chunks a
    microbatch (Seq1F1B) each chunk's op at 1/k of them, so the k chunks of a microbatch hold what it
    holds whole."""
    k = schedule.chunks
    kept, deferred = layer_activation_bytes(model, layout) / k, deferred_weight_bytes(model, layout) / k
    out = []
    for levels in distinct_levels(schedule, stage_layers(model, schedule.stages, layout)):
        peak = (0.0, 0.0)
        for forward, held in levels:
            total = forward * kept + held * deferred
            if total > peak[0]:
                peak = (total, held * deferred)
        out.append(peak)
    return out


def activation_peaks(model: ModelSpec, layout: Layout, schedule, peaks) -> tuple[float, ...]:
    """Per device, the bytes of activations alive at its peak (activation_peak_parts). A schedule with
    tasks or other memory declarations (the timed memory model) takes `peaks`, its activation units,
    times the bytes of its largest stage; a schedule's shape without its order (the search's bounds)
    holds none."""
    if not schedule.orders:
        return (0.0,) * schedule.devices
    if not timed_model(schedule):
        return tuple(peak for peak, _ in activation_peak_parts(model, layout, schedule))
    per_unit = max(stage_layers(model, schedule.stages, layout)) * layer_activation_bytes(model, layout)
    return tuple((peaks[d] if d < len(peaks) else 0.0) * per_unit for d in range(schedule.devices))


def working_bytes(model: ModelSpec, layout: Layout, last: bool) -> float:
    """Memory a backward needs on top of what is kept: what recomputation rebuilds of one layer (full:
    the layer's activations; selective: the attention core it dropped, so selective never holds more
    than none; selective-ops: what none keeps beyond the per-op policy's), and on the last stage the fp32 logits of the cross entropy (4·s·b·V/t)."""
    whole = layer_activation_bytes(model, replace(layout, recompute="none"))
    extra = 0.0
    if layout.recompute == "full":
        extra = whole
    elif layout.recompute in ("selective", "selective-ops"):  # what the layer's recomputation rebuilds
        extra = max(0.0, whole - layer_activation_bytes(model, layout))
    if last:
        extra += 4 * (model.seq // layout.cp) * layout.microbatch_size * model.vocab / layout.tp
    return extra


def stage_holders(schedule) -> dict[int, list[int]]:
    """Per stage, the devices holding it (one per pipeline: two with Chimera's replicas)."""
    holders: dict[int, list[int]] = {}
    for pipe in schedule.pipelines:
        for s, d in enumerate(pipe.placement):
            holders.setdefault(s, []).append(d)
    return holders


def shards(lay: Layout, holders: dict[int, list[int]], s: int) -> int:
    """Over how many GPUs stage s's optimizer state is split: the d x cp (times replicas) holding the
    stage from ZeRO level 1 (the distributed optimizer) up, else 1 (not sharded)."""
    return lay.dp * lay.cp * len(holders[s]) if lay.sharding else 1


def expert_shards(lay: Layout, k: int) -> int:
    """Over how many GPUs the routed experts' optimizer state is split, the stage's being split k ways
    (shards()): the expert-data-parallel ranks, k·t / (etp·ep) (Megatron-Core's MoE parallel folding: the
    expert layout etp x ep x edp over the stage's t x cp x d ranks), k / ep with etp = t; 1 unsharded."""
    return max(1, k * lay.tp // (lay.expert_tp * lay.ep))


WEIGHT_BYTES_PER_PARAM = 2  # the 16-bit weight: what ZeRO-2 keeps whole, ZeRO-3 gathers while a stage computes


def sharded_state_bytes(params: float, level: int, k: int) -> float:
    """Weights, gradients and optimizer state of `params` parameters sharded k ways at ZeRO `level` 2
    or 3 (16 bytes a parameter, STATE_BYTES_PER_PARAM): level 2 keeps the 16-bit weight whole, 2 + 14/k;
    level 3 shards all of it, 16/k."""
    kept = WEIGHT_BYTES_PER_PARAM if level == 2 else 0
    return params * (kept + (STATE_BYTES_PER_PARAM - kept) / k)


def in_use_bytes(level: int, params: list[float], block: tuple[float, int] | None = None,
                 reshard: bool = True) -> float:
    """What ZeRO level 2 or 3 holds whole while a device's stages compute (`params`: each stage's):
    at level 3 the gathered 16-bit weights of its stages (under a pipeline a backward leaves its stage
    gathered, so at the activation peak every stage the device holds is), and at both levels one
    stage's 16-bit gradients until they are reduce-scattered. Without a pipeline (`block`: one
    transformer layer's parameters, FSDP's unit) FSDP2 gathers layer by layer: resharding, the root's
    own (embedding, final norm, output layer: in use from the first forward to the last backward)
    plus two layers (the one computing and the next, prefetched); a layer's gradients are
    reduce-scattered as its backward makes them."""
    if block is None:
        gathered = WEIGHT_BYTES_PER_PARAM * sum(params) if level == 3 else 0.0
        return gathered + WEIGHT_BYTES_PER_PARAM * max(params, default=0.0)
    whole, layers = params[0], block[1]
    root = whole - layers * block[0]
    gathered = whole if not reshard else root + min(2, layers) * block[0]
    return WEIGHT_BYTES_PER_PARAM * ((gathered if level == 3 else 0.0) + block[0])


def device_memory(st: Setting, schedule, peaks, held: tuple | None = None) -> tuple[list[float], list[dict[str, float]]]:
    """Per device, bytes at its peak (device_bytes) under the setting's model, layout and cluster;
    peaks: the activation peaks in units (Timing.peak_memory); held: held_bytes of the same model,
    layout and schedule, when the caller keeps it (schedc tune, per placement)."""
    return device_bytes(st.model, st.layout, schedule, peaks, st.cluster, held)


def device_bytes(m: ModelSpec, lay: Layout, schedule, peaks, cluster: ClusterSpec | None = None,
                 held: tuple | None = None) -> tuple[list[float], list[dict[str, float]]]:
    """Per device, bytes at its peak: weights, gradients and optimizer state of the stages it holds
    (held_bytes), plus the larger of the backward's
    peak (the activations alive at the peak of its own order, activation_peaks; `peaks`, the activation
    units per device, for a schedule the timed memory model times; and the working memory of one
    backward) and the optimizer step's (the
    fp32 gradients it makes, after the last backward has freed every activation); then, on a cluster,
    what the allocator's fragmentation and the process outside it take (ClusterSpec.reserved_bytes).
    The one rule for memory in bytes: `simulate --cluster` and `check --model` (no cluster: the
    tensors only) both ask it."""
    alive = activation_peaks(m, lay, schedule, peaks)
    working = [working_bytes(m, lay, last) for last in (False, True)]
    totals, parts = [], []
    for d, (state, step, last) in enumerate(held_bytes(m, lay, schedule) if held is None else held):
        act = alive[d] + working[last]
        allocated = state + max(act, step)
        total = cluster.reserved_bytes(allocated) if cluster is not None else allocated
        parts.append({"weights_gradients_optimizer": state, "activations": act,
                      "optimizer_step": max(0.0, step - act), "allocator_and_context": total - allocated})
        totals.append(total)
    return totals, parts


def held_bytes(m: ModelSpec, lay: Layout, schedule) -> tuple[tuple[float, float, bool], ...]:
    """Per device, what its stages hold whatever its order: (weights, gradients and optimizer state;
    the optimizer step's fp32 gradients; whether it holds the last stage). With torch DDP,
    overlap_grad_reduce, its gradient buckets too; with the distributed optimizer the fp32 state and
    the step's gradients split over shards(). It reads the schedule's stages and placements, and of
    the layout t, the layer split, the two switches and (sharded) d: not b, m or recomputation."""
    stages = schedule.stages
    holders = stage_holders(schedule)
    # torch DDP's buckets: the distributed optimizer's reduce-scatter works on views of its gradient buffer
    buckets = DDP_BUCKET_BYTES_PER_PARAM if lay.overlap_grad_reduce and not lay.sharding else 0
    held: list[set[int]] = [set() for _ in range(schedule.devices)]  # per device, the stages it holds
    for s, ds in holders.items():
        for d in ds:
            held[d].add(s)
    stage_bytes = {}  # per stage: (weights, gradients and optimizer state; the step's gradients; parameters)
    for s in sorted(holders):
        params, k = stage_params(m, lay.tp, stages, s, lay), shards(lay, holders, s)
        experts, k_experts = stage_expert_params(m, lay, stages, s), expert_shards(lay, k)
        state = _state_bytes(params - experts, lay, k, buckets) + _state_bytes(experts, lay, k_experts, buckets)
        step = STEP_GRADIENT_BYTES_PER_PARAM * (params - experts) / k + STEP_GRADIENT_BYTES_PER_PARAM * experts / k_experts
        stage_bytes[s] = (state, step, params)
    out = []
    for d in range(schedule.devices):
        mine = sorted(held[d])
        state = step = 0.0
        for s in mine:
            state += stage_bytes[s][0]
            step += stage_bytes[s][1]
        if lay.sharding >= 2:
            block = (layer_params(m, lay.tp), stage_layers(m, stages, lay)[0]) if stages == 1 else None
            state += in_use_bytes(lay.sharding, [stage_bytes[s][2] for s in mine], block, lay.reshard_after_forward)
        out.append((state, step, stages - 1 in mine))
    return tuple(out)


def _state_bytes(params: float, lay: Layout, k: int, buckets: float) -> float:
    """Weights, gradients and optimizer state of `params` sharded k ways (1: not sharded) at the layout's
    ZeRO level (held_bytes): the routed experts' over d x cp / ep, the rest over d x cp."""
    if lay.sharding >= 2:
        return sharded_state_bytes(params, lay.sharding, k)
    return params * (REPLICATED_BYTES_PER_PARAM + buckets + (STATE_BYTES_PER_PARAM - REPLICATED_BYTES_PER_PARAM) / k)
