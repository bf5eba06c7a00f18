"""Tensor and sequence parallelism (--tp, --sequence-parallel), as Megatron-LM does them (Shoeybi et al.
2019; Korthikanti et al. 2022): the conjugate operators f and g, column- and row-parallel linear layers,
a vocabulary-parallel embedding and cross entropy, the declaration of which weights are split and how,
and the scatter/gather of pipeline messages over the t links of a stage pair.

    f  identity forward, all-reduce backward      (before a column-parallel layer)
    g  all-reduce forward, identity backward      (after a row-parallel layer)
    with sequence parallelism f becomes an all-gather of the sequence shards (backward: reduce-scatter)
    and g a reduce-scatter into them (backward: all-gather); what lies between the tensor-parallel
    regions (layer norms, residuals) runs on a 1/t slice of the sequence.

Every tensor rank cuts its shards from the full weights built from the seed (`cut`), so a run with --tp
starts from the reference's weights, and `join` puts gathered shards back into the full tensor: both
read one declaration per weight, `Split(dim, blocks)` (the weight's `blocks` parts along `dim`, each cut
into t; qkv is three blocks, so a rank holds its heads' q, k and v), or PARTIAL (a replicated weight
whose gradient each rank holds a part of: under sequence parallelism it saw only a slice of the
sequence, and the parts are all-reduced over the tensor group at the end of the step).

torch.distributed.tensor.parallel (DTensor's ColwiseParallel / RowwiseParallel / loss_parallel) runs on
gloo too (tried with torch 2.13), but it is not used: its parameters become DTensors, which the runtime's
one flat gradient buffer per stage (executor.attach_flat_grads) and the distributed optimizer's flat
weights (sharding.py) cannot hold as views; ColwiseParallel cuts a fused qkv weight in t contiguous rows,
mixing q, k and v heads, where a rank needs its own heads of each; and loss_parallel needs DTensor logits
where the pipeline carries plain tensors. The operators below are a few lines each over
torch.distributed's collectives.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .precision import gradient

SEQUENCE_DIM = 1  # activations are [batch, sequence, hidden]
PARTIAL = "partial"


@dataclass(frozen=True, slots=True)
class Split:
    """A weight cut over the tensor group: its `blocks` equal parts along `dim`, each cut into t."""

    dim: int
    blocks: int = 1


@dataclass(frozen=True, slots=True)
class TensorGroup:
    """This rank's place in its tensor-parallel group: t ranks, its index, the process group (None
    for t = 1), and whether sequence parallelism is on."""

    size: int = 1
    rank: int = 0
    group: object = None
    sequence_parallel: bool = False

    def shard(self, length: int) -> slice:
        """This rank's 1/t of `length` (a sequence, a vocabulary)."""
        size = length // self.size
        return slice(self.rank * size, (self.rank + 1) * size)


# -- collectives -------------------------------------------------------------------------------------

