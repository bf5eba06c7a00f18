"""Tied word embeddings (a config's tie_word_embeddings: GPT-2, Qwen2.5 0.5B-3B, Llama 3.2 1B and 3B)
across pipeline stages, as Megatron-LM ties them: the word embedding lives on the first stage, the output
layer on the last stage holds a copy that starts equal (TiedHead draws it as TiedEmbedding is drawn), and after the backward the two gradients are summed over the embedding group, the ranks of the
first and the last stage in one (replica, context rank, tensor rank) lane, before the data-parallel
reduction (ZeRO's reduce-scatter too) and the optimizer's step: both copies take the same update and stay
equal. Under --tp both are vocabulary-parallel, each tensor rank's rows summed with the same rows.

    p = 2:        rank 0 [embed_tokens E] ... rank 1 [lm_head L = E]   after B: E.grad = L.grad = sum of both
    p = 1:        one stage holds both ends: lm_head's weight is the embedding's tensor (tie_ends)
    a V shape:    the first and the last stage on one rank: two stages, so a copy, summed on the rank

--save-grads writes the embedding's name alone (model.embed_tokens.weight, the summed gradient), as the
one-process reference, whose single stage holds one tensor.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from schedc.layout import rank_at

EMBEDDING, OUTPUT = "model.embed_tokens.weight", "lm_head.weight"


def tie_ends(pieces) -> None:
    """Where one stage's pieces hold both ends of a tied model, make lm_head's weight the embedding's
    tensor (after each was given its weights: they start equal)."""
    first, last = pieces[0], pieces[-1]
    if len(pieces) > 1 and getattr(last, "tied", False) and hasattr(first, "embed_tokens"):
        last.lm_head.weight = first.embed_tokens.weight


def is_tied(runs: list[list]) -> bool:
    """Whether the model's output layer is a tied copy (the decoder's Output built with tied embeddings)."""
    return bool(runs) and bool(runs[-1]) and getattr(runs[-1][-1][1], "tied", False)


def embedding_ranks(plan) -> list[int]:
    """The plan ranks of the first and the last stage (one where a V shape puts both on one rank)."""
    pipelines = plan.meta["pipelines"]
    if len(pipelines) > 1:
        raise ValueError("tied embeddings: the plan has several pipelines (each end stage's replicas sync "
                         "their gradients by SYNC_GRAD first); compile a plan of one pipeline, or untie them")
    placement = pipelines[0]["placement"]
    return sorted({placement[0], placement[-1]})


def tied_problem(plan, opts) -> str | None:
    """Why a tied model cannot run this plan (None when it can): several pipelines (embedding_ranks), or
    K-FAC's tasks, which precondition lm_head as a linear layer and not the embedding."""
    if not opts.model_config.tied_embeddings or opts.model_code is not None or plan.meta["stages"] == 1:
        return None
    if "schedc.runtime.kfac" in opts.tasks:
        return ("tied embeddings with K-FAC's tasks: K-FAC preconditions lm_head as a linear layer and not the "
                "embedding, which would move the last stage's copy apart; untie them")
    try:
        embedding_ranks(plan)
    except ValueError as exc:
        return str(exc)
    return None


def tied_pair(plan, runs: list[list], stages: dict, world, timeout: float) -> TiedEmbeddings | None:
    """A tied model's embedding pair on this rank and its group (collective: every rank makes the
    groups), or None: untied, or one stage holds both ends (one tensor)."""
    if not is_tied(runs) or len(runs) == 1:
        return None
    ranks = embedding_ranks(plan)  # one pipeline: tied_problem checked it before the run
    return TiedEmbeddings(stages, len(runs) - 1, embedding_group(world, ranks, timeout), ranks)


class TiedEmbeddings:
    """This rank's tensors of the tied pair (stage 0's embedding, the last stage's copy) and the group
    that sums their gradients (None where the rank holds both ends or the group is one rank)."""

    def __init__(self, stages: dict, last: int, group, ranks: list[int]):
        self.group, self.ranks = group, ranks
        self.tensors = [p for s, name in ((0, EMBEDDING), (last, OUTPUT)) if s in stages
                        for n, p in stages[s].global_parameters() if n == name]
        self.copies = [p for n, p in stages[last].global_parameters() if n == OUTPUT] if last in stages else []

    @torch.no_grad()
    def sum_gradients(self) -> None:
        """Every tensor of the pair on this rank gets the sum of the pair's gradients over the group."""
        if not self.tensors:
            return
        total = self.tensors[0].grad.clone()
        for p in self.tensors[1:]:
            total += p.grad
        if self.group is not None:
            dist.all_reduce(total, group=self.group)
        for p in self.tensors:
            p.grad.copy_(total)


def embedding_group(world, plan_ranks: list[int], timeout: float):
    """One process group of `plan_ranks` in every (replica, context rank, tensor rank), created in one
    order on every rank (collective); this rank's, or None when it is in none or the group is one rank."""
    if len(plan_ranks) < 2:
        return None
    mine, wait = None, timedelta(seconds=timeout)
    for d in range(world.dp):
        for c in range(world.cp):
            for k in range(world.tp):
                ranks = [rank_at(r, d, k, world.tp, world.dp, c, world.cp) for r in plan_ranks]
                handle = dist.new_group(ranks, timeout=wait)
                mine = handle if world.rank in ranks else mine
    return mine


INIT_STD = 0.02  # Hugging Face's initializer_range default (and Megatron-LM's --init-method-std)


class TiedEmbedding(nn.Embedding):
    """The word embedding of a tied model, drawn from N(0, 0.02) as Hugging Face initialises it: the
    table is also the output layer, whose logits nn.Embedding's N(0, 1) would make ~8 wide at hidden 64."""

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=INIT_STD)


class TiedHead(nn.Linear):
    """The output layer of a tied model: its weight [vocab, hidden] drawn as TiedEmbedding's, from the
    embedding's seed (init.materialize reads `seed_name`), so the last stage's copy starts equal to the
    first stage's embedding."""

    seed_name = "model.embed_tokens"

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=INIT_STD)
