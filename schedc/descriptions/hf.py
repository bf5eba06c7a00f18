"""A Hugging Face `config.json` as a model description: its `model_type` picks the family, its keys give
the facts (facts.ModelFacts; a mixture of experts' keys hf_moe.py's); the run's sequence length, which a config does not have, comes from --seq.

    {"model_type": "llama", "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8, ...}
    -> ModelFacts(layers=80, hidden=8192, heads=64, kv_heads=8, mlp="swiglu", ffn=28672, norm="rmsnorm",
                  positions="rope", tied_embeddings=False, bias="none", family="llama", ...)

Read with the standard library's json; every key it needs is named in a DescriptionError at its place in
the text when missing or wrong. Imports nothing of schedc.
"""
from __future__ import annotations

import json
import re

from .facts import MAX_SIZE, DescriptionError, ModelFacts, consistency
from .hf_moe import MOE_FAMILIES, key_names, moe_facts

# model_type -> (family, what the family fixes). Llama and Mistral: SwiGLU, RMSNorm, rotary positions,
# no biases (attention_bias and mlp_bias false in their configs); Qwen2: the same with biases on the q, k, v
# projections (its modelling code always has them); GPT-2: GeLU MLP, LayerNorm, learned positions, biases.
FAMILY_OF = {
    "llama": dict(family="llama", mlp="swiglu", norm="rmsnorm", positions="rope", bias="none"),
    "mistral": dict(family="mistral", mlp="swiglu", norm="rmsnorm", positions="rope", bias="none"),
    "qwen2": dict(family="qwen2", mlp="swiglu", norm="rmsnorm", positions="rope", bias="qkv"),
    "gpt2": dict(family="gpt2", mlp="gelu", norm="layernorm", positions="learned", bias="all"),
    **MOE_FAMILIES,
}
# fact -> the config's key for it, per key scheme (GPT-2's names differ), with None: required
_LLAMA_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
               "vocab": "vocab_size", "ffn": "intermediate_size"}
_MOE_KEYS = {fact: key for fact, key in _LLAMA_KEYS.items() if fact != "ffn"}  # hf_moe reads the widths
_GPT2_KEYS = {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "vocab": "vocab_size"}
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def key_positions(text: str) -> dict[str, tuple[int, int]]:
    """Where each top-level key of a JSON object stands: key -> (line, col) of its opening quote (the
    first occurrence of a repeated key). A scan of the text (json gives no positions): strings are
    skipped, and only keys directly inside the outermost object are recorded."""
    found: dict[str, tuple[int, int]] = {}
    depth, line, start, i = 0, 1, 0, 0
    while i < len(text):
        c = text[i]
        if c == "\n":
            line, start = line + 1, i + 1
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        elif c == '"':
            end = _string_end(text, i)
            if depth == 1 and re.match(r"\s*:", text[end + 1:end + 64]):
                found.setdefault(json.loads(text[i:end + 1]), (line, i - start + 1))
            i = end
        i += 1
    return found


def _string_end(text: str, i: int) -> int:
    """The index of the closing quote of the JSON string opening at i (the text's end if none)."""
    j = i + 1
    while j < len(text) and text[j] != '"':
        j += 2 if text[j] == "\\" else 1
    return min(j, len(text) - 1)


