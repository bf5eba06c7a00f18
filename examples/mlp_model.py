"""A user model for `schedc run --model-code mlp_model:build` (docs/models.md): token ids in, logits out,
a list of named pieces the runtime splits over the plan's stages. Each residual block declares its
tensor-parallel form (first linear column-parallel, second row-parallel, as Megatron's MLP) and names
a recompute core (what --recompute selective replays).

    schedc compile 1f1b -D p=2 -D m=4 -o out/mlp
    cd examples && schedc run ../out/mlp/plan.json --model-code mlp_model:build --layers 4 --steps 3
"""
from __future__ import annotations

import torch
from torch import nn

from schedc.runtime.model import ModelConfig
from schedc.runtime.execution.recompute import recomputed
from schedc.runtime.tensor_parallel import ColumnParallelLinear, RowParallelLinear, TensorGroup, declare


class ResidualMLP(nn.Module):
    """x + W2 gelu(W1 norm(x)); the activation between W1 and W2 is its recompute core."""

    recompute_core = False  # --recompute selective sets it: gelu(W1 .) is replayed in backward

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def inner(self, h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc1(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(recomputed(self.recompute_core, self.inner, self.norm(x)))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        return ParallelResidualMLP(self, tp)


class ParallelResidualMLP(nn.Module):
    """The same block over a tensor group: fc1's output features and fc2's input features cut in t,
    the norm replicated; the parameters keep the full block's names (norm, fc1, fc2)."""

    recompute_core = False

    def __init__(self, full: ResidualMLP, tp: TensorGroup):
        super().__init__()
        self.norm = full.norm
        self.fc1, self.fc2 = ColumnParallelLinear(full.fc1, tp), RowParallelLinear(full.fc2, tp)
        declare(self, {}, tp)  # the norm: replicated (its gradient partial under sequence parallelism)

    inner = ResidualMLP.inner
    forward = ResidualMLP.forward


class Embed(nn.Module):
    """Token ids [b, t] -> [b, t, width]: token and position embeddings (replicated under --tp)."""

    def __init__(self, cfg: ModelConfig, width: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(cfg.vocab, width), nn.Embedding(cfg.seq, width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


def build(cfg: ModelConfig) -> list[tuple[str, nn.Module]]:
    """The model: an embedding, cfg.layers residual MLP blocks, a norm and a head to [b, t, vocab]
    logits. The width is cfg.hidden, or `width` from the model TOML (ModelConfig.extra)."""
    width = int(cfg.extra.get("width", cfg.hidden))
    blocks = [(f"blocks.{i}", ResidualMLP(width)) for i in range(cfg.layers)]
    head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, cfg.vocab))
    return [("embed", Embed(cfg, width)), *blocks, ("head", head)]
