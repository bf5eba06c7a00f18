"""Context parallelism's sequence arithmetic and attention (--cp N): the load-balanced chunks, their
positions, and causal attention over the whole sequence from each rank's own queries.

The sequence is split into 2N equal chunks and context rank i holds chunks i and 2N-1-i (Megatron-Core's
and Llama 3's balance: under the causal mask an early chunk attends to few keys and a late one to many,
so every rank gets one of each and the same work):

    N = 2, sequence of 8:  chunks [0 1][2 3][4 5][6 7]   rank 0 holds [0 1 6 7], rank 1 [2 3 4 5]

Attention exchanges keys and values by an all-gather per layer, as Llama 3 did (Dubey et al. 2024, 3.3.2):
each rank's queries attend to every rank's keys and values under the causal mask of their global
positions. On gloo and at these sizes an all-gather is exact in one collective and its backward one
reduce-scatter, where a ring of point-to-point steps (ring attention) would add an online-softmax merge
per step; the cost model times the same all-gather. Positions travel with the tokens (a tensor per rank,
not a first offset), so learned positions and rotary embeddings both take the rank's own.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.distributed as dist


def chunk_ranges(seq: int, cp: int, rank: int) -> tuple[range, range]:
    """The two chunks of `seq` positions context rank `rank` of `cp` holds: chunks rank and 2cp-1-rank.

    >>> chunk_ranges(8, 2, 0), chunk_ranges(8, 2, 1)
    ((range(0, 2), range(6, 8)), (range(2, 4), range(4, 6)))
    """
    size = seq // (2 * cp)
    first, second = rank, 2 * cp - 1 - rank
    return range(first * size, (first + 1) * size), range(second * size, (second + 1) * size)


def positions(seq: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """The global positions of the rank's tokens, in the order it holds them (its two chunks joined)."""
    return torch.tensor([p for chunk in chunk_ranges(seq, cp, rank) for p in chunk], device=device)


def take(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """The rank's two chunks of a tensor whose dimension `dim` is the whole sequence, joined."""
    low, high = chunk_ranges(x.shape[dim], cp, rank)
    return torch.cat([x.narrow(dim, low.start, len(low)), x.narrow(dim, high.start, len(high))], dim=dim)


def causal_mask(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """True where a query may attend a key: the key's global position is not after the query's."""
    return query_positions[:, None] >= key_positions[None, :]


def exchange(k: torch.Tensor, v: torch.Tensor, mine: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The keys and values the rank's [b, heads, t, d] queries attend to, over the whole sequence, and
    their causal mask: `gather` joins every context rank's [.., t, ..] along the sequence (dimension 2),
    the keys' global positions joined the same way (model.attention_core takes the three)."""
    keys, values, where = gather(k), gather(v), gather(mine.view(1, 1, -1, 1).float())
    return keys, values, causal_mask(mine, where.view(-1).long())


@dataclass(frozen=True, slots=True)
class Context:
    """This rank's place in the sequence: its tokens' positions and the gather over its context group."""

    positions: torch.Tensor
    gather: Callable[[torch.Tensor], torch.Tensor]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return exchange(k, v, self.positions.to(k.device), self.gather)


ACTIVE: list[Context] = []  # the run's context (none with --cp 1); chunks.extend and chunks.positions read it


def configure(seq: int, cp: int, rank: int, group) -> None:
    """Set this process's context for the run (--cp 1: none); a process running several plans calls it
    for each."""
    ACTIVE.clear()
    if cp > 1:
        ACTIVE.append(Context(positions(seq, cp, rank), gather_over(group, cp)))


class GatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dimension 2) over the context group; the backward reduce-scatters
    the gradient (each rank's keys feed every rank's queries, so their gradient is the sum)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, size: int) -> torch.Tensor:
        ctx.group, ctx.size = group, size
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        parts = [part.contiguous() for part in grad.chunk(ctx.size, dim=2)]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts, group=ctx.group)
        return out, None, None


def gather_over(group, size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The `gather` of context_attention over a process group of `size` context ranks."""
    return lambda x: GatherSequence.apply(x, group, size)


class ContextData:
    """A dataset whose batches keep this context rank's chunks of every sequence (tokens and targets)."""

    def __init__(self, dataset, cp: int, rank: int):
        self.dataset, self.cp, self.rank = dataset, cp, rank

    def batch(self, step: int, microbatches: int, size: int):
        whole = self.dataset.batch(step, microbatches, size)
        return replace(whole, tokens=take(whole.tokens, self.cp, self.rank), targets=take(whole.targets, self.cp, self.rank))
