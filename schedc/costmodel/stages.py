"""Per-stage op costs in seconds: a transformer layer's forward, backward (input and weight gradients) and
recomputation by part (compute, tensor-parallel communication), the embedding on the first stage, the
logits and loss on the last."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..descriptions.facts import window_share
from ..ops import OVERLAP, cost_range, feeds, in_cost_range
from .activations import op_matmuls
from .attention import kernel_ring_exposed, kernel_terms
from .bytes import activation_sizes, layer_params
from .experts import moe_layer_parts
from .hardware import stage_layers, stage_mix, ATTENTION_ELEMENTWISE, B, CROSS_ENTROPY_BYTES, ELEMENTWISE, F, FP8_AMAX_BYTES, FP8_CAST_BYTES, GRAD_ACCUMULATION, I, R, TRANSPOSES, W, message_times, Part, Setting


@dataclass(frozen=True)
class StageCosts:
    """Per stage, the parts of F, B, I and W (B = I + W) of one microbatch."""

    parts: dict[str, tuple[Part, ...]]

    def costs(self) -> dict[str, tuple[float, ...]]:
        """kind -> per-stage seconds, as a costs table for elaborate.Options (FB: F and B as one op,
        overlapped_pair)."""
        table = {kind: tuple(p.total for p in parts) for kind, parts in self.parts.items()}
        table[OVERLAP] = tuple(overlapped_pair(f, b).total for f, b in zip(self.parts[F], self.parts[B]))
        return table


def overlapped_pair(forward: Part, backward: Part) -> Part:
    """A forward and a backward run as one overlapped op (DualPipe's F & B, DeepSeek-V3 section 3.2.1):
    their computation at the sum; each one's communication that runs on its own stream and link while
    the other half computes (the pipeline's point-to-point messages, the experts' all-to-alls) hidden behind the other's
    computation, never more than that computation, and only what outlasts it exposed. Tensor-parallel
    collectives stay exposed: they sit between dependent GEMMs in their own half's stream and take the
    SMs the other half would compute on (DeepSeek-V3 and Megatron-Core's combined 1F1B overlap the
    expert all-to-all and the pipeline's messages, not tensor parallelism's collectives).

        F = Part(3, p2p=1), B = Part(6, p2p=2)  ->  FB = Part(9): both messages hidden
        F = Part(1, p2p=4), B = Part(2)         ->  FB = Part(3, p2p=2): F's 4 behind B's 2, 2 left
        F = Part(3, tp=1),  B = Part(6, tp=2)   ->  FB = Part(9, tp=3): collectives not hidden
        F = Part(3, a2a=4), B = Part(6, a2a=4)  ->  FB = Part(9, a2a=1): expert parallelism's all-to-alls
                                                    (DeepSeek-V3's dispatch and combine) hide alike, after
                                                    the pipeline's messages; what outlasts stays exposed
    """
    exposed = (max(0.0, forward.p2p + forward.cp - backward.compute)
               + max(0.0, backward.p2p + backward.cp - forward.compute))  # the ring's sends: own stream
    if not (forward.a2a or backward.a2a):
        return Part(forward.compute + backward.compute, forward.tp + backward.tp, exposed)
    a2a = (max(0.0, forward.a2a - max(0.0, backward.compute - forward.p2p - forward.cp))
           + max(0.0, backward.a2a - max(0.0, forward.compute - backward.p2p - backward.cp)))
    return Part(forward.compute + backward.compute, forward.tp + backward.tp, exposed, a2a=a2a)


def layer_parts(st: Setting) -> dict[str, Part]:
    """One transformer layer, one microbatch: forward F, input-gradient I, weight-gradient W, and the
    recomputation R that B repeats before its backward (nothing without recomputation). With a flash
    attention kernel (the model's `attention`) the s x s softmax and dropout move nothing through HBM
    and the backward's attention products are five, not four (the scores recomputed: 2.5 forwards'),
    which leaves selective recomputation nothing to repeat. The GEMMs are linear_gemms' (grouped-query
    K and V, SwiGLU's three), the tensor-parallel collectives tp_collectives' (what an overlap leaves)."""
    m, lay, hw = st.model, st.layout, st.hw
    b, s, h, f, t, w = lay.microbatch_size, st.tokens, m.hidden, m.ffn, lay.tp, m.width
    bs = b * s
    gemms = sum(linear_gemms(st))
    replicated = bs * h / (t if lay.sequence_parallel else 1)
    mlp_values = 3 * bs * f / t if m.mlp == "swiglu" else 2 * bs * f / t  # GeLU in and out; SwiGLU 2f in, f out
    elementwise = hw.memory(w * (ELEMENTWISE * replicated + mlp_values + TRANSPOSES * bs * h / t))
    if m.positions == "rope":  # rotary embedding of Q and K: read and written once each
        elementwise += hw.memory(w * 2 * bs * (h + m.kv_hidden) / t)
    if lay.eager:  # kernel by kernel instead of the fused forms above
        elementwise = eager_elementwise(st)
    if lay.fp8:
        elementwise += fp8_casts(st)
    attention, attention_elementwise, attention_backward = attention_terms(st)
    comm = tp_collectives(st)
    accumulate = hw.memory(GRAD_ACCUMULATION * w * layer_params(m, t))
    ring_forward, ring_backward = ring_exposed(st) if lay.cp > 1 else (0.0, 0.0)
    dgrad, wgrad = sum(linear_gemms(st, "dgrad")), sum(linear_gemms(st, "wgrad"))
    forward = Part(gemms + attention + elementwise + attention_elementwise, comm, cp=ring_forward)
    core = Part() if m.flash else Part(attention + attention_elementwise, 0.0)  # flash recomputes it anyway
    recompute = {"full": forward, "selective": core, "none": Part(),
                 "selective-ops": Part(sum(op_policy_gemms(st)) + elementwise, op_policy_gathers(st))}[lay.recompute]
    return {F: forward,
            I: Part(dgrad + attention_backward + 2 * (elementwise + attention_elementwise), comm, cp=ring_backward),
            W: Part(wgrad + accumulate, 0.0),
            R: recompute}


def linear_gemms(st: Setting, gemm_pass: str = "fprop") -> tuple[float, ...]:
    """One layer's four linear GEMMs of one microbatch in `gemm_pass` (fprop, dgrad or wgrad: each
    pass's GEMM has the forward's FLOPs), in the order the tensor-parallel collectives meet them: QKV
    (h -> h + 2 kv_hidden over t), the projection, the MLP's first (h -> f, or a SwiGLU's gate and up,
    2f) and second; at the GPU's FP8 rate with --fp8, and each at the share of its rate that the
    cluster's userbuffers overlap leaves it under --tp-comm-overlap (sm_rates)."""
    m, lay, hw = st.model, st.layout, st.hw
    bs, h, f, t, fp8 = lay.microbatch_size * st.tokens, m.hidden, m.ffn, lay.tp, lay.fp8
    qkv = 3 * h / t if m.kv_heads == m.heads else (h + 2 * m.kv_hidden) / t
    up = 2 * f / t if m.mlp == "swiglu" else f / t
    gemms = (hw.gemm(bs, qkv, h, fp8=fp8), hw.gemm(bs, h, h / t, fp8=fp8), hw.gemm(bs, up, h, fp8=fp8),
             hw.gemm(bs, h, f / t, fp8=fp8))
    rates = sm_rates(st, gemm_pass)
    return gemms if rates is None else tuple(g / r for g, r in zip(gemms, rates))


