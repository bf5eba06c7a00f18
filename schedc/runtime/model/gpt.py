# The model: a GPT-style decoder as an ordered list of named pieces, partitioned into pipeline stages.
#
# A model is a list of (name, module) pieces: the first takes token ids [b, t], the last returns logits
# [b, t, vocab], every piece in between maps a tensor to a tensor. The runtime puts the first piece on
# stage 0, the last on the last stage and splits the pieces in between as evenly as possible. A user
# model plugs in through an import path (`--model-code pkg.mod:build`, docs/models.md), a function of ModelConfig returning
# such a list. Every rank builds the whole list on the meta device and gives weights only to its own
# stages' pieces, each module seeded from (--seed, its global name) (model/init.py), so replicas
# (Chimera) and the unpartitioned reference start from identical weights.
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from schedc.descriptions.facts import FACT_FIELDS, ModelFacts
from schedc.layout import SplitError, split_layers

from ..execution import chunks
from ..process.plugins import load_function
from ..execution.recompute import recomputed
from .decoder import build_decoder
from .experts import build_moe_decoder, moe_problem
from .tensor_parallel import (ColumnParallelLinear, RowParallelLinear, TensorGroup, VocabParallelEmbedding,
                              declare, qualified)
from ..errors import UserError
from .init import deferred_parameters, materialize_pieces, placeholder
from .tied import tie_ends


class ModelError(UserError):
    """A model that cannot be built or does not fit the plan."""


@dataclass(frozen=True, slots=True)
class ModelConfig(ModelFacts):
    """The model the runtime builds: the description's facts (schedc.descriptions.ModelFacts, each
    declared there once; ffn 0 is 4 x hidden, kv_heads 0 is heads), one microbatch's size and `extra`,
    the keys a user model may want. The sizes have no defaults here: the runtime's default model is
    process/description.DEFAULT_MODEL."""

    ffn: int = 0
    tied_embeddings: bool = False  # the runtime's GPT (Block, Head) unties its output layer unless told
    mb_size: int = 4
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        ModelFacts.__post_init__(self)  # kv_heads (zero-argument super() fails in a slotted dataclass)
        if not self.ffn:
            object.__setattr__(self, "ffn", 4 * self.hidden)


# The model facts a description may state beside the sizes, as schedc.descriptions declares them (each
# one's type and the values it may take), and the MLP's width. The runtime builds the GPT (Block) where
# every fact is the GPT's, else the Llama-family decoder of schedc/runtime/model/decoder.py under Hugging
# Face's parameter names. A mixture of experts' facts are built by runtime/model/experts.py; latent
# attention is predicted by the compiler and refused here (description.py).
FACTS: dict[str, tuple[type, tuple | None]] = {**FACT_FIELDS, "ffn": (int, None)}


def fact_problem(key: str, value: Any) -> str | None:
    """Why `value` cannot be the model fact `key` (None when it can)."""
    kind, choices = FACTS[key]
    if choices is not None:
        return None if value in choices else f"{key} must be one of {', '.join(choices)}, got {value!r}"
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        return f"{key} must be {'a number' if kind is float else f'a {kind.__name__}'}, got {value!r}"
    if kind in (int, float) and not value > 0:
        return f"{key} must be positive, got {value!r}"
    return None


