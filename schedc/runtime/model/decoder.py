# The Llama-family decoder as the runtime's pieces: RMSNorm, rotary positions, grouped-query attention,
# a SwiGLU MLP and untied (or tied: tied.py) embedding and output layers, under Hugging Face's parameter names
# (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight,
# lm_head.weight), built from the model facts of ModelConfig; and its tensor-parallel form.
#
# The pieces: "model" (the token embedding; learned positions too where the facts say so),
# "model.layers.N" (one decoder layer each), and "" (the final norm and the output layer: an empty
# prefix, so that its parameters keep HF's top-level names). The facts pick each part: the norm
# (rmsnorm | layernorm, norm_eps), positions (rope with rope_theta | learned), the MLP (swiglu: gate,
# up and down | gelu: up and down, ffn wide), key/value heads, and the biases (all | qkv | none).
#
# What a layer keeps for backward is what Megatron-Core's fused kernels keep (schedc/costmodel/activations.py):
# the RMSNorm its input and one fp32 1/rms per token, SwiGLU its two inputs (silu recomputed in
# backward), the rotary tables are buffers (model state, not a microbatch's), and attention runs as
# one fused kernel over the key/value heads (scaled_dot_product_attention with enable_gqa). Positions
# are a sequence chunk's (Seq1F1B) or a context rank's (--cp), as runtime/execution/chunks.py gives them.
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..execution import chunks, context
from ..execution.recompute import recomputed
from .tensor_parallel import ColumnParallelLinear, RowParallelLinear, TensorGroup, VocabParallelEmbedding, declare
from .spans import band, llama3_frequencies
from .tied import TiedEmbedding, TiedHead


# -- the operators -----------------------------------------------------------------------------------

