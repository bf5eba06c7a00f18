"""A mixture of experts' and multi-head latent attention's facts: what they say against each other and the
parameters they hold. Plain functions of a facts value (descriptions.facts.ModelFacts), imported by it.

    Mixtral 8x7B:  experts 8, top_k 2, moe_ffn 14336, softmax router, every layer an MoE layer
    DeepSeek-V3:   experts 256, top_k 8, moe_ffn 2048, 1 shared expert, first_k_dense 3 (ffn 18432),
                   sigmoid router over 8 groups of which 4 are kept, MLA (q 1536, kv 512, rope 64,
                   nope 128, v 128), one multi-token-prediction block

A layer's MLP is routed (an MoE layer) past the first `first_k_dense` layers when the model has experts;
each routed and shared expert is a SwiGLU of width moe_ffn (a shared expert's: shared_ffn). Imports nothing.
"""
from __future__ import annotations

ROUTERS = ("softmax", "sigmoid")  # softmax top-k (Mixtral, Qwen); sigmoid scores, group-limited (DeepSeek-V3)
MLA_NAMES = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def moe_consistency(facts, name: dict[str, str]) -> list[tuple[str, str]]:
    """What the MoE and MLA facts say against each other, as (fact to blame, message): top_k within the
    experts, an expert width, the dense leading layers fewer than the layers, the groups dividing the
    experts and the groups kept within them; MLA's head dimensions all given with its kv rank."""
    out = []
    if facts.experts:
        if not facts.top_k or facts.top_k > facts.experts:
            out.append(("top_k", f"'{name['top_k']}' ({facts.top_k}) must be from 1 to the {facts.experts} experts "
                                 f"('{name['experts']}'): each token goes to top_k of them"))
        if not facts.moe_ffn:
            out.append(("moe_ffn", f"'{name['moe_ffn']}' missing: the experts' MLP width"))
        if facts.first_k_dense >= facts.layers:
            out.append(("first_k_dense", f"'{name['first_k_dense']}' ({facts.first_k_dense}) must be fewer than "
                                         f"the {facts.layers} layers: some layer must be an MoE layer"))
        if facts.experts % facts.n_group or facts.topk_group > facts.n_group:
            out.append(("n_group", f"'{name['n_group']}' ({facts.n_group}) must divide the {facts.experts} experts "
                                   f"and be at least '{name['topk_group']}' ({facts.topk_group})"))
        elif facts.top_k > facts.topk_group * (facts.experts // facts.n_group):
            out.append(("top_k", f"'{name['top_k']}' ({facts.top_k}) is more experts than the {facts.topk_group} "
                                 f"groups kept ('{name['topk_group']}') hold"))
    elif facts.top_k or facts.shared_experts or facts.first_k_dense:
        given = next(k for k in ("top_k", "shared_experts", "first_k_dense") if getattr(facts, k))
        out.append((given, f"'{name[given]}' given but the model has no experts ('{name['experts']}')"))
    if facts.kv_lora_rank and not (facts.qk_rope_head_dim and facts.qk_nope_head_dim and facts.v_head_dim):
        missing = next(k for k in MLA_NAMES[2:] if not getattr(facts, k))
        out.append((missing, f"'{name[missing]}' missing: latent attention (kv_lora_rank) needs its head dims"))
    return out


def attention_parameters(facts) -> int:
    """One layer's attention weights (biases and norms aside). Standard: Q and the projection (h x q_hidden
    each), K and V (h x kv_hidden each). MLA (DeepSeek-V2/V3): Q down to q_lora_rank and up to heads x
    (nope + rope) (or h straight up without a q rank), K/V down to kv_lora_rank + rope, up to heads x
    (nope + v), the projection heads x v -> h, and the two latent norms.

        DeepSeek-V3: 7168·1536 + 1536 + 1536·128·192 + 7168·576 + 512 + 512·128·256 + 128·128·7168 = 187,107,328
    """
    h = facts.hidden
    if not facts.kv_lora_rank:
        return 2 * h * facts.q_hidden + 2 * h * facts.kv_hidden
    heads, qk = facts.heads, facts.qk_nope_head_dim + facts.qk_rope_head_dim
    q_rank = facts.q_lora_rank
    query = h * q_rank + q_rank + q_rank * heads * qk if q_rank else h * heads * qk
    kv = h * (facts.kv_lora_rank + facts.qk_rope_head_dim) + facts.kv_lora_rank
    kv += facts.kv_lora_rank * heads * (facts.qk_nope_head_dim + facts.v_head_dim)
    return query + kv + heads * facts.v_head_dim * h


def expert_parameters(facts) -> int:
    """One routed expert's weights: a SwiGLU of width moe_ffn (gate, up, down: 3·h·moe_ffn)."""
    return 3 * facts.hidden * facts.moe_ffn


def moe_mlp_parameters(facts, routed: int | None = None) -> int:
    """One MoE layer's MLP weights with `routed` of its experts (all when None): the routed experts, the
    shared ones, the router (h x experts, plus DeepSeek-V3's per-expert score bias with a sigmoid router;
    Qwen2-MoE's h x 1 gate of the shared expert)."""
    routed = facts.experts if routed is None else routed
    shared = facts.shared_experts * 3 * facts.hidden * facts.shared_width
    router = facts.hidden * facts.experts + (facts.experts if facts.router == "sigmoid" else 0)
    gate = facts.hidden if facts.shared_experts and facts.family == "qwen2_moe" else 0
    return routed * expert_parameters(facts) + shared + router + gate


def mtp_parameters(facts) -> int:
    """One multi-token-prediction block (DeepSeek-V3 section 2.2) beside its shared embedding and output
    head: two norms of h, the h x 2h projection of [h; embedding], one more layer (an MoE layer)."""
    return facts.mtp * (2 * facts.hidden + 2 * facts.hidden * facts.hidden + facts.layer_parameters(moe=True))