class Embed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # a sequence chunk's positions, or a context rank's (runtime/execution/chunks.py, context.py)
        return self.tok(idx) + self.pos(chunks.positions(idx.shape[1], idx.device))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        return ParallelEmbed(self, tp)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of [b, heads, t, d] queries, keys and values: the score product, softmax and
    value product (what selective recomputation repeats); `mask` where the keys run on before the
    queries (a sequence chunk's: runtime/execution/chunks.py)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, each with a residual."""

    recompute_core = False  # --recompute selective: the attention core is a recomputed region

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.fc = nn.Linear(cfg.hidden, cfg.ffn)
        self.out = nn.Linear(cfg.ffn, cfg.hidden)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        k, v, mask = chunks.extend(k, v)  # with the earlier sequence chunks' within a chunk's forward
        y = recomputed(self.recompute_core, attention_core, q, k, v, mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        return ParallelBlock(self, tp)


class Head(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.lm = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.norm(x))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        return ParallelHead(self, tp)


# The GPT's pieces cut over a tensor-parallel group (schedc/runtime/model/tensor_parallel.py), each from its
# full piece, keeping its parameter names: heads split over the group (qkv column-parallel in three
# blocks, attention-out row-parallel), MLP-in column- and MLP-out row-parallel, the token embedding and
# the LM head vocabulary-parallel (the head's logits stay split: the loss is vocab_parallel_loss). Under
# sequence parallelism a piece's input and output are [b, s/t, h] sequence shards.

class ParallelEmbed(nn.Module):
    def __init__(self, full: Embed, tp: TensorGroup):
        super().__init__()
        self.tp, self.tok, self.pos = tp, VocabParallelEmbedding(full.tok, tp), full.pos
        declare(self, {}, tp)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)  # [b, s/t, h] under sequence parallelism
        first = self.tp.rank * x.shape[1] if self.tp.sequence_parallel else 0
        return x + self.pos(chunks.positions(x.shape[1], idx.device, first))


class ParallelBlock(nn.Module):
    recompute_core = False  # --recompute selective, as Block's

    def __init__(self, full: Block, tp: TensorGroup):
        super().__init__()
        self.heads = full.heads // tp.size
        self.ln1 = full.ln1  # in the full block's order, so the parameters are listed alike
        self.qkv, self.proj = ColumnParallelLinear(full.qkv, tp, blocks=3), RowParallelLinear(full.proj, tp)
        self.ln2 = full.ln2
        self.fc, self.out = ColumnParallelLinear(full.fc, tp), RowParallelLinear(full.out, tp)
        declare(self, {}, tp)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # [b, s, 3h/t]: this rank's heads
        b, t, c = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in qkv.split(c, dim=2))
        k, v, mask = chunks.extend(k, v)  # every context rank's under --cp (runtime/execution/context.py)
        y = recomputed(self.recompute_core, attention_core, q, k, v, mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    forward = Block.forward


class ParallelHead(nn.Module):
    vocab_parallel = True  # returns [b, s, V/t] logits

    def __init__(self, full: Head, tp: TensorGroup):
        super().__init__()
        self.norm, self.lm = full.norm, ColumnParallelLinear(full.lm, tp)
        declare(self, {}, tp)

    forward = Head.forward


def tp_problem(cfg: ModelConfig, tp: int) -> str | None:
    """Why the default model cannot be cut over --tp ranks (None when it can): the GPT's heads, or the
    decoder's key/value heads (Megatron-Core's rule: t divides them) and query heads, and the MLP and
    vocabulary for both."""
    kv = [] if uses_gpt(cfg) else [("key/value heads", cfg.kv_heads)]
    for what, size in (*kv, ("heads", cfg.heads), ("hidden size", cfg.hidden), (f"MLP size ({cfg.mlp})", cfg.ffn),
                       ("vocabulary", cfg.vocab)):
        if size % tp:
            return f"--tp {tp} does not divide the model's {what} {size}"
    return None


def parallel_run(run: list[tuple[str, nn.Module]], tp: TensorGroup) -> list[tuple[str, nn.Module]]:
    """A stage's pieces cut over the tensor group: each piece's `tensor_parallel(tp)` form, or the piece
    itself, replicated (every tensor rank computes it whole; refused under sequence parallelism, where
    its input would be a slice of the sequence)."""
    if tp.size == 1:
        return run
    if tp.sequence_parallel and sequence_parallel_gaps(run):
        raise ModelError(sequence_parallel_refusal(sequence_parallel_gaps(run)))
    cut = []
    for name, piece in run:
        make = getattr(piece, "tensor_parallel", None)
        try:
            cut.append((name, piece if make is None else make(tp)))
        except ValueError as exc:  # a weight that t does not divide (tensor_parallel.cut)
            raise ModelError(f"--tp {tp.size}: the model's piece {name!r} cannot be cut: {exc}") from None
    return cut


def sequence_parallel_gaps(pieces: list[tuple[str, nn.Module]]) -> list[str]:
    """The pieces with no tensor_parallel(tp) form: under sequence parallelism their input would be a
    slice of the sequence, so each needs one (checked on the ranks and by `schedc run` before launch)."""
    return [name for name, piece in pieces if getattr(piece, "tensor_parallel", None) is None]


def sequence_parallel_refusal(gaps: list[str]) -> str:
    named = ", ".join(repr(name) for name in gaps[:5]) + (f" and {len(gaps) - 5} more" if len(gaps) > 5 else "")
    return (f"--sequence-parallel: the model's piece{'s' * (len(gaps) > 1)} {named} "
            f"{'have' if len(gaps) > 1 else 'has'} no tensor_parallel(tp) form (docs/models.md)")


def gpt_problem(cfg: ModelConfig) -> str | None:
    """Why the default GPT cannot be built with these sizes (None when it can): checked by build_gpt, and
    by `schedc run` before torchrun starts."""
    if cfg.hidden % cfg.heads:
        return f"hidden size {cfg.hidden} is not a multiple of heads {cfg.heads}"
    return None


def uses_gpt(cfg: ModelConfig) -> bool:
    """Whether the facts are the GPT's (Block), else the decoder's (runtime/model/decoder.py)."""
    return (cfg.kv_heads == cfg.heads and not cfg.tied_embeddings and cfg.window is None and not cfg.experts
            and (cfg.mlp, cfg.norm, cfg.positions, cfg.bias, cfg.gelu_approximate)
            == ("gelu", "layernorm", "learned", "all", "none"))


def model_problem(cfg: ModelConfig) -> str | None:
    """Why the default model of these sizes and facts cannot be built (None when it can): checked by
    build_model, and by `schedc run` before torchrun starts."""
    facts = [fact_problem(key, getattr(cfg, key)) for key in FACTS if getattr(cfg, key) is not None]
    if any(facts):
        return next(p for p in facts if p)
    if cfg.max_positions is not None and cfg.seq > cfg.max_positions and cfg.positions == "learned":
        return f"seq {cfg.seq} is beyond the model's {cfg.max_positions} learned positions (max_positions)"
    if uses_gpt(cfg) or gpt_problem(cfg):
        return gpt_problem(cfg)
    if cfg.heads % cfg.kv_heads:
        return f"key/value heads {cfg.kv_heads} do not divide heads {cfg.heads}"
    if cfg.positions == "rope" and (cfg.hidden // cfg.heads) % 2:
        return f"rotary positions need an even head size, got {cfg.hidden // cfg.heads} (hidden / heads)"
    return moe_problem(cfg)


def build_gpt(cfg: ModelConfig) -> list[tuple[str, nn.Module]]:
    """The default model: embeddings, `layers` blocks, final norm + LM head."""
    problem = gpt_problem(cfg)
    if problem:
        raise ModelError(problem)
    blocks = [(f"blocks.{i}", Block(cfg)) for i in range(cfg.layers)]
    return [("embed", Embed(cfg)), *blocks, ("head", Head(cfg))]


def build_model(cfg: ModelConfig) -> list[tuple[str, nn.Module]]:
    """The default model of the facts: the GPT (uses_gpt), else the Llama-family decoder."""
    problem = model_problem(cfg)
    if problem:
        raise ModelError(problem)
    if cfg.experts:
        return build_moe_decoder(cfg)
    return build_gpt(cfg) if uses_gpt(cfg) else build_decoder(cfg)


class Stage(nn.Module):
    """Consecutive pieces run in order; parameters keep the unpartitioned model's names. The pieces at
    `recomputed_pieces` (--recompute full: the layers) run as recomputed regions (runtime/execution/recompute.py)."""

    recomputed_pieces: frozenset[int] = frozenset()

    def __init__(self, pieces: list[tuple[str, nn.Module]]):
        super().__init__()
        self.names = [name for name, _ in pieces]
        self.pieces = nn.ModuleList(module for _, module in pieces)
        tie_ends(self.pieces)  # both ends of a tied model in this stage: one tensor (tied.py)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The pieces from `start` on (the executor runs stage 0's first piece apart where its backward
        is split)."""
        for index in range(start, len(self.pieces)):
            x = recomputed(index in self.recomputed_pieces, self.pieces[index], x)
        return x

    def global_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(unpartitioned name, parameter), a tensor two pieces share (tied.py) once, by its first name."""
        found: dict[int, tuple[str, nn.Parameter]] = {}
        for prefix, piece in zip(self.names, self.pieces):
            for name, param in piece.named_parameters():
                found.setdefault(id(param), (qualified(prefix, name), param))
        return list(found.values())


def load_builder(spec: str | None) -> Callable[[ModelConfig], list[tuple[str, nn.Module]]]:
    """`None` for the default model (build_model); else 'pkg.mod:function'."""
    if spec is None:
        return build_model
    return load_function(spec, "--model-code", ModelError)


def build_pieces(builder: Callable, cfg: ModelConfig, seed: int, materialize: bool = True) -> list[tuple[str, nn.Module]]:
    """The model's pieces, built on the meta device (model/init.py) and, with `materialize`, every
    piece given its weights; without, a rank materializes only its own stages' pieces."""
    torch.manual_seed(seed)
    with deferred_parameters():
        if builder in (build_model, build_gpt):
            pieces = list(builder(cfg))
        else:  # user code: whatever it raises (sys.exit too) is reported as its failure, naming it
            from ..process.plugins import call_user
            spec = f"{builder.__module__}:{builder.__qualname__}"
            pieces = list(call_user(builder, "--model-code", spec, ModelError, cfg))
    if len(pieces) < 2 or not all(isinstance(m, nn.Module) for _, m in pieces):
        raise ModelError("a model builder must return a list of at least two (name, nn.Module) pieces")
    if materialize:
        materialize_pieces(pieces, seed)
    return pieces


def partition_problem(layers: int, stages: int, explicit: tuple[int, ...] | None = None,
                      embedding: bool = False, loss: bool = False) -> str | None:
    """Why a model of `layers` middle pieces cannot be split over `stages` stages (None when it can):
    checked by partition and, for the default GPT, by `schedc run` before torchrun starts."""
    try:
        split_layers(layers, stages, explicit, embedding, loss)
    except SplitError as exc:
        return str(exc)
    return None


def partition(pieces: list, stages: int, explicit: tuple[int, ...] | None = None, embedding: bool = False,
              loss: bool = False) -> list[list]:
    """Split pieces into `stages` runs: the first piece on stage 0, the last on the last stage, the ones
    in between by schedc.layout.split_layers (as evenly as possible, earlier stages taking the
    remainder; or `explicit` counts; the end pieces counted as layers with `embedding` / `loss`).

    >>> partition(['e', 'b0', 'b1', 'b2', 'h'], 2)
    [['e', 'b0', 'b1'], ['b2', 'h']]
    >>> partition(['e', 'b0', 'b1', 'b2', 'h'], 2, embedding=True)
    [['e', 'b0'], ['b1', 'b2', 'h']]
    """
    middle = pieces[1:-1]
    try:
        counts = split_layers(len(middle), stages, explicit, embedding, loss)
    except SplitError as exc:
        raise ModelError(str(exc)) from None
    if stages == 1:
        return [list(pieces)]
    runs, start = [], 0
    for count in counts:
        runs.append(list(middle[start:start + count]))
        start += count
    runs[0].insert(0, pieces[0])
    runs[-1].append(pieces[-1])
    return runs


def boundary_shapes(pieces: list[tuple[str, nn.Module]], runs: list[list], cfg: ModelConfig,
                    bf16: bool = False) -> list[tuple[torch.Size, torch.dtype]]:
    """Shape and dtype of each stage's output for one microbatch: found on the meta device, or by a
    real forward on CPU where a piece cannot run on meta, or (bf16) under bf16 autocast on CPU, where
    the dtypes are autocast's."""
    if bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _trace_shapes(runs, cfg, "cpu")
    try:
        return _trace_shapes(runs, cfg, "meta")
    except (NotImplementedError, RuntimeError):
        return _trace_shapes(runs, cfg, "cpu")


def _trace_shapes(runs: list[list], cfg: ModelConfig, device: str) -> list:
    x = torch.zeros(cfg.mb_size, cfg.seq, dtype=torch.long, device=device)
    shapes = []
    with torch.no_grad():
        for run in runs[:-1]:
            for _, module in run:
                x = (copy.deepcopy(module).to("meta") if device == "meta" else placeholder(module))(x)
            shapes.append((x.shape, x.dtype))
    return shapes


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