class _RMSNorm(torch.autograd.Function):
    """y = w · x / rms(x), rms over the last dimension in fp32 (HF's LlamaRMSNorm); keeps x and 1/rms."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (x.float() * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        normed, grad = x.float() * rstd, grad.float()
        grad_w = (grad * normed).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        scaled = grad * weight.float()
        grad_x = rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) · up, keeping gate and up (Megatron-Core's fused SwiGLU: silu recomputed in backward)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        g, u, d = gate.float(), up.float(), grad.float()
        sig = torch.sigmoid(g)
        grad_gate = d * u * sig * (1 + g * (1 - sig))
        return grad_gate.to(gate.dtype), (d * g * sig).to(up.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _SwiGLU.apply(gate, up)


def rotary_table(positions: int, dim: int, theta: float, scaling=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, dim] of HF Llama's rotary embedding: frequency i of theta^(-2i/dim)
    (Llama 3.1's rope_scaling applied: spans.py), the dim/2 angles repeated for the two halves
    rotate_half pairs."""
    inverse = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if scaling is not None:
        inverse = llama3_frequencies(inverse, scaling)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inverse)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on [b, heads, t, d] with the [t, d] tables of its positions."""
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def grouped_attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of [b, heads, t, d] queries over [b, kv heads, t, d] keys and values, each key
    head shared by heads / kv heads query heads (what selective recomputation repeats)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


# -- the pieces ----------------------------------------------------------------------------------------

class Attention(nn.Module):
    """self_attn: q, k, v and o projections; the key/value heads are k_proj's output / head_dim, so the
    same forward runs on a tensor rank's heads."""

    recompute_core = False  # --recompute selective: the attention core is a recomputed region

    def __init__(self, q_proj: nn.Module, k_proj: nn.Module, v_proj: nn.Module, o_proj: nn.Module, head_dim: int,
                 rotary: tuple[torch.Tensor, torch.Tensor] | None, band: torch.Tensor | None = None):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.head_dim = q_proj, k_proj, v_proj, o_proj, head_dim
        self.rotary = rotary is not None
        self.windowed = band is not None  # a sliding window's [seq, seq] mask (spans.band), a buffer too
        if band is not None:
            self.register_buffer("band", band, persistent=False)
        if rotary is not None:  # buffers: model state, not saved activations (runtime/execution/memory.py)
            self.register_buffer("cos", rotary[0], persistent=False)
            self.register_buffer("sin", rotary[1], persistent=False)

    def angles(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of this forward's `count` positions: a context rank's own (runtime/execution/context.py),
        else a slice of the tables from a sequence chunk's first position (runtime/execution/chunks.py; views of
        the buffers, so the saved-tensor meter counts none of them)."""
        if context.ACTIVE:
            at = chunks.positions(count, self.cos.device)
            return self.cos[at], self.sin[at]
        first = chunks.position()
        return self.cos[first:first + count], self.sin[first:first + count]

    def heads(self, z: torch.Tensor) -> torch.Tensor:
        return z.view(z.shape[0], z.shape[1], -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(self.q_proj(x)), self.heads(self.k_proj(x)), self.heads(self.v_proj(x))
        if self.rotary:
            cos, sin = self.angles(q.shape[2])
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v, mask = chunks.extend(k, v)  # with the earlier sequence chunks' within a chunk's forward
        if self.windowed:  # no chunks nor context ranks (refused: train.check_plan): the whole sequence
            mask = self.band[:q.shape[2], :q.shape[2]]
        y = recomputed(self.recompute_core, grouped_attention_core, q, k, v, mask)
        return self.o_proj(y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1))

    def tensor_parallel(self, tp: TensorGroup) -> Attention:
        """q heads and key/value heads split over the group (q, k, v column-, o row-parallel)."""
        return Attention(ColumnParallelLinear(self.q_proj, tp), ColumnParallelLinear(self.k_proj, tp),
                         ColumnParallelLinear(self.v_proj, tp), RowParallelLinear(self.o_proj, tp), self.head_dim,
                         (self.cos, self.sin) if self.rotary else None, self.band if self.windowed else None)


class MLP(nn.Module):
    """swiglu: down(silu(gate(x)) · up(x)); gelu (no gate): down(gelu(up(x))), the GeLU exact or tanh-
    approximated (`approximate`: GPT-2's gelu_new is "tanh")."""

    def __init__(self, gate_proj: nn.Module | None, up_proj: nn.Module, down_proj: nn.Module,
                 approximate: str = "none"):
        super().__init__()
        if gate_proj is not None:
            self.gate_proj = gate_proj
        self.up_proj, self.down_proj, self.gated = up_proj, down_proj, gate_proj is not None
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.gelu(self.up_proj(x), approximate=self.approximate))

    def tensor_parallel(self, tp: TensorGroup) -> MLP:
        """gate and up column-, down row-parallel."""
        gate = ColumnParallelLinear(self.gate_proj, tp) if self.gated else None
        return MLP(gate, ColumnParallelLinear(self.up_proj, tp), RowParallelLinear(self.down_proj, tp), self.approximate)


class DecoderLayer(nn.Module):
    """Pre-norm: x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(x))."""

    def __init__(self, input_layernorm: nn.Module, self_attn: Attention, post_attention_layernorm: nn.Module,
                 mlp: MLP):
        super().__init__()
        self.input_layernorm, self.self_attn = input_layernorm, self_attn
        self.post_attention_layernorm, self.mlp = post_attention_layernorm, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        layer = DecoderLayer(self.input_layernorm, self.self_attn.tensor_parallel(tp), self.post_attention_layernorm,
                             self.mlp.tensor_parallel(tp))
        return declare(layer, {}, tp)  # the norms replicated (PARTIAL under sequence parallelism)