def read_hf_config(text: str, seq: int | None) -> ModelFacts:
    """The facts of a Hugging Face config.json's text, at sequence length `seq` (--seq); a
    DescriptionError at the offending key for invalid JSON, an unknown model_type, a missing, mistyped
    or negative size, heads not dividing the hidden size, key/value heads not dividing the heads, a
    head_dim other than hidden / heads, or a seq past a learned-position model's positions."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DescriptionError(f"not valid JSON: {exc.msg}", None, exc.lineno, exc.colno) from None
    except RecursionError:
        raise DescriptionError("not a model configuration: nested too deep") from None
    if not isinstance(config, dict):
        raise DescriptionError("a config.json is a JSON object of the model's keys")
    where = key_positions(text)

    def fail(message: str, key: str | None) -> DescriptionError:
        return DescriptionError(message, key, *where.get(key, (1, 1)))

    kind = config.get("model_type")
    if not isinstance(kind, str) or kind not in FAMILY_OF:  # a list or an object is no family either
        known = ", ".join(FAMILY_OF)
        said = "no 'model_type'" if kind is None else f"model_type {kind!r} is not a family schedc knows"
        raise fail(f"{said} (known: {known})", "model_type" if kind is not None else None)
    keys = _GPT2_KEYS if kind == "gpt2" else _LLAMA_KEYS if kind not in MOE_FAMILIES else _MOE_KEYS
    sizes = {fact: _size(config, key, fail) for fact, key in keys.items()}
    values = dict(FAMILY_OF[kind], **sizes)
    if seq is None:
        raise fail("a config.json gives no sequence length for the run: give --seq N", None)
    values["seq"] = seq
    values.update(_gpt2_facts(config, values, fail) if kind == "gpt2" else _llama_facts(config, values, fail))
    if kind in MOE_FAMILIES:
        values.update(moe_facts(config, kind, fail))
        values.setdefault("ffn", values["moe_ffn"])  # Mixtral and Qwen3-MoE have no dense layer
    dtype = config.get("torch_dtype")
    if dtype is not None and not isinstance(dtype, str):
        raise fail(f"'torch_dtype' must be a string such as \"bfloat16\", got {dtype!r}", "torch_dtype")
    values["dtype"] = _DTYPES.get(dtype, "bf16")
    facts = ModelFacts(**values)
    names = {**keys, "kv_heads": "num_key_value_heads", "max_positions": "n_positions", **key_names(kind)}
    problems = consistency(facts, names)
    if problems:
        fact, message = problems[0]
        raise fail(message, names[fact] if names[fact] in where else None)
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != facts.head_dim:
        raise fail(f"head_dim {head_dim!r} is not hidden_size / num_attention_heads = {facts.head_dim} (schedc "
                   "models heads of hidden / heads)", "head_dim")
    return facts


def _size(config: dict, key: str, fail, default: int | None = None) -> int:
    """A positive integer the config gives at `key` (default when absent or null, as transformers reads
    a null num_key_value_heads, and not None)."""
    value = config.get(key)
    if value is None and default is not None:
        return default
    if value is None:
        said = f"'{key}' is null" if key in config else f"missing key '{key}'"
        raise fail(f"{said} (a positive integer)", key if key in config else None)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_SIZE:
        raise fail(f"'{key}' must be a positive integer up to {MAX_SIZE:,}, got {value!r}", key)
    return value


def _number(config: dict, key: str, fail, default: float) -> float:
    value = config.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise fail(f"'{key}' must be a positive number, got {value!r}", key)
    return float(value)


def _flag(config: dict, key: str, fail, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise fail(f"'{key}' must be true or false, got {value!r}", key)
    return value


def _llama_facts(config: dict, values: dict, fail) -> dict:
    """Llama, Mistral and Qwen2's keys beyond the sizes (absent ones at the transformers defaults)."""
    out = {"kv_heads": _size(config, "num_key_value_heads", fail, values["heads"]),
           "norm_eps": _number(config, "rms_norm_eps", fail, 1e-6),
           "rope_theta": _number(config, "rope_theta", fail, 10000.0),
           "tied_embeddings": _flag(config, "tie_word_embeddings", fail, False),
           "attention": "flash", "window": _window(config, values, fail), "rope_scaling": _rope_scaling(config, fail)}
    for key in ("attention_bias", "mlp_bias"):
        if values["bias"] == "none" and _flag(config, key, fail, False):
            raise fail(f"'{key}' true: schedc models the {values['family']} family without biases", key)
    act = config.get("hidden_act", "silu")
    if act != "silu":  # transformers' LlamaMLP: down(act(gate(x)) * up(x)); schedc's is SwiGLU's silu
        raise fail(f"'hidden_act' {act!r}: schedc builds the {values['family']} family's MLP as SwiGLU, its gate "
                   "through silu", "hidden_act")
    return out


