"""The model description the cost model reads: a TOML file's keys (the sizes of `schedc check --model`
plus vocab, ffn, attention and the architecture's facts: kv_heads, mlp, norm, positions, ...) or a Hugging
Face config.json (schedc.descriptions.hf), as one ModelSpec; every error located (exit 2).

    layers = 96      hidden = 12288      heads = 96      seq = 2048      vocab = 51200
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..descriptions import DescriptionError, ModelFacts, is_hf_config, read_hf_config, resolve_model
from ..descriptions.hf import key_positions
from ..descriptions.facts import (ATTENTION_KERNELS, DTYPE_BYTES, FACT_FIELDS, FACT_NAMES, MAX_SIZE, MOE_FACT_FIELDS,
                                  consistency)
from ..diagnostics import USAGE, Diagnostic, SchedError, Source, Span, error
from ..inputs import MAX_DESCRIPTION_BYTES, load_json, read_source
from .located import locate, read_toml, unknown_keys


@dataclass(frozen=True, slots=True)
class ModelSpec(ModelFacts):
    """A decoder's facts (schedc.descriptions.ModelFacts: Megatron's GPT by default, or a Llama-family
    model's grouped-query attention, SwiGLU, RMSNorm, rotary positions and untied embeddings) with the
    microbatch size a model file may give for the bytes check."""

    microbatch_size: int | None = None  # the bytes check's key; --microbatch-size wins


_MODEL_FIELDS = {"layers": int, "hidden": int, "heads": int, "seq": int, "vocab": int, "ffn": int,
                 "dtype": str, "microbatch_size": int, "attention": str}
_MODEL_OPTIONAL = {"ffn", "dtype", "microbatch_size", "attention"}
_CHOICES = {"dtype": tuple(DTYPE_BYTES), "attention": ATTENTION_KERNELS}  # a str field's values
_MODEL_FIELDS.update({key: kind for key, (kind, _) in FACT_FIELDS.items()})  # the architecture's facts
_MODEL_OPTIONAL.update(FACT_FIELDS)
_CHOICES.update({key: choices for key, (_, choices) in FACT_FIELDS.items() if choices})
_MODEL_FIELDS.update({key: kind for key, (kind, _) in MOE_FACT_FIELDS.items()})  # experts, MLA (moe.py)
_MODEL_OPTIONAL.update(MOE_FACT_FIELDS)
_CHOICES.update({key: choices for key, (_, choices) in MOE_FACT_FIELDS.items() if choices})

def read_fields(table: dict, source: Source, fields: dict[str, type], optional: set[str],
                also: tuple[str, ...] = ()) -> tuple[dict, list[Diagnostic]]:
    """A model table's values and what is wrong with them, each located: unknown keys (those in `also`
    are read by another consumer and let through), missing required ones, integers that are not
    positive, strings not among their key's choices (dtype, attention, mlp, norm, ...), flags that are
    not booleans. The one field rule for every model description."""
    known = [*fields, *also]
    diags: list[Diagnostic] = unknown_keys([k for k in table if k not in known],
                                           lambda k: f"unknown key '{k}' (keys: {', '.join(known)})",
                                           lambda k: locate(source, k))
    values = {}
    for key, kind in fields.items():
        value = table.get(key)
        if value is None:
            if key not in optional:
                needed = ", ".join(k for k in fields if k not in optional)
                diags.append(error(f"missing key '{key}' (the model needs {needed})", Span(1, 1)))
            continue
        want = _wrong(key, kind, value)
        if want:
            diags.append(error(f"'{key}' must be {want}, got {value!r}", locate(source, key)))
        values[key] = float(value) if kind is float and not want else value
    return values, diags


def _wrong(key: str, kind: type, value) -> str | None:
    """What a model field's value must be, when it is not (None when it is)."""
    if kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if isinstance(value, bool):
        return _WANT[kind](key)
    if kind is int:
        return None if isinstance(value, int) and 0 < value <= MAX_SIZE else _WANT[int](key)
    if kind is float:
        return None if isinstance(value, (int, float)) and 0 < value <= MAX_SIZE else _WANT[float](key)
    return None if value in _CHOICES.get(key, DTYPE_BYTES) else _WANT[str](key)