class Embedding(nn.Module):
    """The piece "model": embed_tokens, and embed_positions with learned positions."""

    def __init__(self, embed_tokens: nn.Module, embed_positions: nn.Embedding | None,
                 tp: TensorGroup = TensorGroup()):
        super().__init__()
        self.embed_tokens, self.tp = embed_tokens, tp
        if embed_positions is not None:
            self.embed_positions = embed_positions
        self.learned = embed_positions is not None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)  # [b, s/t, h] under sequence parallelism
        if not self.learned:
            return x
        first = self.tp.rank * x.shape[1] if self.tp.sequence_parallel else 0
        return x + self.embed_positions(chunks.positions(x.shape[1], ids.device, first))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        """embed_tokens vocabulary-parallel; learned positions replicated."""
        positions = self.embed_positions if self.learned else None
        return declare(Embedding(VocabParallelEmbedding(self.embed_tokens, tp), positions, tp), {}, tp)


class Output(nn.Module):
    """The piece "" (model.norm, lm_head): the final norm and the untied output layer."""

    vocab_parallel = False  # True in the tensor-parallel form: [b, s, V/t] logits
    tied = False  # lm_head a copy of the word embedding (tied.py)

    def __init__(self, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.model = nn.ModuleDict({"norm": norm})
        self.lm_head = lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model["norm"](x))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        """lm_head vocabulary-parallel (its logits stay split: the loss is vocab_parallel_loss)."""
        out = Output(self.model["norm"], ColumnParallelLinear(self.lm_head, tp))
        out.vocab_parallel, out.tied = True, self.tied
        return declare(out, {}, tp)


# -- building: from a runtime.model.ModelConfig (not imported: model.py imports this module) ------------

def norm(cfg) -> nn.Module:
    return RMSNorm(cfg.hidden, cfg.norm_eps) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)


def attention(cfg, rotary: tuple[torch.Tensor, torch.Tensor] | None, window: torch.Tensor | None = None) -> Attention:
    head_dim, kv = cfg.hidden // cfg.heads, cfg.kv_heads * (cfg.hidden // cfg.heads)
    qkv_bias = cfg.bias in ("all", "qkv")
    return Attention(nn.Linear(cfg.hidden, cfg.hidden, bias=qkv_bias), nn.Linear(cfg.hidden, kv, bias=qkv_bias),
                     nn.Linear(cfg.hidden, kv, bias=qkv_bias), nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias == "all"),
                     head_dim, rotary, window)


def mlp(cfg) -> MLP:
    bias = cfg.bias == "all"
    gate = nn.Linear(cfg.hidden, cfg.ffn, bias=bias) if cfg.mlp == "swiglu" else None
    return MLP(gate, nn.Linear(cfg.hidden, cfg.ffn, bias=bias), nn.Linear(cfg.ffn, cfg.hidden, bias=bias),
               cfg.gelu_approximate)


def build_decoder(cfg) -> list[tuple[str, nn.Module]]:
    """The decoder's pieces (the caller checks the facts: model.model_problem)."""
    rotary = (rotary_table(cfg.seq, cfg.hidden // cfg.heads, cfg.rope_theta, cfg.rope_scaling)
              if cfg.positions == "rope" else None)
    # learned positions: the description's table (GPT-2's n_positions rows), else seq rows (position_rows)
    positions = nn.Embedding(cfg.position_rows, cfg.hidden) if cfg.positions == "learned" else None
    window = band(cfg.seq, cfg.window) if cfg.window is not None and cfg.window < cfg.seq else None  # one for all
    words = (TiedEmbedding if cfg.tied_embeddings else nn.Embedding)(cfg.vocab, cfg.hidden)
    pieces = [("model", Embedding(words, positions))]
    pieces += [(f"model.layers.{i}", DecoderLayer(norm(cfg), attention(cfg, rotary, window), norm(cfg), mlp(cfg)))
               for i in range(cfg.layers)]
    output = Output(norm(cfg), (TiedHead if cfg.tied_embeddings else nn.Linear)(cfg.hidden, cfg.vocab, bias=False))
    output.tied = cfg.tied_embeddings
    return [*pieces, ("", output)]