def _gpt2_facts(config: dict, values: dict, fail) -> dict:
    """GPT-2's keys beyond the sizes: n_inner (absent or null: 4 x n_embd), n_positions, the epsilon,
    the activation (absent: gelu_new, transformers' GPT2Config default)."""
    inner = config.get("n_inner")
    return {"ffn": 4 * values["hidden"] if inner is None else _size(config, "n_inner", fail),
            "max_positions": _size(config, "n_positions", fail, 1024),
            "norm_eps": _number(config, "layer_norm_epsilon", fail, 1e-5),
            "tied_embeddings": _flag(config, "tie_word_embeddings", fail, True),
            "gelu_approximate": _gelu(config, fail)}


# GPT-2's activation_function -> the GeLU's approximation (facts.GELU_APPROXIMATIONS): transformers'
# gelu is exact; gelu_new, gelu_fast and gelu_pytorch_tanh are 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
_GELUS = {"gelu": "none", "gelu_new": "tanh", "gelu_fast": "tanh", "gelu_pytorch_tanh": "tanh"}


def _gelu(config: dict, fail) -> str:
    act = config.get("activation_function", "gelu_new")
    if not isinstance(act, str) or act not in _GELUS:
        raise fail(f"'activation_function' {act!r}: schedc builds GPT-2's MLP with a GeLU "
                   f"({', '.join(_GELUS)})", "activation_function")
    return _GELUS[act]


def _window(config: dict, values: dict, fail) -> int | None:
    """Mistral's sliding_window (null: none); Qwen2's where use_sliding_window is true, on the layers
    from max_window_layers on (transformers' layer_types): every layer (0) or none (all layers below
    it), a window on some layers only refused. Other families' configs have none."""
    family = values["family"]
    if family == "qwen2":
        if not _flag(config, "use_sliding_window", fail, False):
            return None
        below = config.get("max_window_layers", 28)
        if below != 0 and _size(config, "max_window_layers", fail, 28) < values["layers"]:
            raise fail(f"'max_window_layers' {below}: a sliding window on layers {below} to {values['layers'] - 1} "
                       "only; schedc models one attention span for every layer (0: all, num_hidden_layers: none)",
                       "max_window_layers")
        return _size(config, "sliding_window", fail) if below == 0 else None
    if family == "mistral" and config.get("sliding_window") is not None:
        return _size(config, "sliding_window", fail)
    return None


ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope_scaling(config: dict, fail) -> tuple[float, float, float, int] | None:
    """rope_scaling of rope_type "llama3" (Llama 3.1, 3.2) as (factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings); null or "default": None; another type refused by name."""
    scaling = config.get("rope_scaling")
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise fail(f"'rope_scaling' must be an object or null, got {scaling!r}", "rope_scaling")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise fail(f"rope_scaling of rope_type {kind!r}: schedc applies \"llama3\" (Llama 3.1's) alone", "rope_scaling")
    values = []
    for key in ROPE_SCALING_KEYS:
        value = scaling.get(key)
        whole = key == "original_max_position_embeddings"
        if (not isinstance(value, int if whole else (int, float)) or isinstance(value, bool) or not 0 < value
                <= MAX_SIZE):
            raise fail(f"rope_scaling's '{key}' must be a positive {'integer' if whole else 'number'}, got {value!r}",
                       "rope_scaling")
        values.append(value if whole else float(value))
    if not values[2] > values[1]:
        raise fail(f"rope_scaling's 'high_freq_factor' ({values[2]}) must exceed 'low_freq_factor' ({values[1]})",
                   "rope_scaling")
    return tuple(values)
