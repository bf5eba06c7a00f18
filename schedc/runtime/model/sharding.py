"""The distributed optimizer (--distributed-optimizer; ZeRO stage 1, Megatron-LM's
--use-distributed-optimizer): with --dp D, each data-parallel rank keeps the optimizer state of 1/D of
its stages' weights and steps only those; the updated shards are then all-gathered into every
replica's weights. The update is element by element (AdamW, SGD), so the weights are those of the
unsharded run.

    stage weights (one flat buffer, padded to a multiple of D):  [ w0 w1 w2 w3 w4 w5 | pad ]
    data-parallel rank 0 steps [w0 w1 w2 w3], rank 1 [w4 w5 pad pad]; all-gather -> both hold all

The gradients are all-reduced whole, as without it (K-FAC's preconditioning and --save-grads read
them whole), so this runtime exchanges an all-reduce and an all-gather per step where Megatron-LM's
reduce-scatter and all-gather move two thirds of those bytes; the memory saved is the optimizer state.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..execution.executor import ExecutionError, flat_views


class Shards:
    """A rank's stages' weights as flat buffers (each parameter a view into its stage's) and this
    data-parallel rank's shard of each, a parameter of its own whose gradient is the matching slice of
    the stage's flat gradient (executor.attach_flat_grads, padded alike)."""

    level = 1  # the ZeRO stage (zero.ZeroShards: 2 and 3)

    def __init__(self, stages: dict, dp: int, index: int, group, ranks: list[int]):
        self.group, self.ranks, self.index, self.dp = group, ranks, index, dp
        self.parts: list[tuple[torch.Tensor, torch.nn.Parameter, int]] = []  # (flat weights, shard, offset)
        for stage in stages.values():
            flat = flatten_weights(stage, dp)
            size = flat.numel() // dp
            lo = index * size
            shard = torch.nn.Parameter(flat[lo:lo + size].clone())
            shard.grad = stage.flat_grad[lo:lo + size]
            self.parts.append((flat, shard, lo))

    def parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps: this rank's shards."""
        return [shard for _, shard, _ in self.parts]

    @torch.no_grad()
    def gather(self) -> None:
        """Every replica's weights from the updated shards (after the optimizer's step)."""
        for flat, shard, _ in self.parts:
            try:
                dist.all_gather(list(flat.chunk(self.dp)), shard.detach(), group=self.group)
            except Exception as exc:
                raise ExecutionError(f"the weights' all-gather over ranks {self.ranks} failed, one of them is "
                                     f"probably lost: {type(exc).__name__}") from exc

    def before(self, instr) -> None:
        """Before an instruction runs (zero.ZeroShards gathers what it reads)."""

    def after(self, instr) -> None:
        """After an instruction ran (zero.ZeroShards reshards)."""

    def after_step(self) -> None:
        """After the optimizer's step."""
        self.gather()

    @torch.no_grad()
    def refresh(self) -> None:
        """The shards from the weights (after a checkpoint's weights were loaded into them)."""
        for flat, shard, lo in self.parts:
            shard.copy_(flat[lo:lo + shard.numel()])


def flatten_weights(stage, multiple: int) -> torch.Tensor:
    """One flat buffer of the stage's trainable weights, its length a multiple of `multiple` (zeros
    after them), each parameter's data a view into it; the buffer."""
    params = [p for p in stage.parameters() if p.requires_grad]
    flat, views = flat_views(params, multiple, params[0].dtype if params else torch.float32)
    for p, view in zip(params, views):
        view.copy_(p.data)
        p.data = view
    return flat
