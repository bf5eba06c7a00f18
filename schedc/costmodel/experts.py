"""An MoE layer's op costs: the dense layer's attention (or DeepSeek's latent attention) with its MLP
replaced by the router, the grouped expert GEMMs, the shared experts, the tokens' permutation through HBM
and expert parallelism's dispatch and combine all-to-alls (Part.a2a), one microbatch on one GPU.

    tokens a GPU dispatches     b·s/t (Megatron-Core runs MoE with sequence parallelism when t > 1)
    tokens per local expert     b·s/t · ep·etp · top_k / experts x EXPERT_IMBALANCE (the expert group's
                                tokens spread over the experts, each expert split over etp GPUs that share
                                its tokens; b·s·top_k·ep / experts with etp = t)
    dispatch (= combine) bytes  b·s/t · h · w times the copies a token sends (dispatch_copies), over NVLink
                                and over the network (k: the ep group's GPUs in a node, n = ep / k nodes, E
                                experts, miss(x) = C(E-x, top_k) / C(E, top_k) the chance that none of a
                                token's top_k experts is among x given ones, under uniform routing):
        alltoall                a copy per chosen expert (Megatron-Core's MoEAlltoAllTokenDispatcher permutes
                                the top_k copies, then one all-to-all): top_k·(k-1)/ep over NVLink,
                                top_k·(ep-k)/ep over the network
        flex                    DeepEP's and HybridEP's: once per GPU reached, and across nodes once per node
                                reached, to the GPU of the same local index there, which forwards it over
                                NVLink (DeepSeek-V3 section 3.2.2; DeepEP's internode kernels carry a
                                token's per-node GPU mask): (n-1)(1 - miss(E/n)) over the network, with
                                group-limited routing (n_group > 1) min(top_k, topk_group, n)(n-1)/n;
                                n(k-1)(1 - miss(E/ep)) over NVLink (its own node's GPUs and, by symmetry,
                                the forwarding it does for the other nodes)
    F and I                     two all-to-alls each (dispatch, combine: its mirror); W none

NVLink and the network carry their shares at once: an all-to-all takes the longer of the two.
"""
from __future__ import annotations

from dataclasses import replace

from ..descriptions.moe import attention_parameters
from ..ir import Issued
from ..ops import Opcode, OpKind
from .bytes import layer_params, moe_layer_params
from .hardware import F, GRAD_ACCUMULATION, I, R, W, Part, Setting, stage_mix

EXPERT_IMBALANCE = 1.0  # the busiest expert's tokens over the mean: 1, a balanced router (DeepSeek-V3's
                        # auxiliary-loss-free balancing keeps it near); not fitted to any measurement


def moe_layer_parts(st: Setting, dense: dict[str, Part], gemms: tuple[float, ...],
                    attention: float) -> dict[str, Part]:
    """One MoE layer's F, I, W and R from the dense layer's (stages.layer_parts, its four linear GEMMs
    `gemms` and its attention products `attention`): its MLP GEMMs and MLP elementwise traffic taken out,
    the router, experts, shared experts and permutation put in, the attention swapped for MLA's where
    the model has it, the all-to-alls added to F and I."""
    m, lay, hw = st.model, st.layout, st.hw
    mlp = sum(gemms[2:])
    w, bs, t = m.width, lay.microbatch_size * st.tokens, lay.tp
    mlp_values = hw.memory(w * (3 if m.mlp == "swiglu" else 2) * bs * m.ffn / t)
    forward_moe, memory = moe_compute(st)
    attention_swap, backward_swap = mla_swap(st, sum(gemms[:2]), attention) if m.mla else (0.0, 0.0)
    a2a = 2 * all_to_all(st)
    accumulate = hw.memory(GRAD_ACCUMULATION * w * (moe_layer_params(m, t, lay.ep) - layer_params(m, t)))
    forward = replace(dense[F], compute=dense[F].compute - mlp - mlp_values + forward_moe + memory + attention_swap,
                      a2a=a2a)
    backward = replace(dense[I], compute=dense[I].compute - mlp - 2 * mlp_values + forward_moe + 2 * memory
                       + backward_swap, a2a=a2a)
    weight = replace(dense[W], compute=dense[W].compute - mlp + forward_moe + accumulate
                     + (mla_gemms(st) - sum(gemms[:2]) if m.mla else 0.0))
    recompute = {"full": forward, "selective": Part() if m.flash else dense[R], "none": Part()}[lay.recompute]
    return {F: forward, I: backward, W: weight, R: recompute}