def all_reduce(x: torch.Tensor, tp: TensorGroup, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """`x` summed (or `op`) over the tensor group in place, no copy: for a tensor nothing else reads (a
    contiguous copy first where `x` is not contiguous)."""
    x = x.contiguous()
    dist.all_reduce(x, op=op, group=tp.group)
    return x


def _current(name: str, old: str):
    """torch's tensor collective by its current name (torch 2.13 renamed all_gather_into_tensor and
    reduce_scatter_tensor, whose old names warn on every rank at every call), else by the old one."""
    return getattr(dist, name, None) or getattr(dist, old)


def all_gather(x: torch.Tensor, tp: TensorGroup, dim: int) -> torch.Tensor:
    """Every rank's `x` joined along `dim`, in rank order: one all_gather_into_tensor into one tensor of
    the ranks' parts joined along dimension 0, viewed as the join when `dim` is 0 or every dimension
    before it has size 1, else reordered into it (one copy, as the cat of a list was)."""
    out = x.new_empty((tp.size * x.shape[0], *x.shape[1:]))
    _current("all_gather_single", "all_gather_into_tensor")(out, x.contiguous(), group=tp.group)
    joined = (*x.shape[:dim], tp.size * x.shape[dim], *x.shape[dim + 1:])
    if math.prod(x.shape[:dim]) == 1:
        return out.view(joined)
    return out.view(tp.size, *x.shape).movedim(0, dim).reshape(joined)


def reduce_scatter(x: torch.Tensor, tp: TensorGroup, dim: int) -> torch.Tensor:
    """This rank's 1/t of `x` along `dim`, summed over the group: one reduce_scatter_tensor of `x` as
    the ranks' parts joined along dimension 0 (a view when every dimension before `dim` has size 1,
    else one reordering copy, as the chunk-and-copy was)."""
    size = x.shape[dim] // tp.size
    parts = x.reshape(*x.shape[:dim], tp.size, size, *x.shape[dim + 1:])
    parts = parts.movedim(dim, 0).contiguous().flatten(0, 1)
    out = x.new_empty((*x.shape[:dim], size, *x.shape[dim + 1:]))
    _current("reduce_scatter_single", "reduce_scatter_tensor")(out, parts, group=tp.group)
    return out


# -- the conjugate operators -------------------------------------------------------------------------

class _Copy(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # in place: enter's one reader is a linear, whose input gradient is new
        return all_reduce(grad, ctx.tp), None


class _Reduce(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, tp):  # in place: leave's input (a linear's or a lookup's output) is kept by no backward
        if x.is_contiguous():
            ctx.mark_dirty(x)
        return all_reduce(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    """f under sequence parallelism: all-gather the sequence shards forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return all_gather(x, tp, SEQUENCE_DIM)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, ctx.tp, SEQUENCE_DIM), None


class _ReduceScatter(torch.autograd.Function):
    """g under sequence parallelism: reduce-scatter into sequence shards forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return reduce_scatter(x, tp, SEQUENCE_DIM)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.tp, SEQUENCE_DIM), None


class _GatheredLinear(torch.autograd.Function):
    """f and a column-parallel linear together under sequence parallelism, as Megatron-LM's linear with
    sequence parallelism: the forward all-gathers the sequence shards and keeps only its own shard for
    backward, which all-gathers them again for the weight gradient and reduce-scatters the input
    gradient (the gathered input would be t times the bytes Korthikanti et al.'s sbh(34/t) counts).
    Backward runs in the forward's compute dtype (bf16 under autocast). A split backward's I (inside
    `input_half`) computes the input gradient only and keeps the gathered input for W, as zero-bubble's
    Megatron-LM keeps it for its deferred weight gradient; W takes it without an all-gather, lets it go,
    and skips the input gradient I computed. What I keeps lives no longer than the node: W frees the
    graph. A one-pass backward computes both and keeps nothing."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp):
        ctx.tp, ctx.has_bias, ctx.gathered = tp, bias is not None, None
        y = F.linear(all_gather(x, tp, SEQUENCE_DIM), weight, bias)
        ctx.dtype = y.dtype
        ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad, dtype = grad.contiguous().to(ctx.dtype), ctx.dtype
        after_input_half = ctx.gathered is not None  # W, after I kept the gathered input
        gathered = ctx.gathered if after_input_half else all_gather(x, ctx.tp, SEQUENCE_DIM).to(dtype)
        input_half = bool(_INPUT_HALF) and ctx.needs_input_grad[1]
        ctx.gathered = gathered if input_half else None  # I keeps it for W; any other call lets it go
        grad_x = None
        if ctx.needs_input_grad[0] and (not after_input_half or _runs(ctx.next_functions[0][0])):
            grad_x = reduce_scatter(grad @ weight.to(dtype), ctx.tp, SEQUENCE_DIM).to(x.dtype)
        if input_half:
            return grad_x, None, None, None
        rows = grad.reshape(-1, grad.shape[-1])
        grad_w = (rows.T @ gathered.reshape(-1, gathered.shape[-1])).to(weight.dtype)
        grad_b = rows.sum(dim=0).to(weight.dtype) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


_INPUT_HALF: list[bool] = []  # set while a split backward's I runs (input_half)


@contextmanager
def input_half():
    """A split backward's I: the gathered linears compute input gradients only and keep their gathered
    input for W."""
    _INPUT_HALF.append(True)
    try:
        yield
    finally:
        _INPUT_HALF.pop()


def _runs(node) -> bool:
    """Whether W's backward pass runs `node`, the one the input gradient flows into (it does where the
    gradient reaches weights before the linear). Never a leaf's (an AccumulateGrad, with its `variable`):
    I gave that gradient, and the engine does not answer for a leaf under autograd.grad."""
    return node is not None and not hasattr(node, "variable") and torch._C._will_engine_execute_node(node)


def enter(x: torch.Tensor, tp: TensorGroup) -> torch.Tensor:
    """Into a tensor-parallel region: f, or the sequence all-gather."""
    if tp.size == 1:
        return x
    return (_Gather if tp.sequence_parallel else _Copy).apply(x, tp)


def leave(x: torch.Tensor, tp: TensorGroup) -> torch.Tensor:
    """Out of a tensor-parallel region (partial sums): g, or the sequence reduce-scatter."""
    if tp.size == 1:
        return x
    return (_ReduceScatter if tp.sequence_parallel else _Reduce).apply(x, tp)


# -- weights: the declaration, cut and join ------------------------------------------------------------

def cut(full: torch.Tensor, split: Split, tp: TensorGroup) -> torch.Tensor:
    """This rank's shard of a full tensor.

    >>> cut(torch.arange(6), Split(0, blocks=3), TensorGroup(2, 1)).tolist()
    [1, 3, 5]
    """
    size = full.shape[split.dim]
    if size % (split.blocks * tp.size):
        raise ValueError(f"a weight of shape {tuple(full.shape)} has {size} along dim {split.dim}, not a multiple "
                         f"of {split.blocks * tp.size} ({split.blocks} block{'s' * (split.blocks > 1)} x --tp {tp.size})")
    blocks = full.chunk(split.blocks, dim=split.dim)
    return torch.cat([block.chunk(tp.size, dim=split.dim)[tp.rank] for block in blocks], dim=split.dim)


def join(shards: list[torch.Tensor], split: Split) -> torch.Tensor:
    """The full tensor from every rank's shard, in rank order: the inverse of `cut`."""
    pieces = [shard.chunk(split.blocks, dim=split.dim) for shard in shards]
    return torch.cat([torch.cat([p[b] for p in pieces], dim=split.dim) for b in range(split.blocks)],
                     dim=split.dim)


def shard_parameter(full: torch.Tensor | None, split: Split, tp: TensorGroup) -> nn.Parameter | None:
    return None if full is None else nn.Parameter(cut(full.detach(), split, tp).clone())


def declare(module: nn.Module, splits: dict[str, Split], tp: TensorGroup) -> nn.Module:
    """Set a tensor-parallel piece's declaration: `splits` for its split weights, the rest replicated;
    under sequence parallelism every replicated weight of a piece sees a slice of the sequence, so its
    gradient is PARTIAL."""
    names = [name for name, _ in module.named_parameters()]
    rest = PARTIAL if tp.sequence_parallel and tp.size > 1 else None
    module.tensor_splits = {name: splits.get(name, rest) for name in names}
    return module


def parameter_splits(module: nn.Module) -> dict[str, Split | str | None]:
    """Every parameter's declaration by its name in `module`: from the innermost module declaring it (a
    module's `tensor_splits`, keyed by names inside it), None (replicated) where none declares one."""
    found: dict[str, Split | str | None] = {}
    for prefix, sub in reversed(list(module.named_modules())):  # a module's children before it
        for name, split in getattr(sub, "tensor_splits", {}).items():
            found.setdefault(f"{prefix}.{name}" if prefix else name, split)
    return {name: found.get(name) for name, _ in module.named_parameters()}


# -- layers --------------------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """Y = f(X) A_r + b_r: the output features cut over the group (A = [A_1 .. A_t] by columns); the
    output stays split. `blocks` > 1 cuts each of that many fused parts (qkv: 3)."""

    def __init__(self, full: nn.Linear, tp: TensorGroup, blocks: int = 1):
        super().__init__()
        self.tp, split = tp, Split(0, blocks)
        self.weight = shard_parameter(full.weight, split, tp)
        self.bias = shard_parameter(full.bias, split, tp)
        declare(self, {"weight": split, "bias": split}, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size > 1 and self.tp.sequence_parallel:
            return _GatheredLinear.apply(x, self.weight, self.bias, self.tp)
        return F.linear(enter(x, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = g(X_r A_r) + b: the input features cut (A = [A_1; ..; A_t] by rows), the partial products
    summed by g (or reduce-scattered into sequence shards), then the replicated bias."""

    def __init__(self, full: nn.Linear, tp: TensorGroup):
        super().__init__()
        self.tp = tp
        self.weight = shard_parameter(full.weight, Split(1), tp)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())
        declare(self, {"weight": Split(1)}, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = leave(F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """The embedding table's rows cut over the group: each rank looks up the tokens in its vocabulary
    range (zeros for the others) and g sums the parts (reduce-scatters them under sequence parallelism)."""

    def __init__(self, full: nn.Embedding, tp: TensorGroup):
        super().__init__()
        self.tp, self.range = tp, tp.shard(full.num_embeddings)
        self.weight = shard_parameter(full.weight, Split(0), tp)
        declare(self, {"weight": Split(0)}, tp)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.range.start) | (ids >= self.range.stop)
        local = (ids - self.range.start).masked_fill(outside, 0)
        return leave(F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0), self.tp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross entropy of logits split over the vocabulary, never gathered: three all-reduces of
    one value per token (the max, the target's logit, the sum of exponentials), as Megatron-LM's."""

    @staticmethod
    def forward(ctx, logits, targets, tp):
        vocab = tp.shard(logits.shape[-1] * tp.size)
        top = all_reduce(logits.max(dim=-1).values, tp, dist.ReduceOp.MAX)
        shifted = logits - top.unsqueeze(-1)
        outside = (targets < vocab.start) | (targets >= vocab.stop)
        local = (targets - vocab.start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        picked = all_reduce(picked, tp)
        exp = shifted.exp()
        total = all_reduce(exp.sum(dim=-1), tp)
        ctx.save_for_backward(exp.div_(total.unsqueeze(-1)), local, outside)
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        inside = (~outside).to(softmax.dtype)
        grad_logits = softmax.scatter_add(-1, local.unsqueeze(-1), -inside.unsqueeze(-1))
        return grad_logits * grad.unsqueeze(-1), None, None


def vocab_parallel_loss(tp: TensorGroup):
    """The mean cross entropy of [b, s, V/t] logit shards against [b, s] targets (lm_loss's split form)."""
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        flat = logits.flatten(0, 1).float()
        return _VocabParallelCrossEntropy.apply(flat, targets.flatten(), tp).mean()
    return loss


# -- the run: pipeline messages, partial gradients, gathered gradients --------------------------------

@dataclass(frozen=True, slots=True)
class Messages:
    """How a boundary activation or gradient crosses from a stage to the next over t links. With
    `scatter` (the default under --tp) each tensor rank sends its 1/t of the flattened tensor to the
    same tensor rank of the peer stage, which all-gathers the whole in its tensor group; under sequence
    parallelism the tensor is already this rank's sequence shard and goes as it is; else each rank
    sends the whole tensor (--no-scatter-gather)."""

    tp: TensorGroup
    scatter: bool = True

    def wire_shape(self, shape: torch.Size) -> torch.Size:
        """What a receive's buffer holds, for a boundary tensor of the unpartitioned model's `shape`."""
        if self.tp.size == 1:
            return shape
        if self.tp.sequence_parallel:
            dims = list(shape)
            dims[SEQUENCE_DIM] //= self.tp.size
            return torch.Size(dims)
        return torch.Size([shape.numel() // self.tp.size]) if self.scattered(shape) else shape

    def scattered(self, shape: torch.Size) -> bool:
        """Whether a message of this shape is cut into 1/t slices and all-gathered by its receiver (a
        user model's boundary tensor that t does not divide goes whole)."""
        return (self.scatter and self.tp.size > 1 and not self.tp.sequence_parallel
                and shape.numel() % self.tp.size == 0)

    def outgoing(self, tensor: torch.Tensor) -> torch.Tensor:
        """The part of a boundary tensor this rank sends."""
        if self.scattered(tensor.shape):
            return tensor.reshape(-1).chunk(self.tp.size)[self.tp.rank].contiguous()
        return tensor.contiguous()

    def arrived(self, buffer: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """The boundary tensor from a received buffer: all-gathered over the tensor group when scattered."""
        return all_gather(buffer, self.tp, 0).view(shape) if self.scattered(shape) else buffer


def qualified(prefix: str, name: str) -> str:
    """A parameter's name in the unpartitioned model: its piece's name, a dot, its name in the piece (the
    name alone for a piece named "": the decoder's model.norm and lm_head)."""
    return f"{prefix}.{name}" if prefix else name


def global_splits(stage) -> list[tuple[str, nn.Parameter, Split | str | None]]:
    """A stage's (unpartitioned name, parameter, declaration), in the stage's order: the same on every
    tensor rank (a tensor two pieces share, once)."""
    found, seen = [], set()
    for prefix, piece in zip(stage.names, stage.pieces):
        splits = parameter_splits(piece)
        for name, p in piece.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                found.append((qualified(prefix, name), p, splits[name]))
    return found


def sync_partial_gradients(stages, tp: TensorGroup) -> None:
    """All-reduce, over the tensor group, the gradients declared PARTIAL (one flat all-reduce)."""
    grads = [gradient(p) for stage in stages for _, p, split in global_splits(stage)
             if split == PARTIAL and gradient(p) is not None]
    if tp.size == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=tp.group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def gathered_gradients(stage, tp: TensorGroup) -> dict[str, torch.Tensor]:
    """The stage's gradients as the unpartitioned model's, by its parameter names: split ones gathered
    over the tensor group and joined (collective: every tensor rank of the stage calls it)."""
    grads = {}
    for name, p, split in global_splits(stage):
        grad = gradient(p).detach()
        if isinstance(split, Split) and tp.size > 1:
            grad = join(list(all_gather(grad, tp, 0).chunk(tp.size)), split)
        grads[name] = grad.cpu().clone()
    return grads
