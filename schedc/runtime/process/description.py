# The runtime's model description (--model): a model TOML file or a Hugging Face config.json, read as
# the compiler reads them (schedc.descriptions: a library name found the same way, a config.json's facts
# by read_hf_config at --seq), into ModelConfig's sizes and facts and a TOML file's other keys (a user
# model's ModelConfig.extra). options.py turns its errors into usage errors (exit 2).
from __future__ import annotations

import os
import tomllib

from schedc.descriptions import DescriptionError, is_hf_config, known_models, read_hf_config, resolve_model

from ..errors import UserError
from ..model.experts import MOE_FACTS
from ..model.gpt import FACTS, fact_problem

MAX_CONFIG_BYTES = 1024 * 1024


class DescriptionFileError(UserError):
    """A model description that cannot be read, or states what cannot be built; `located`: a
    config.json's error at its place, `path:line:col: error: message`."""

    def __init__(self, message: str, located: bool = False):
        super().__init__(message)
        self.located = located


def read_description(name: str, seq: int | None) -> tuple[dict, dict]:
    """--model's sizes and facts (and a TOML file's other keys): a model TOML file or a Hugging Face
    config.json (schedc.descriptions.read_hf_config, at --seq), read as the compiler reads them (the
    same refusals, a FIFO or device unopened, a deep nest or a huge integer); a library name is found
    as the compiler finds it."""
    path = str(resolve_model(name))
    if not os.path.exists(path):
        raise DescriptionFileError(f"--model {name}: no such file or library model (the library's: {known_models()})")
    if not os.path.isfile(path):
        raise DescriptionFileError(f"--model {name}: not a regular file (a FIFO, a device or a directory)")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)  # a device (/dev/zero) never ends
        if len(data) > MAX_CONFIG_BYTES:
            raise DescriptionFileError(f"--model {path}: larger than {MAX_CONFIG_BYTES // 1024} KiB")
        text = data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise DescriptionFileError(f"--model {path}: {exc}") from None
    if is_hf_config(path):
        return _hf_facts(path, text, seq), {}
    return _read_toml(path, text)


# what the runtime takes of a config.json's facts (schedc.descriptions.ModelFacts): a mixture of experts'
# too (runtime/model/experts.py says which it builds)
HF_FACTS = ("layers", "hidden", "heads", "vocab", "seq", *FACTS, *MOE_FACTS, "rope_scaling")
# the runtime's sizes (a TOML file's, --layers and the other size options') and its default model's
DEFAULT_MODEL = {"layers": 4, "hidden": 64, "heads": 4, "seq": 64, "vocab": 256, "mb_size": 4}


def _hf_facts(path: str, text: str, seq: int | None) -> dict:
    try:
        facts = read_hf_config(text, seq)
    except DescriptionError as exc:
        raise DescriptionFileError(f"{path}:{exc.line}:{exc.col}: error: {exc.message}", located=True) from None
    except ValueError as exc:  # an integer past Python's int-to-str limit
        raise DescriptionFileError(f"--model {path}: {str(exc).split(';')[0]}") from None
    if facts.mla:
        raise DescriptionFileError(f"--model {path}: {not_dense(0, facts.mla)}")
    return {key: getattr(facts, key) for key in HF_FACTS}


def not_dense(experts: int, mla: bool) -> str:
    """Why the runtime does not build the description: latent attention, or experts stated in a model TOML
    file (it builds a mixture of experts from a Hugging Face config.json: runtime/model/experts.py)."""
    if experts:
        return (f"a mixture of {experts} experts in a model TOML file: the runtime builds Mixtral-style experts from "
                "a Hugging Face config.json (model_type mixtral); schedc simulate and tune predict this model")
    return ("multi-head latent attention: the runtime builds standard and grouped-query attention; schedc "
            "simulate and tune predict this model")


def _read_toml(path: str, text: str) -> tuple[dict, dict]:
    """A model TOML file's sizes and facts, and its other keys (ModelConfig.extra)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DescriptionFileError(f"--model {path}: {exc}") from None
    except RecursionError:
        raise DescriptionFileError(f"--model {path}: arrays or tables nested too deeply") from None
    except ValueError as exc:  # an integer past Python's int-to-str limit
        raise DescriptionFileError(f"--model {path}: {str(exc).split(';')[0]}") from None
    table = {**{k: v for k, v in doc.items() if k != "model"}, **doc.get("model", {})}
    if "microbatch_size" in table:  # schedc's model files name mb_size so
        size = table.pop("microbatch_size")
        if table.setdefault("mb_size", size) != size:
            raise DescriptionFileError(f"--model {path}: mb_size {table['mb_size']!r} and microbatch_size {size!r} differ")
    known = {*DEFAULT_MODEL, *FACTS, "rope_scaling"}  # a TOML's experts: refused (options.py); other keys, extra
    values = {k: v for k, v in table.items() if k in known}
    for key, value in values.items():
        problem = fact_problem(key, value) if key in FACTS else None
        if key not in FACTS and (not isinstance(value, int) or isinstance(value, bool)):
            problem = f"{key} must be an integer, got {value!r}"
        if problem:
            raise DescriptionFileError(f"--model {path}: {problem}")
    return values, {k: v for k, v in table.items() if k not in known}