def sm_rates(st: Setting, gemm_pass: str) -> tuple[float, ...] | None:
    """The share of its rate each linear GEMM keeps in `gemm_pass` beside Transformer Engine's
    userbuffers communication (--tp-comm-overlap at t > 1, the cluster's [userbuffers.*] configuration
    for the run: (S - n) / S of S SMs, costmodel/userbuffers.py); None where nothing is taken: no
    overlap, no table, or a model with experts or latent attention (the tables are of dense layers).

        S = 132, proj_fprop = 24, fc2_fprop = 16  ->  fprop (1, 108/132, 1, 116/132)
    """
    m, lay, ub = st.model, st.layout, st.cluster.userbuffers
    if not lay.tp_comm_overlap or lay.tp == 1 or ub is None or m.moe or m.mla:
        return None
    rates = ub.rates(gemm_pass, lay.fp8, m.hidden, lay.tp, lay.cp)
    return None if all(r == 1 for r in rates) else rates


def op_policy_gemms(st: Setting) -> tuple[float, ...]:
    """The GEMMs torchtitan's per-op selective checkpointing recomputes in a block's backward (--recompute
    selective-ops): every second matmul in forward order as a rank computes it (activations.op_matmuls), K
    and the projection, then a SwiGLU's up (w3) or a GeLU MLP's second, at the FP8 rate with --fp8
    (torchao's Float8Linear); the kept ones (Q, V, gate, down) and the flash attention are not rerun."""
    sizes, facts = activation_sizes(st.model, st.layout)
    bs, fp8 = st.layout.microbatch_size * st.tokens, st.layout.fp8
    return tuple(st.hw.gemm(bs, n, k, fp8=fp8) for n, k in op_matmuls(sizes, facts, st.layout.tp)[1::2])


