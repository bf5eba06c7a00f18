"""The mixture-of-experts keys of a Hugging Face config.json (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3)
as facts beside the dense ones hf.py reads; every key named, at its place, when missing or wrong.

    {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 14336}
    -> experts=8, top_k=2, moe_ffn=14336 (every layer routed)
    {"model_type": "deepseek_v3", "n_routed_experts": 256, "n_shared_experts": 1, "first_k_dense_replace": 3,
     "scoring_func": "sigmoid", "n_group": 8, "topk_group": 4, "kv_lora_rank": 512, ...}
    -> experts=256, shared_experts=1, first_k_dense=3, router="sigmoid", ..., MLA, mtp=1

Imports nothing of schedc.
"""
from __future__ import annotations

from .facts import MAX_SIZE
from .moe import MLA_NAMES

# model_type -> what the family fixes (as hf.FAMILY_OF): all SwiGLU experts, RMSNorm, rotary positions
MOE_FAMILIES = {
    "mixtral": dict(family="mixtral", mlp="swiglu", norm="rmsnorm", positions="rope", bias="none"),
    "qwen2_moe": dict(family="qwen2_moe", mlp="swiglu", norm="rmsnorm", positions="rope", bias="qkv"),
    "qwen3_moe": dict(family="qwen3_moe", mlp="swiglu", norm="rmsnorm", positions="rope", bias="none"),
    "deepseek_v3": dict(family="deepseek_v3", mlp="swiglu", norm="rmsnorm", positions="rope", bias="none"),
}
# fact -> the config's key for it, per family (None: the family has no such key)
MOE_KEYS = {
    "mixtral": {"experts": "num_local_experts", "top_k": "num_experts_per_tok", "moe_ffn": "intermediate_size",
                "aux_loss": "router_aux_loss_coef"},
    "qwen2_moe": {"experts": "num_experts", "top_k": "num_experts_per_tok", "moe_ffn": "moe_intermediate_size",
                  "shared_ffn": "shared_expert_intermediate_size", "aux_loss": "router_aux_loss_coef"},
    "qwen3_moe": {"experts": "num_experts", "top_k": "num_experts_per_tok", "moe_ffn": "moe_intermediate_size",
                  "head_size": "head_dim", "aux_loss": "router_aux_loss_coef"},
    "deepseek_v3": {"experts": "n_routed_experts", "top_k": "num_experts_per_tok",
                    "moe_ffn": "moe_intermediate_size", "shared_experts": "n_shared_experts",
                    "first_k_dense": "first_k_dense_replace", "n_group": "n_group", "topk_group": "topk_group",
                    "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
                    "qk_rope_head_dim": "qk_rope_head_dim", "qk_nope_head_dim": "qk_nope_head_dim",
                    "v_head_dim": "v_head_dim", "mtp": "num_nextn_predict_layers", "aux_loss": "aux_loss_alpha"},
}
_REQUIRED = ("experts", "top_k", "moe_ffn")
_ZERO_OK = ("shared_experts", "first_k_dense", "q_lora_rank", "mtp")  # 0 or null: none
_LAYER_CHOICE = {"decoder_sparse_step": 1, "moe_layer_freq": 1}     # every layer past the dense ones routed


def key_names(kind: str) -> dict[str, str]:
    """A family's config keys of the MoE facts, for the consistency messages (the fact's own name where
    the family has no key for it)."""
    facts = ("experts", "top_k", "moe_ffn", "shared_experts", "first_k_dense", "n_group", "topk_group", *MLA_NAMES)
    return {fact: MOE_KEYS.get(kind, {}).get(fact, fact) for fact in facts}


def moe_facts(config: dict, kind: str, fail) -> dict:
    """The MoE facts of a config of family `kind`: its keys read (positive integers; the ones that may be
    none, 0 or null), the router and MLA as the family has them; every layer past the dense ones must be
    routed (decoder_sparse_step, moe_layer_freq 1 and no mlp_only_layers: others are not modelled)."""
    out: dict = {}
    for fact, key in MOE_KEYS[kind].items():
        if fact == "aux_loss":
            out[fact] = _fraction(config, key, fail)
        elif fact in _REQUIRED or config.get(key) not in (None, 0) or fact not in _ZERO_OK:
            out[fact] = _count(config, key, fail, None if fact in _REQUIRED else _default(fact))
    if kind == "qwen2_moe":
        out["shared_experts"] = 1 if out.get("shared_ffn") else 0
    if kind in ("qwen2_moe", "deepseek_v3"):  # the dense layers' (and Qwen2-MoE's shared expert's) width
        out["ffn"] = _count(config, "intermediate_size", fail, None)
    if kind == "deepseek_v3":
        out["router"] = _scoring(config, fail)
    for key, want in _LAYER_CHOICE.items():
        if config.get(key, want) != want:
            raise fail(f"'{key}' {config[key]!r}: schedc models every layer past the dense ones as an MoE "
                       f"layer ({key} {want})", key)
    if config.get("mlp_only_layers"):
        raise fail("'mlp_only_layers' given: schedc models every layer past the dense ones as an MoE layer",
                   "mlp_only_layers")
    return out


def _default(fact: str) -> int:
    return {"n_group": 1, "topk_group": 1}.get(fact, 0)


def _count(config: dict, key: str, fail, default: int | None) -> int:
    """A positive integer at `key` (default when absent or null; None: required)."""
    value = config.get(key)
    if value is None:
        if default is None:
            raise fail(f"missing key '{key}' (a positive integer)", None)
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_SIZE:
        raise fail(f"'{key}' must be a positive integer up to {MAX_SIZE:,}, got {value!r}", key)
    return value


def _fraction(config: dict, key: str, fail) -> float:
    value = config.get(key, 0.0)
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise fail(f"'{key}' must be a number in [0, 1), got {value!r}", key)
    return float(value)


def _scoring(config: dict, fail) -> str:
    value = config.get("scoring_func", "softmax")
    if value not in ("softmax", "sigmoid"):
        raise fail(f"'scoring_func' must be softmax or sigmoid, got {value!r}", "scoring_func")
    return value
