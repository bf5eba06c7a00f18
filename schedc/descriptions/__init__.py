"""The shipped description files (models in schedc/models/, clusters in schedc/clusters/) found by name:
one lookup for the compiler's --model and --cluster and the runtime's --model. Imports nothing of
schedc, so the runtime may use it (it reads the files itself).

A model description is a TOML file or a Hugging Face config.json (hf.py); either maps to one
facts.ModelFacts, the architecture the cost model predicts and the runtime builds."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .facts import DescriptionError, ModelFacts, consistency, parameters
from .hf import read_hf_config

__all__ = ["DescriptionError", "ModelFacts", "consistency", "parameters", "read_hf_config", "is_hf_config",
           "resolve_model", "known_models", "code_given_as_model", "library", "find", "library_models"]

MODELS_PACKAGE = "schedc.models"
CLUSTERS_PACKAGE = "schedc.clusters"


def library(package: str) -> list[Path]:
    """The TOML files a library package ships (clusters, models), by name."""
    root = resources.files(package)
    return sorted(Path(str(entry)) for entry in root.iterdir() if entry.name.endswith(".toml"))


def find(name: str, files: list[Path]) -> Path | None:
    """A path as given if it exists (or names a folder), else the library file of that name or file
    name (`gpt-1.7b`, `gpt-1.7b.toml`), else None."""
    path = Path(name)
    if path.exists() or len(path.parts) > 1:
        return path
    return next((candidate for candidate in files if name in (candidate.stem, candidate.name)), None)


def library_models() -> list[Path]:
    return library(MODELS_PACKAGE)


def resolve_model(name: str) -> Path:
    """A path as given if it exists, else the library model description of that name (`gpt-175b`); a
    name found nowhere is returned as a path, which its reader says is missing."""
    return find(name, library_models()) or Path(name)


def is_hf_config(path: str | Path) -> bool:
    """Whether a model description is a Hugging Face config.json (read by hf.read_hf_config), not TOML:
    a file whose name ends in .json."""
    return Path(path).suffix == ".json"


def known_models() -> str:
    """The library's model names, for a message: `gpt-1.7b, gpt-175b, ...`."""
    return ", ".join(p.stem for p in library_models())


def code_given_as_model(name: str) -> str | None:
    """A refusal for `--model pkg.mod:fn`: a value with ':' that names no file is model code, which
    --model-code takes (--model is a model description); None for anything else."""
    if ":" not in name or Path(name).exists():
        return None
    return (f"--model {name}: {name!r} names no file; model code (PKG.MOD:FN) goes to --model-code "
            f"{name} (--model takes a model description: a TOML file, a Hugging Face config.json or a library name such as gpt-1.7b)")