def moe_compute(st: Setting) -> tuple[float, float]:
    """An MoE MLP's forward on one GPU, seconds: (GEMMs: the router, the local experts' grouped GEMMs at
    the efficiency of their shapes, the shared experts (at the FP8 rate with --fp8; the router not); HBM traffic: the tokens permuted before the
    dispatch and unpermuted after the combine, the experts' SwiGLU). The input gradients' GEMMs are as
    many, and so are the weight gradients'."""
    m, lay, hw = st.model, st.layout, st.hw
    bs, h, t, w = lay.microbatch_size * st.tokens, m.hidden, lay.tp, m.width
    local, etp = m.experts // lay.ep, lay.expert_tp
    per_expert = tokens_per_expert(st)
    fp8 = lay.fp8
    experts = local * (hw.gemm(per_expert, 2 * m.moe_ffn / etp, h, fp8=fp8) + hw.gemm(per_expert, h, m.moe_ffn / etp, fp8=fp8))
    shared_width = m.shared_experts * m.shared_width
    shared = (hw.gemm(bs, 2 * shared_width / t, h, fp8=fp8) + hw.gemm(bs, h, shared_width / t, fp8=fp8)
              if shared_width else 0.0)
    router = hw.gemm(bs / t, m.experts, h)
    copies = bs / t * m.top_k
    memory = hw.memory(w * (4 * copies * h + 3 * local * per_expert * m.moe_ffn / etp + 3 * bs * shared_width / t))
    return experts + shared + router, memory


def tokens_per_expert(st: Setting) -> float:
    """Tokens each local expert computes per microbatch: the expert group's tokens (ep·etp GPUs' b·s/t each;
    b·s each of the ep ranks with etp = t) times top_k spread over the experts, times EXPERT_IMBALANCE, at most the model's capacity factor times the mean (the
    tokens past an expert's capacity dropped; dropless without one)."""
    m, lay = st.model, st.layout
    busiest = min(EXPERT_IMBALANCE, m.capacity_factor) if m.capacity_factor else EXPERT_IMBALANCE
    return busiest * lay.microbatch_size * st.tokens * m.top_k * (lay.ep * lay.expert_tp / lay.tp) / m.experts


