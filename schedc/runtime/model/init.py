# Weights without the whole model: the pieces are built with their parameters on the meta device, and a
# rank gives weights only to the pieces of its own stages, each module seeded from (--seed, the module's
# global name), so a rank, a replica and the one-process reference draw the same numbers for a weight
# whichever other pieces they hold.
#
# A parameter is deferred where its module defines reset_parameters (nn.Linear, nn.Embedding,
# nn.LayerNorm, a user module that declares one): materializing allocates it and calls that method under
# the module's seed (a module naming `seed_name` is seeded as that module: a tied output layer as the
# word embedding, model/tied.py). Any other parameter (a user's nn.Parameter(torch.randn(...)), RMSNorm's ones) is
# kept as its constructor made it, on the host, drawn from the global generator seeded once with --seed
# in construction order, the same on every rank.
from __future__ import annotations

import copy
import hashlib
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def deferred_parameters():
    """While the block runs, a parameter registered by a module that defines reset_parameters is moved to
    the meta device (no memory; its reset_parameters then runs on meta and draws nothing)."""
    register = nn.Module.register_parameter

    def deferring(module: nn.Module, name: str, param):
        if (param is not None and hasattr(module, "reset_parameters") and param.device.type != "meta"
                and not isinstance(param, nn.parameter.UninitializedParameter)):  # a lazy module's: left alone
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = deferring
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def module_seed(seed: int, name: str) -> int:
    """A 63-bit seed for the module of global name `name` (stable across processes and platforms).

    >>> module_seed(0, "blocks.3.fc") == module_seed(0, "blocks.3.fc") != module_seed(1, "blocks.3.fc")
    True
    """
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2 ** 63 - 1)


def materialize(prefix: str, piece: nn.Module, seed: int, device: torch.device | str = "cpu") -> None:
    """Give the piece named `prefix` its weights: each module owning meta parameters is allocated on
    `device` and reset under its own seed (module_seed of its global name)."""
    for name, module in piece.named_modules():
        if not any(p.is_meta for p in module.parameters(recurse=False)):
            continue
        for key, param in module._parameters.items():  # its buffers stay as its constructor made them
            if param is not None and param.is_meta:
                module._parameters[key] = nn.Parameter(torch.empty_like(param, device=device),
                                                       requires_grad=param.requires_grad)
        with torch.random.fork_rng(devices=[]):
            own = f"{prefix}.{name}" if name else prefix
            torch.manual_seed(module_seed(seed, getattr(module, "seed_name", None) or own))  # a tied copy: its twin's
            with torch.no_grad():
                module.reset_parameters()


def materialize_pieces(pieces: list[tuple[str, nn.Module]], seed: int, keep=None) -> None:
    """Materialize the pieces named in `keep` (every piece when None)."""
    for name, piece in pieces:
        if keep is None or name in keep:
            materialize(name, piece, seed)


def is_materialized(piece: nn.Module) -> bool:
    return not any(p.is_meta for p in piece.parameters())


def placeholder(piece: nn.Module) -> nn.Module:
    """The piece itself where it has its weights, else a copy with uninitialized host weights (to run a
    forward for shapes and dtypes only)."""
    if is_materialized(piece):
        return piece
    return copy.deepcopy(piece).to_empty(device="cpu")