def op_policy_gathers(st: Setting) -> float:
    """The tensor-parallel communication the per-op policy repeats in a block's backward (t > 1, sequence-
    parallel): the all-gathers of the attention's and the MLP's inputs, not on its save list (the reduce-
    scatters are), each half of tp_collectives' all-reduce. With --tp-comm-overlap each runs beside the
    recomputed GEMM that reads it, wk's and a SwiGLU's w3 (a GeLU MLP's first GEMM is kept: its gather
    stays exposed), leaving max(0, c - g (t - 1) / t) as tp_collectives does."""
    m, lay = st.model, st.layout
    if lay.tp == 1:
        return 0.0
    gather = st.tp_all_reduce(m.width * lay.microbatch_size * st.tokens * m.hidden) / 2
    if not lay.tp_comm_overlap:
        return 2 * gather
    recomputed, hiding = op_policy_gemms(st), (lay.tp - 1) / lay.tp
    readers = (recomputed[0], recomputed[2] if m.mlp == "swiglu" else 0.0)
    return sum(max(0.0, gather - gemm * hiding) for gemm in readers)


def tp_collectives(st: Setting) -> float:
    """A layer's tensor-parallel communication in one forward (and again in its input-gradient pass):
    two all-reduces of b·s·h (with sequence parallelism two all-gathers and two reduce-scatters, the
    same time). With --tp-comm-overlap (Transformer Engine's userbuffers, sequence parallel) each
    all-gather runs under the GEMM it feeds and each reduce-scatter under the GEMM that makes its input,
    as a ring of t - 1 exchanges beside the GEMM in t chunks: one chunk (the local one) has nothing to
    hide behind, so a collective of c seconds beside a GEMM of g leaves max(0, c - g (t - 1) / t).

        t = 8, c = 1, g = 2  ->  0 (1.75 s of GEMM hides it);  c = 1, g = 0.8  ->  0.3 exposed
    """
    m, lay = st.model, st.layout
    if lay.tp == 1:
        return 0.0
    whole = st.tp_all_reduce(m.width * lay.microbatch_size * st.tokens * m.hidden)
    if not lay.tp_comm_overlap:
        return 2 * whole  # 2 AG + 2 RS cost the same with SP
    hiding = (lay.tp - 1) / lay.tp
    return sum(max(0.0, whole / 2 - gemm * hiding) for gemm in linear_gemms(st))


def tp_exposure(st: Setting) -> tuple[float, float]:
    """A layer's tensor-parallel communication in one forward of one microbatch, seconds: (exposed with
    --tp-comm-overlap, without it), under sequence parallelism as the overlap needs; tune --why's."""
    on = replace(st.layout, sequence_parallel=True, tp_comm_overlap=True)
    return (tp_collectives(replace(st, layout=on)),
            tp_collectives(replace(st, layout=replace(on, tp_comm_overlap=False))))


