# A GPT-2 config.json's gradients under GPT-2's own Hugging Face names and layouts, as --save-grads
# writes them (the run's and the reference's alike). The runtime builds a model_type gpt2 description as
# the decoder of decoder.py (LayerNorm, learned positions, a GeLU MLP, biases, tied embeddings) under the
# Llama scheme's names, with nn.Linear weights [out, in]; GPT-2 (transformers' GPT2LMHeadModel) keeps
# its linear layers as Conv1D, weights [in, out], and q, k and v as one c_attn:
#
#   model.embed_tokens.weight                     -> transformer.wte.weight (the tied lm_head's too)
#   model.embed_positions.weight                  -> transformer.wpe.weight [n_positions, n_embd]
#   model.layers.N.input_layernorm.*              -> transformer.h.N.ln_1.*
#   model.layers.N.self_attn.{q,k,v}_proj.weight  -> transformer.h.N.attn.c_attn.weight = [q; k; v]^T [h, 3h]
#   model.layers.N.self_attn.{q,k,v}_proj.bias    -> transformer.h.N.attn.c_attn.bias  = [q, k, v]   [3h]
#   model.layers.N.self_attn.o_proj.*             -> transformer.h.N.attn.c_proj.*   (weight transposed)
#   model.layers.N.post_attention_layernorm.*     -> transformer.h.N.ln_2.*
#   model.layers.N.mlp.up_proj.*                  -> transformer.h.N.mlp.c_fc.*      (weight transposed)
#   model.layers.N.mlp.down_proj.*                -> transformer.h.N.mlp.c_proj.*    (weight transposed)
#   model.norm.*                                  -> transformer.ln_f.*
#
# A tied model's lm_head.weight is written once, as transformer.wte.weight (HF's checkpoints leave the
# tied key out too); an untied one keeps lm_head.weight. The gradients arrive whole (tensor-parallel
# shards already gathered: tensor_parallel.gathered_gradients), so c_attn is the whole tensor.
from __future__ import annotations

import re
from typing import Callable

import torch

CONV1D = ("self_attn.o_proj", "mlp.up_proj", "mlp.down_proj")  # nn.Linear here, Conv1D there: transposed
LAYER = {"input_layernorm": "ln_1", "self_attn.o_proj": "attn.c_proj", "post_attention_layernorm": "ln_2",
         "mlp.up_proj": "mlp.c_fc", "mlp.down_proj": "mlp.c_proj"}
ENDS = {"model.embed_tokens.weight": "transformer.wte.weight", "model.embed_positions.weight": "transformer.wpe.weight",
        "model.norm.weight": "transformer.ln_f.weight", "model.norm.bias": "transformer.ln_f.bias",
        "lm_head.weight": "lm_head.weight"}
QKV = ("q_proj", "k_proj", "v_proj")
_IN_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


GPT2_FACTS = {"mlp": "gelu", "norm": "layernorm", "positions": "learned", "bias": "all", "experts": 0}


def saved_layout(cfg, model_code: str | None) -> Callable[[dict], dict]:
    """How --save-grads writes the gradients of this model: GPT-2's names and layouts for the runtime's
    own model of a gpt2 description with GPT-2's facts (a model TOML file may say family gpt2 of another
    block), else as the model names them."""
    gpt2 = cfg.family == "gpt2" and cfg.kv_heads == cfg.heads and all(getattr(cfg, k) == v for k, v in GPT2_FACTS.items())
    return gpt2_gradients if gpt2 and model_code is None else dict


def gpt2_gradients(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The decoder's gradients (whole, by its names) under GPT-2's names and layouts (the table above)."""
    out: dict[str, torch.Tensor] = {}
    attention: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, grad in grads.items():
        if name in ENDS:
            out[ENDS[name]] = grad
            continue
        found = _IN_LAYER.fullmatch(name)
        if found is None:
            raise KeyError(f"{name!r} is not a parameter of GPT-2's decoder")
        layer, part, kind = found.groups()
        prefix = f"transformer.h.{layer}."
        if part.startswith("self_attn.") and part.split(".")[1] in QKV:
            attention.setdefault((prefix, kind), {})[part.split(".")[1]] = grad
            continue
        transpose = kind == "weight" and part in CONV1D
        out[f"{prefix}{LAYER[part]}.{kind}"] = grad.t().contiguous() if transpose else grad
    for (prefix, kind), parts in attention.items():
        joined = torch.cat([parts[p] for p in QKV], dim=0)  # [3h, h] weights, [3h] biases
        out[f"{prefix}attn.c_attn.{kind}"] = joined.t().contiguous() if kind == "weight" else joined
    return out