_WANT = {int: lambda key: f"a positive integer up to {MAX_SIZE:,}",
         float: lambda key: f"a positive number up to {MAX_SIZE:g}",
         str: lambda key: "one of " + ", ".join(_CHOICES.get(key, DTYPE_BYTES))}


def load_model_spec(path: str, seq: int | None = None) -> ModelSpec:
    """Read a model description, a TOML file or a Hugging Face config.json (schedc.descriptions), at the
    sequence length `seq` (--seq) when given; every bad, missing or inconsistent field is reported,
    located (exit 2)."""
    resolved = resolve_model(str(path))
    if is_hf_config(resolved):
        return _load_hf(resolved, seq)
    table, source = read_toml(resolved, "model description")
    values, diags = read_fields(table, source, _MODEL_FIELDS, _MODEL_OPTIONAL)
    if diags:
        raise SchedError(diags, source, kind=USAGE)
    values.setdefault("ffn", 4 * values["hidden"])
    if seq is not None:
        values["seq"] = seq
    spec = ModelSpec(**values)
    problems = consistency(spec)
    if problems:
        key, message = problems[0]
        raise SchedError(error(message, locate(source, key if key in table else "heads")), source, kind=USAGE)
    return spec


def model_layers(path: str) -> int:
    """The layers of a model description (what a schedule's tasks are given without --cluster): a
    config.json's need no --seq for them."""
    return load_model_spec(path, 1 if is_hf_config(resolve_model(str(path))) else None).layers


def _load_hf(path: Path, seq: int | None) -> ModelSpec:
    """A Hugging Face config.json's facts as a ModelSpec (schedc.descriptions.read_hf_config), its
    errors located in the file (exit 2)."""
    if not path.exists():
        raise SchedError(error("cannot read model description: No such file or directory"),
                         Source(str(path), ""), kind=USAGE)
    source = read_source(path, "model description", MAX_DESCRIPTION_BYTES)
    load_json(source, "model description")  # JSON syntax, nesting and integer caps, located
    try:
        facts = read_hf_config(source.text, seq)
    except DescriptionError as exc:
        width = len(exc.key) + 2 if exc.key else 1
        raise SchedError(error(exc.message, Span(exc.line, exc.col, exc.line, exc.col + width)), source,
                         kind=USAGE) from None
    return ModelSpec(**{name: getattr(facts, name) for name in FACT_NAMES})


# a fact -> the key a config.json gives it under (Llama's scheme; GPT-2's where it differs)
_HF_KEYS = {"layers": ("num_hidden_layers", "n_layer"), "hidden": ("hidden_size", "n_embd"),
            "heads": ("num_attention_heads", "n_head"), "kv_heads": ("num_key_value_heads", "num_attention_heads",
                                                                      "n_head"),
            "ffn": ("intermediate_size", "n_inner"), "vocab": ("vocab_size",), "seq": (),
            "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
            "moe_ffn": ("moe_intermediate_size", "intermediate_size"), "window": ("sliding_window",)}


def model_span(source: Source, fact: str) -> Span:
    """Where a model description states `fact`: its TOML key, or in a config.json the key it is read
    from (the first of them written); the file's start when it is not written (a default)."""
    if not source.path.endswith(".json"):
        return locate(source, fact if fact != "kv_heads" or "kv_heads" in source.text else "heads")
    where = key_positions(source.text)
    for key in _HF_KEYS.get(fact, ()):
        if key in where:
            line, col = where[key]
            return Span(line, col, line, col + len(key) + 2)
    return Span(1, 1)