def eager_elementwise(st: Setting) -> float:
    """A Llama block's elementwise forward run eagerly, one kernel a torch op, as torchtitan's model.py (at
    9dec370) writes it, seconds at HBM speed (t = 1; the fused forms' traffic is what --eager replaces).
    Bytes a token, bf16 activations (2), fp32 intermediates (4):

        each RMSNorm (two)   x.float() 2+4, pow 4+4, mean 4, x * rsqrt 4+4, type_as 4+2, * weight 2+2 = 36 h
        rotary on Q and K    .float() 2+4, complex product 4+4, type_as 4+2                         = 20 (h + kv)
        repeat_kv            K and V expanded to the heads and copied: read 2 kv, write 2 h, each   =  4 (h + kv)
        attention output     transpose(1, 2).contiguous(): read and write                           =  4 h
        SwiGLU               silu(w1) 2+2 f, silu * w3 2+2+2 f                                      = 10 f
        residual adds (two)  read 2 + 2, write 2                                                    = 12 h

    in all 112 h + 24 kv + 10 f (Llama 3.1 8B: 626,688 bytes a token)."""
    m, lay = st.model, st.layout
    per_token = 112 * m.hidden + 24 * m.kv_hidden + 10 * m.ffn
    return st.hw.memory(per_token * lay.microbatch_size * st.tokens)


def fp8_casts(st: Setting) -> float:
    """What Transformer Engine's FP8 GEMMs add in HBM traffic per layer and pass (forward, or the
    backward's input gradients): each linear GEMM's input read at 16 bits and written at 8 with its
    amax, 3 bytes a value, and 2 more with --fp8-current-scaling (its amax read first; the weights'
    casts once per step, not counted)."""
    m, lay = st.model, st.layout
    bs, h, f, t = lay.microbatch_size * st.tokens, m.hidden, m.ffn, lay.tp
    per_value = FP8_CAST_BYTES + (FP8_AMAX_BYTES if lay.fp8_current_scaling else 0)
    return st.hw.memory(per_value * bs * (2 * h + h / t + f / t))


def layer_overhead(st: Setting) -> dict[str, float]:
    """The cluster's [overhead]: seconds per layer each op kind costs beyond its kernels' work (a CPU's
    op dispatch and autograd, measured by `schedc calibrate`); 0 where not given, and a whole backward's
    that of its two halves unless given (the runtime's split backward walks the graph twice).

        [overhead] f_us = 100, i_us = 300, w_us = 200  ->  F 1e-4, I 3e-4, W 2e-4, B 5e-4 s per layer
    """
    given = dict(st.cluster.overhead)
    out = {kind: given.get(kind, 0.0) for kind in (F, I, W)}
    out[B] = given.get(B, out[I] + out[W])
    return out


def attention_terms(st: Setting) -> tuple[float, float, float]:
    """One layer's terms that grow with the square of the sequence, one microbatch: the attention
    products (QK^T and the product with V), the s x s softmax and dropout through HBM (none with a flash
    kernel: on chip), and the backward's products (2.5 forwards' with flash, the scores recomputed). A
    sliding window w < s (Mistral's) leaves a flash kernel the band's pairs (window_share: FlashAttention-2's
    window skips the blocks outside it); a standard kernel computes the s x s products and scores and
    masks them, as Hugging Face's eager attention does, so its time and saved scores do not change."""
    m, lay, hw = st.model, st.layout, st.hw
    if m.flash and not m.mla and st.cluster.attention is not None:  # the cluster's kernel (attention.py)
        return kernel_terms(st)
    b, s, h, a, t, w = lay.microbatch_size, st.tokens, m.hidden, m.heads, lay.tp, m.width
    attention = 2 * hw.gemm(s, s, h / a, count=b * a / t)
    if lay.cp > 1:  # context parallelism: the diagonal block and cp - 1 half blocks (causal_blocks)
        attention *= causal_blocks(lay.cp)
    if m.flash:  # a sliding window: the kernel skips the blocks outside the band (a standard one masks them)
        attention *= window_share(s, m.window)
    elementwise = 0.0 if m.flash else hw.memory(w * ATTENTION_ELEMENTWISE * b * (a / t) * s * s)
    return attention, elementwise, (2.5 if m.flash else 2) * attention


def causal_blocks(cp: int) -> float:
    """The attention one GPU of a context-parallel group computes, in blocks of its s/cp x s/cp
    (Megatron-Core's load-balanced ring: the sequence in 2·cp chunks, GPU i holding chunks i and
    2·cp-1-i): the diagonal block with the causal mask, charged as the model charges a whole sequence's
    attention, then cp - 1 blocks of which the mask leaves half (an earlier GPU's keys are seen by the
    second chunk's queries only, a later GPU's first chunk of keys alone is seen). Of the model's
    whole-sequence attention that is (cp + 1) / (2 cp^2): 3/8 at cp = 2, tending to 1/(2 cp), the causal
    half split evenly.

    >>> causal_blocks(1), causal_blocks(2), causal_blocks(4)
    (1.0, 1.5, 2.5)
    """
    return (cp + 1) / 2


