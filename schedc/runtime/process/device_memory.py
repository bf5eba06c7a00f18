# One rank's share of a step on its GPU, checked before torchrun starts when the ranks run on CUDA: the
# weights, gradients and optimizer state of the stages the plan places on the rank, and the activations
# its microbatches in flight keep, against one GPU's memory (on CPU ranks the whole job is checked
# against this host's memory instead: launch._check_memory).
#
# The arithmetic is the default GPT's: 12 h^2 + 13 h weights a layer, the token and position embeddings
# on the first stage and the final norm and LM head on the last; 4 bytes a weight, 4 a gradient, 8 more
# for AdamW's two moments; a layer keeps about 16 hidden-wide fp32 values a token for its backward and
# no s x s attention scores (scaled_dot_product_attention's fused kernels keep none).
from __future__ import annotations

from schedc.layout import split_layers
from schedc.ops import Opcode

ACTIVATION_VALUES = 16  # hidden-wide values a layer keeps per token (options.gpt_bytes's figure, less the scores)


def layer_parameters(h: int) -> int:
    """A block's weights: q, k, v and out projections (4 h^2 + 4 h), the MLP (8 h^2 + 5 h), two norms (4 h).

    >>> layer_parameters(1024) == 12 * 1024 ** 2 + 13 * 1024
    True
    """
    return 12 * h * h + 13 * h


def in_flight(program, stage: int) -> int:
    """The most microbatches of `stage` whose forward has run and whose backward has not finished (B,
    or W where the backward is split) at once, over one step program's instructions.

    >>> from schedc.plan import Instr
    >>> run = [Instr(o, 0, m) for o, m in (("F", 0), ("F", 1), ("B", 0), ("F", 2), ("I", 1), ("W", 1), ("B", 2))]
    >>> in_flight(run, 0)
    2
    """
    live = peak = 0
    for instr in program:
        for unit in instr.units():
            if unit.stage != stage:
                continue
            if unit.op == Opcode.F:
                live += 1
                peak = max(peak, live)
            elif unit.op in (Opcode.B, Opcode.W):
                live -= 1
    return peak


def rank_bytes(plan, plan_rank: int, held: list[int], cfg, opts) -> float:
    """The bytes `plan_rank` keeps on its device at its peak (an upper bound: every held stage's peak of
    microbatches in flight at once, each tensor rank holding 1/t of the weights)."""
    counts = split_layers(cfg.layers, plan.meta["stages"], opts.stage_layers, opts.account_for_embedding,
                          opts.account_for_loss)
    last = plan.meta["stages"] - 1
    state = 16 if opts.optimizer == "adamw" else 8
    per_token = 4 * ACTIVATION_VALUES * cfg.hidden
    tokens = cfg.mb_size * cfg.seq // max(1, plan.meta.get("chunks", 1))
    program = [instr for step in plan.ranks[plan_rank][:1] for instr in step]
    total = 0.0
    for s in held:
        weights = counts[s] * layer_parameters(cfg.hidden)
        weights += (cfg.vocab + cfg.seq) * cfg.hidden if s == 0 else 0
        weights += (cfg.vocab + 2) * cfg.hidden if s == last else 0
        total += state * weights / opts.tp + in_flight(program, s) * counts[s] * tokens * per_token
    return total


def largest_rank(plan, cfg, opts, held_stages) -> tuple[float, int]:
    """(bytes, plan rank) of the rank that needs the most device memory."""
    return max((rank_bytes(plan, r, held_stages(plan, r), cfg, opts), r) for r in range(plan.devices))


def device_refusal(plan, cfg, opts, held_stages, have: int) -> str | None:
    """Why a rank of the run would not fit in a GPU of `have` bytes (None where every rank fits)."""
    need, rank = largest_rank(plan, cfg, opts, held_stages)
    if need <= have:
        return None
    return (f"rank {rank} would keep about {need / 2 ** 30:,.3g} GiB on its GPU (its stages' weights, gradients, "
            f"--optimizer {opts.optimizer} state and activations in flight), more than the GPU's "
            f"{have / 2 ** 30:.3g} GiB")


def gpu_memory() -> int | None:
    """The first visible GPU's memory in bytes, None where torch sees no CUDA device."""
    import torch
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory
