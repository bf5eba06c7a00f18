# A mixture of experts in the runtime's Llama-family decoder: Mixtral's sparse MoE block under Hugging
# Face's parameter names (model.layers.N.block_sparse_moe.gate.weight, ...experts.E.w1/w2/w3.weight),
# and its expert-parallel form over gloo or NCCL.
#
#   router      gate: h -> experts (no bias); softmax over the experts in fp32, the top_k kept and
#               renormalised to sum to 1 (HF's MixtralSparseMoeBlock), then cast to the input's dtype
#   routing     dropless: every token reaches its top_k experts (no capacity, nothing dropped)
#   experts     each a SwiGLU: w2(silu(w1 x) · w3 x), moe_ffn wide
#   combine     y[token] = sum over its experts of weight · expert(x[token]), in ascending expert order
#
# With --ep N the ep ranks of a stage (carved from its d x cp data and context ranks: the expert group is
# N consecutive of them, Megatron-Core's expert-data-parallel group the ranks N apart) each hold
# experts / N consecutive experts. A forward exchanges the tokens per expert first (an all_to_all_single
# of counts), then dispatches each token copy to its expert's rank (all_to_all_single with those split
# sizes), runs the local experts and combines (the reverse all_to_all_single) before the weighted sum.
# The backward of the combine and of the dispatch are the same exchanges reversed: an input-gradient
# pass (B, I) issues them; a weight-gradient pass (W) starts from the experts' own GEMMs and issues none.
# Issued counts the token exchanges (not the counts') for the executor's check against the plan; with
# --report-out each block counts the tokens its forwards route to each expert (Routed), reported per step.
#
# Not built, refused by name (moe_problem): shared experts, the sigmoid (DeepSeek-V3) router, a capacity
# factor, Qwen MoE's router; the auxiliary load-balancing loss is not in the loss (as HF's
# MixtralForCausalLM with output_router_logits false, its default, leaves it out).
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .decoder import build_decoder, swiglu
from .tensor_parallel import ColumnParallelLinear, RowParallelLinear, TensorGroup, declare, qualified

MOE_FACTS = ("experts", "top_k", "moe_ffn", "shared_experts", "first_k_dense", "router", "capacity_factor",
             "aux_loss")  # the descriptions' MoE facts the runtime's ModelConfig carries
BUILT_FAMILIES = ("mixtral",)


def moe_problem(cfg) -> str | None:
    """Why the runtime cannot build this mixture of experts (None when it can, or without experts)."""
    if not cfg.experts:
        return None
    what = None
    if cfg.family not in BUILT_FAMILIES:
        what = (f"the {cfg.family} family's router (Qwen MoE's norm_topk_prob, DeepSeek-V3's groups): the runtime "
                "builds Mixtral's (softmax, top-k renormalised)")
    elif cfg.shared_experts:
        what = f"{cfg.shared_experts} shared expert(s): the runtime builds routed experts only"
    elif cfg.router != "softmax":
        what = f"the {cfg.router} router: the runtime builds the softmax top-k one"
    elif cfg.capacity_factor:
        what = f"capacity factor {cfg.capacity_factor:g}: the runtime routes dropless (no capacity)"
    elif cfg.mlp != "swiglu":
        what = f"{cfg.mlp} experts: the runtime builds SwiGLU experts"
    elif not 1 <= cfg.top_k <= cfg.experts or not cfg.moe_ffn:
        what = f"top_k {cfg.top_k} of {cfg.experts} experts {cfg.moe_ffn} wide: each token needs 1 to experts of them"
    return None if what is None else f"a mixture of {cfg.experts} experts with {what}; schedc simulate and tune predict it"


def ep_problem(cfg, ep: int, lanes: int, others: dict[str, bool]) -> str | None:
    """Why --ep `ep` cannot run (None when it can): experts to split, ep dividing them and the `lanes`
    (d x cp) data and context ranks, and the options it does not compose with yet (`others`: name -> given)."""
    if ep < 1:
        return f"--ep must be >= 1, got {ep}"
    if ep == 1:
        return None
    if not cfg.experts:
        return f"--ep {ep}: the model has no experts to split"
    if cfg.experts % ep or lanes % ep:
        return (f"--ep {ep} must divide the model's {cfg.experts} experts and the {lanes} data x context ranks "
                "(--dp x --cp) it is carved from")
    given = [name for name, on in others.items() if on]
    if given:
        return f"--ep {ep} does not compose with {given[0]} yet; leave one of them out"
    return None


# -- the exchange --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ExpertGroup:
    """This rank's expert-parallel group: `size` ranks, this one `rank` in it, the process group
    (None for one rank: no exchange)."""

    size: int = 1
    rank: int = 0
    group: object | None = None