def ring_exposed(st: Setting) -> tuple[float, float]:
    """Seconds of context parallelism's key/value ring one layer's forward and backward leave exposed,
    one microbatch. Megatron-Core's ring, not Llama 3's all-gather: each of cp - 1 steps sends the GPU's
    keys and values (2·b·(s/cp)·h_kv/t values) to the next GPU of the group while the attention block of
    the step computes, so the exchange hides under the attention up to what its blocks take (an
    all-gather before the attention hides under nothing). Steps: the diagonal block, then half blocks
    (causal_blocks); the backward sends the keys and values and their gradients (twice the bytes)
    under its blocks' 2.5 forwards (flash). The link: NVLink when t·cp fills at most a node."""
    m, lay, hw = st.model, st.layout, st.hw
    if not m.mla and st.cluster.attention is not None:  # the stack's own ring, behind the kernel's blocks
        return kernel_ring_exposed(st)
    message = hw.message(2 * lay.microbatch_size * st.tokens * m.kv_hidden / lay.tp * m.width, st.cp_in_node)
    attention = attention_terms(st)[0] / causal_blocks(lay.cp)  # the diagonal block
    forward = max(0.0, message - attention) + (lay.cp - 2) * max(0.0, message - attention / 2)
    backward = max(0.0, 2 * message - 2.5 * attention) + (lay.cp - 2) * max(0.0, 2 * message - 1.25 * attention)
    return forward, backward


def chunk_multipliers(st: Setting, costs: StageCosts, chunks: int) -> dict[str, tuple[tuple[float, ...], ...]]:
    """Sequence chunks (Seq1F1B): kind -> stage -> chunk j -> what chunk j's op costs over an even 1/k
    share of the microbatch's. A chunk of s/k tokens does 1/k of the layer's sequence-linear work, and
    its attention reads the keys of chunks 0..j: (j+1)/k^2 of the microbatch's s x s terms. With a the
    s x s share of the stage's op, chunk j costs (1 - a) + a (j+1)/k of an even share; W has none.

        a = 0.3, k = 2  ->  chunk 0: 0.85, chunk 1: 1.0 (the microbatch's 1 - 0.3/4 in all)
    """
    attention, elementwise, backward = attention_terms(st)
    layers = stage_layers(st.model, len(costs.parts[F]), st.layout)
    core = 0.0 if st.model.flash else attention + elementwise  # selective recomputation's (layer_parts)
    recompute = {"full": attention + elementwise, "selective": core, "none": 0.0, "selective-ops": 0.0}
    square = {F: attention + elementwise, I: backward + 2 * elementwise + recompute[st.layout.recompute], W: 0.0}
    square[B] = square[I]
    out = {}
    for kind, parts in costs.parts.items():
        rows = []
        for s, part in enumerate(parts):
            share = min(1.0, square[kind] * layers[s] / part.total) if part.total > 0 else 0.0
            rows.append(tuple((1 - share) + share * (j + 1) / chunks for j in range(chunks)))
        out[kind] = tuple(rows)
    return out


def embedding_parts(st: Setting) -> dict[str, Part]:
    """The first stage's extra: the (vocab-parallel) embedding lookup and its gradient."""
    m, lay = st.model, st.layout
    tokens = lay.microbatch_size * st.tokens * m.hidden * m.width
    comm = st.tp_all_reduce(tokens) if lay.tp > 1 else 0.0
    return {F: Part(st.hw.memory(3 * tokens), comm), I: Part(), W: Part(st.hw.memory(3 * tokens)),
            R: Part()}