def ep_per_node(st: Setting) -> int:
    """GPUs of one expert-parallel group in a node: its ranks are etp apart (the expert layout carved from a
    stage's ranks, expert tensor innermost; etp = t: from the data and context ranks), so min(ep, node /
    etp) of them share a node (1 when etp fills it)."""
    lay, g = st.layout, st.cluster.gpus_per_node
    etp = lay.expert_tp
    return max(1, min(lay.ep, g // etp)) if etp <= g else 1


def all_to_all(st: Setting) -> float:
    """One dispatch (or combine) all-to-all of one MoE layer on one GPU, seconds (the module's volumes):
    NVLink's share and the network's at once, the longer of the two; 0 without expert parallelism."""
    m, lay, c = st.model, st.layout, st.cluster
    if lay.ep == 1:
        return 0.0
    token = lay.microbatch_size * st.tokens / lay.tp * m.hidden * m.width
    k = ep_per_node(st)
    nodes = -(-lay.ep // k)
    if dispatcher(st) == "flex":
        near_copies, remote_copies = flex_copies(m, lay.ep, k, nodes)
        near, remote = token * near_copies, token * remote_copies
    else:  # expert copies in the node but not on this GPU, and on other nodes, per token
        near, remote = token * m.top_k * (k - 1) / lay.ep, token * (m.top_k * (lay.ep - k) / lay.ep)
    intra = c.intra_latency + near / (c.intra_bandwidth * c.intra_efficiency) if k > 1 else 0.0
    inter = c.inter_latency + remote / (c.inter_bandwidth * c.inter_efficiency) if nodes > 1 else 0.0
    return max(intra, inter)


def dispatcher(st: Setting) -> str:
    """The token dispatcher: --moe-dispatcher where given, else the model's: flex with group-limited routing
    (DeepSeek-V3 bounds the nodes a token reaches for its per-node dispatch, section 3.2.2), else alltoall."""
    return st.layout.moe_dispatcher or ("flex" if st.model.n_group > 1 else "alltoall")


def miss(experts: int, top_k: int, given: float) -> float:
    """The chance that none of a token's top_k distinct experts, drawn uniformly from `experts`, is among
    `given` of them: C(E - x, top_k) / C(E, top_k) as a product (x may be a fraction: E / nodes).

        miss(8, 2, 4) = (4/8)(3/7) = 3/14
    """
    out = 1.0
    for i in range(top_k):
        out *= max(0.0, experts - given - i) / (experts - i)
    return out


def flex_copies(m, ep: int, k: int, nodes: int) -> tuple[float, float]:
    """(NVLink, network) copies of one token under a flex dispatcher (the module's formulas): once per GPU
    reached in each node other than the one it lands on, once per other node reached."""
    nvlink = nodes * (k - 1) * (1 - miss(m.experts, m.top_k, m.experts / ep))
    if m.n_group > 1:  # group-limited: at most topk_group nodes
        return nvlink, min(m.top_k, m.topk_group, nodes) * (nodes - 1) / nodes
    return nvlink, (nodes - 1) * (1 - miss(m.experts, m.top_k, m.experts / nodes))


def mla_gemms(st: Setting) -> float:
    """Multi-head latent attention's linear GEMMs of one forward: Q down to q_lora_rank and up to heads x
    (nope + rope) / t, K/V down to kv_lora_rank + rope and up to heads x (nope + v) / t, the projection
    heads x v / t -> h; the down projections whole on every tensor rank."""
    m, lay, hw = st.model, st.layout, st.hw
    bs, h, t, a = lay.microbatch_size * st.tokens, m.hidden, lay.tp, m.heads
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim

    def gemm(n: float, k: float) -> float:
        return hw.gemm(bs, n, k, fp8=lay.fp8)
    query = gemm(m.q_lora_rank, h) + gemm(a * qk / t, m.q_lora_rank) if m.q_lora_rank else gemm(a * qk / t, h)
    kv = gemm(m.kv_lora_rank + m.qk_rope_head_dim, h) + gemm(a * (m.qk_nope_head_dim + m.v_head_dim) / t, m.kv_lora_rank)
    return query + kv + gemm(h, a * m.v_head_dim / t)


def mla_swap(st: Setting, standard: float, attention: float) -> tuple[float, float]:
    """What MLA changes in a layer's forward and input-gradient seconds against the standard attention
    stages.layer_parts charged (`standard`: its GEMMs for QKV and the projection; `attention`: its score
    and value products): MLA's GEMMs, its score products at head width
    nope + rope and value products at v (the backward's 2.5 forwards' with flash, twice without)."""
    m, lay, hw = st.model, st.layout, st.hw
    b, s, a, t = lay.microbatch_size, st.tokens, m.heads, lay.tp
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    latent = hw.gemm(s, s, qk, count=b * a / t) + hw.gemm(s, s, m.v_head_dim, count=b * a / t)
    if lay.cp > 1:
        latent *= (lay.cp + 1) / 2  # causal_blocks
    factor = 2.5 if m.flash else 2
    gemms = mla_gemms(st) - standard
    return gemms + latent - attention, gemms + factor * (latent - attention)


def moe_model_flops(model, layout, batch: int) -> float:
    """An MoE model's FLOPs of one step, as prediction.model_flops counts a dense one (every layer's forward
    4 times with full recomputation, 3 otherwise; the logits 3 times): per token and layer its attention's
    weights (attention_parameters) and products (2·s per head over the score and value widths), and its
    MLP's: a dense layer's ffn, an MoE layer's top_k routed and shared experts and its router; the MTP
    blocks' layers and logits on top.

        Mixtral 8x7B, s = 4096: 2s(2h² + 2h·kv + 2·3h·14336 + 8h) + 4s²h per layer
    """
    s, h = model.seq, model.hidden
    if model.mla:
        scores = model.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    else:
        scores = 2 * model.q_hidden
    attention = 2 * s * attention_parameters(model) + 2 * s * s * scores
    dense = attention + 2 * s * 3 * h * model.ffn
    routed = model.top_k * 3 * h * model.moe_ffn + model.shared_experts * 3 * h * model.shared_width
    moe = attention + 2 * s * (routed + h * model.experts)
    passes = 4 if layout.recompute == "full" else 3
    layers = model.first_k_dense * dense + (model.moe_layers + model.mtp) * moe
    return batch * (passes * layers + 3 * (1 + model.mtp) * 2 * s * h * model.vocab)


# the ops that run an MoE layer's forward or its input gradient, each with a dispatch and a combine
# all-to-all: F, B and I, and R, a placed recomputation of the forward (W has none)
_EXCHANGING = (OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.R.value)


def expert_collectives(st: Setting, stages: int) -> tuple[Issued, ...]:
    """What the plan declares of expert parallelism (Schedule.collectives): on every stage with MoE
    layers, F, B, I and R issue a dispatch and a combine ALL_TO_ALL over the stage's expert group: the
    ep ranks carved from d x cp, the op's own rank's lane in the plan (never another pipeline rank, not
    even the other copy of the stage in Chimera or DualPipe). One pair stands for the
    op's MoE layers: consecutive collectives of one op on one group wait for the same ranks. None
    without experts or with ep = 1.

        ep 2, 2 stages, MoE layers on stage 1 only -> F, B, I, R: ALL_TO_ALL twice each, stages {1}
    """
    if st.layout.ep <= 1 or not st.model.moe:
        return ()
    routed = frozenset(s for s, (_, moe) in enumerate(stage_mix(st.model, stages, st.layout)) if moe)
    if not routed:
        return ()
    return tuple(Issued(kind, Opcode.ALL_TO_ALL.value, routed) for kind in _EXCHANGING for _ in ("dispatch", "combine"))