class Routed:
    """Whether a forward now counts its tokens per expert (the executor's F, not a recomputation's replay
    nor a placed R: runtime/execution/exchanges.py's count_routed)."""

    on = False


class Issued:
    """The token exchanges issued since the last `take` (the executor's check against the plan)."""

    count = 0

    @classmethod
    def take(cls) -> int:
        count, cls.count = cls.count, 0
        return count


def exchange(x: torch.Tensor, send: list[int], receive: list[int], group) -> torch.Tensor:
    """Rows of x to the group's ranks (send[r] rows to rank r, in order), rows from them (receive[r])."""
    out = x.new_empty((sum(receive), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)
    Issued.count += 1
    return out


class _Exchange(torch.autograd.Function):
    """An all-to-all of rows forward; the reverse all-to-all of their gradients backward."""

    @staticmethod
    def forward(ctx, x, send, receive, group):
        ctx.send, ctx.receive, ctx.group = send, receive, group
        return exchange(x, send, receive, group)

    @staticmethod
    def backward(ctx, grad):
        return exchange(grad, ctx.receive, ctx.send, ctx.group), None, None, None


# -- the modules ---------------------------------------------------------------------------------------

class Expert(nn.Module):
    """HF's MixtralBlockSparseTop2MLP: w1 (gate) and w3 (up) h -> moe_ffn, w2 (down) back."""

    def __init__(self, w1: nn.Module, w2: nn.Module, w3: nn.Module):
        super().__init__()
        self.w1, self.w2, self.w3 = w1, w2, w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(swiglu(self.w1(x), self.w3(x)))

    def tensor_parallel(self, tp: TensorGroup) -> Expert:
        """Megatron-Core's expert tensor parallelism: w1 and w3 column-, w2 row-parallel."""
        return Expert(ColumnParallelLinear(self.w1, tp), RowParallelLinear(self.w2, tp),
                      ColumnParallelLinear(self.w3, tp))


class SparseMoeBlock(nn.Module):
    """The router and the experts this rank holds (`experts` keyed by their global index, so the
    parameters keep the whole model's names), over the expert group."""

    def __init__(self, gate: nn.Linear, experts: dict[int, Expert], count: int, top_k: int,
                 group: ExpertGroup = ExpertGroup()):
        super().__init__()
        self.gate = gate
        self.experts = nn.ModuleDict({str(e): expert for e, expert in sorted(experts.items())})
        self.count, self.top_k, self.group = count, top_k, group
        self.routed: torch.Tensor | None = None  # tokens this rank routed to each expert (Routed.on)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts) [tokens, top_k]: softmax over the experts, the top_k renormalised."""
        logits = self.gate(x)  # softmax in fp32 at least (HF's dtype=torch.float), fp64 kept
        probs = F.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        return (weights / weights.sum(-1, keepdim=True)).to(x.dtype), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.route(flat)
        order = chosen.flatten().argsort(stable=True)  # the token copies grouped by expert, ascending
        token = order // self.top_k
        per_expert = torch.bincount(chosen.flatten(), minlength=self.count)
        if Routed.on:  # this rank's tokens sent to each expert, over the run
            self.routed = per_expert.detach().cpu() + (0 if self.routed is None else self.routed)
        out = self.run_experts(flat[token], per_expert)
        weighted = out * weights.flatten()[order].unsqueeze(-1)
        return torch.zeros_like(flat).index_add(0, token, weighted).view(x.shape)

    def run_experts(self, rows: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
        """The experts' outputs for `rows` (grouped by expert, per_expert rows each), in the same order:
        here, or dispatched to the experts' ranks and combined back."""
        if self.group.size == 1:
            return torch.cat(self._local(rows.split(per_expert.tolist()), range(self.count)))
        size, local = self.group.size, self.count // self.group.size
        counts = torch.empty_like(per_expert)
        dist.all_to_all_single(counts, per_expert, group=self.group.group)  # [source rank, local expert]
        send = per_expert.view(size, local).sum(1).tolist()
        receive = counts.view(size, local).sum(1).tolist()
        arrived = _Exchange.apply(rows, send, receive, self.group.group)
        blocks = arrived.split(counts.tolist())  # (source, local expert), source-major
        first = self.group.rank * local
        outs = self._local([torch.cat(blocks[e::local]) for e in range(local)], range(first, first + local))
        done = [out.split([blocks[r * local + e].shape[0] for r in range(size)]) for e, out in enumerate(outs)]
        back = torch.cat([done[e][r] for r in range(size) for e in range(local)])
        return _Exchange.apply(back, receive, send, self.group.group)

    def _local(self, parts, experts) -> list[torch.Tensor]:
        """Each part through its expert (an empty part skipped: every tensor rank skips it alike)."""
        return [self.experts[str(e)](part) if part.shape[0] else part for part, e in zip(parts, experts)]

    def keep(self, group: ExpertGroup) -> None:
        """Hold only this rank's experts of the group (before the weights are made: init.py)."""
        local = self.count // group.size
        mine = range(group.rank * local, (group.rank + 1) * local)
        self.experts = nn.ModuleDict({str(e): self.experts[str(e)] for e in mine})
        self.group = group

    def tensor_parallel(self, tp: TensorGroup) -> SparseMoeBlock:
        """The router replicated, each expert cut over the tensor group (Expert.tensor_parallel)."""
        experts = {int(e): expert.tensor_parallel(tp) for e, expert in self.experts.items()}
        return declare(SparseMoeBlock(self.gate, experts, self.count, self.top_k, self.group), {}, tp)


class MoeDecoderLayer(nn.Module):
    """A decoder layer whose MLP is routed: x + self_attn(input_layernorm(x)), then
    + block_sparse_moe(post_attention_layernorm(x))."""

    def __init__(self, input_layernorm: nn.Module, self_attn: nn.Module, post_attention_layernorm: nn.Module,
                 block_sparse_moe: SparseMoeBlock):
        super().__init__()
        self.input_layernorm, self.self_attn = input_layernorm, self_attn
        self.post_attention_layernorm, self.block_sparse_moe = post_attention_layernorm, block_sparse_moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        layer = MoeDecoderLayer(self.input_layernorm, self.self_attn.tensor_parallel(tp),
                                self.post_attention_layernorm, self.block_sparse_moe.tensor_parallel(tp))
        return declare(layer, {}, tp)


def sparse_block(cfg) -> SparseMoeBlock:
    """The whole model's block of the facts (every expert; a rank keeps its own: keep)."""
    experts = {e: Expert(nn.Linear(cfg.hidden, cfg.moe_ffn, bias=False), nn.Linear(cfg.moe_ffn, cfg.hidden, bias=False),
                         nn.Linear(cfg.hidden, cfg.moe_ffn, bias=False)) for e in range(cfg.experts)}
    return SparseMoeBlock(nn.Linear(cfg.hidden, cfg.experts, bias=False), experts, cfg.experts, cfg.top_k)


def build_moe_decoder(cfg) -> list[tuple[str, nn.Module]]:
    """The decoder's pieces with every layer past the first_k_dense dense ones routed (the caller checks
    the facts: model.model_problem)."""
    pieces = build_decoder(cfg)
    for i in range(1 + cfg.first_k_dense, 1 + cfg.layers):
        name, dense = pieces[i]
        pieces[i] = (name, MoeDecoderLayer(dense.input_layernorm, dense.self_attn, dense.post_attention_layernorm,
                                           sparse_block(cfg)))
    return pieces


def moe_layers(pieces: list) -> list[SparseMoeBlock]:
    return [module for _, piece in pieces for module in piece.modules() if isinstance(module, SparseMoeBlock)]


def keep_local_experts(pieces: list, group: ExpertGroup) -> None:
    """Every MoE block of the pieces holds only this rank's experts (the pieces still on meta)."""
    if group.size > 1:
        for block in moe_layers(pieces):
            block.keep(group)


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The routed experts' parameters of a module (reduced over the expert-data-parallel group)."""
    return [p for block in module.modules() if isinstance(block, SparseMoeBlock)
            for p in block.experts.parameters() if p.requires_grad]


def expert_names(stage) -> list[str]:
    """The global names of a stage's routed-expert parameters."""
    ids = {id(p) for p in expert_parameters(stage)}
    return [name for name, p in stage.global_parameters() if id(p) in ids]


def routed_tokens(stage) -> dict[str, list[int]]:
    """Each MoE block's tokens routed to each expert by this rank's forwards, by the block's global name."""
    return {qualified(prefix, name): block.routed.tolist() for prefix, piece in zip(stage.names, stage.pieces)
            for name, block in piece.named_modules() if isinstance(block, SparseMoeBlock) and block.routed is not None}


def tokens_per_expert(parts: list[dict[str, list[int]]], steps: int) -> dict[str, list[float]]:
    """Each MoE block's tokens per expert per step over all ranks (every data and context rank's own
    tokens; tensor rank 0's), the mean over the run's steps."""
    total: dict[str, list[int]] = {}
    for part in parts:
        for name, counts in part.items():
            total[name] = [a + b for a, b in zip(total.get(name, [0] * len(counts)), counts)]
    return {name: [c / steps for c in counts] for name, counts in sorted(total.items(), key=lambda kv: _layer_key(kv[0]))}


def _layer_key(name: str) -> tuple:
    return tuple(int(w) if w.isdigit() else w for w in name.split("."))