def head_parts(st: Setting) -> dict[str, Part]:
    """The last stage's extra: final layer norm, logit GEMM (bs x V/t x h) and cross entropy."""
    m, lay, hw = st.model, st.layout, st.hw
    bs, t, w = lay.microbatch_size * st.tokens, lay.tp, m.width
    logits = hw.gemm(bs, m.vocab / t, m.hidden)
    norm = hw.memory(4 * w * bs * m.hidden / (t if lay.sequence_parallel else 1))
    entropy = hw.memory(CROSS_ENTROPY_BYTES * bs * m.vocab / t)
    small = 3 * st.tp_all_reduce(4 * bs) if t > 1 else 0.0
    grad_in = st.tp_all_reduce(w * bs * m.hidden) if t > 1 else 0.0
    return {F: Part(norm + logits + entropy, small),
            I: Part(logits + 2 * norm + entropy / 2, grad_in), W: Part(logits), R: Part()}


def stage_costs(st: Setting, stages: int, placement: tuple[int, ...] | None = None,
                times: list[list[float]] | None = None) -> StageCosts:
    """F, B, I, W of every stage: its layers (the layout's split; an MoE model's dense and MoE layers,
    experts.moe_layer_parts, apart), the embedding on stage 0, the logits on the last, wherever the placement puts them (a V puts both on device 0); with
    blocking point-to-point messages (layout.blocking_p2p) and the stages' devices, an op whose output
    goes to another device also holds its device until the message is through (link_times). times:
    message_times(st, devices) when the caller has them already (schedc tune)."""
    split = stage_layers(st.model, stages, st.layout)
    layer, embed, head = layer_parts(st), embedding_parts(st), head_parts(st)
    over = layer_overhead(st)
    table: dict[str, list[Part]] = {k: [] for k in (F, B, I, W)}
    alike: dict[tuple, tuple[Part, ...]] = {}  # stages of one layer count between the ends cost alike
    mix = stage_mix(st.model, stages, st.layout) if st.model.moe else None
    routed = moe_layer_parts(st, layer, linear_gemms(st), attention_terms(st)[0]) if mix else None
    for s in range(stages):
        which = (split[s], s == 0, s == stages - 1) + ((mix[s],) if mix else ())
        if which not in alike:
            parts = {k: layer[k] * split[s] for k in layer} if mix is None else \
                {k: layer[k] * mix[s][0] + routed[k] * mix[s][1] for k in layer}
            heads = 1 + (st.model.mtp if mix else 0)  # each multi-token-prediction block has its logits and loss
            for extra in ([embed] if s == 0 else []) + ([head] * heads if s == stages - 1 else []):
                parts = {k: parts[k] + extra[k] for k in parts}
            fixed = {k: Part(over[k] * split[s]) for k in over}
            alike[which] = (parts[F] + fixed[F], parts[I] + parts[R] + fixed[I], parts[W] + fixed[W],
                           parts[I] + parts[R] + parts[W] + fixed[B])
        for k, part in zip((F, I, W, B), alike[which]):
            table[k].append(part)
    if st.layout.blocking_p2p and placement is not None:
        _add_sends(table, placement, times if times is not None else message_times(st, max(placement) + 1))
    return StageCosts({k: tuple(v) for k, v in table.items()})


def _add_sends(table: dict[str, list[Part]], placement: tuple[int, ...], times: list[list[float]]) -> None:
    """Add the blocking send of every op whose output feeds a stage on another device (schedc.ops)."""
    for kind in (F, B, I):
        for s, part in enumerate(table[kind]):
            to = feeds(kind, s)
            if to is not None and 0 <= to < len(placement) and placement[to] != placement[s]:
                table[kind][s] = part + Part(p2p=times[placement[s]][placement[to]])


def costs_problem(table: dict[str, tuple[float, ...]], st: Setting) -> str | None:
    """Why the derived op times (StageCosts.costs()) cannot be a schedule's costs (in_cost_range: finite,
    at most what a schedule's sums keep finite), or None; past the range it is the run's sizes (the
    microbatch and the sequence) or the cluster's figures that made them so, not a measured cost."""
    for kind, row in table.items():  # F first
        bad = next((v for v in row if not in_cost_range(v)), None)
        if bad is not None:
            return (f"--microbatch-size {st.layout.microbatch_size:,} of sequence {st.model.seq:,} (the model's seq or "
                    f"--seq) with this model: one {kind} would take {bad:.3g} s, where a cost must be {cost_range()}")
    return None
