# Sequence chunks (Seq1F1B, Sun et al. 2024): a plan compiled with `microbatches m chunks k` runs
# every microbatch's sequence of s tokens as k chunks of s/k, each a unit of its own (unit i*k + j is
# microbatch i's chunk j, schedc.ops.split_unit): its own F and B, its own [b, s/k, h] messages.
#
# Chunk j's forward on a stage attends causally to the keys and values of chunks 0..j of its
# microbatch on that stage. Each attention layer asks `extend` for them: chunk j's own k_j, v_j stay
# in its graph, the earlier chunks' come from a cache per (stage, microbatch) as detached leaves (one
# leaf per layer and earlier chunk, shared by every later chunk), concatenated before chunk j's. The
# backward of a later chunk leaves its gradient in those leaves' .grad (summed over the later chunks
# by autograd); the backward of chunk j then runs from its output and its own k_j, v_j at once:
#
#     torch.autograd.backward([y_j, k_j, v_j, ...], [dy_j, leaf(k_j).grad, leaf(v_j).grad, ...])
#
# so forwards run in chunk order, backwards in reverse chunk order (the plan's built-in chunk
# dependencies, schedc.ops.chunk_step; anything else is refused as it happens). Chunk j's positions
# are j*s/k .. (j+1)*s/k - 1 (`position`); its loss is the mean over its tokens divided by k, so the
# chunks of a microbatch sum to the microbatch's mean loss.
#
# Chunk j's queries see every key of chunks 0..j (the keys run on s/k * j before its first query): the
# causal mask aligned to the lower right corner, torch's causal_lower_right(s/k, s/k * (j + 1)), which
# scaled_dot_product_attention runs as flash or memory-efficient attention on CUDA where those apply
# (a boolean mask rules both out) and as the materialized mask elsewhere. The explicit masks stay where
# the pattern is not that corner: a sliding window (model/spans.py) and context ranks (context.py),
# neither of which runs with chunks.
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch.nn.attention.bias import causal_lower_right

from schedc.ops import DECLARED, split_unit
from schedc.plan import Opcode, Plan, PlanError

from . import context

# the instructions a chunked plan may hold: F, B, messages, gradient sync, declared collectives and the step
RUNS = frozenset({Opcode.F.value, Opcode.B.value, Opcode.SEND_F.value, Opcode.RECV_F.value, Opcode.SEND_B.value,
                  Opcode.RECV_B.value, Opcode.SYNC_GRAD.value, Opcode.STEP.value}) | DECLARED


class ChunkError(RuntimeError):
    """A chunk that cannot run: its forward or backward out of the order its keys and values need, or
    a microbatch whose sequence does not cut into the chunks."""


@dataclass(slots=True)
class Cache:
    """One (stage, microbatch)'s chunks on this rank: per chunk run forward, per attention layer, its
    own (k, v) in its graph and the detached leaves the later chunks read; the chunks whose backward
    is still to run."""

    own: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)
    leaves: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)
    waiting: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Running:
    """The chunk whose forward is running: its cache, index, count, length, and the next layer."""

    cache: Cache
    chunk: int
    chunks: int
    length: int
    layer: int = 0

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The keys and values [b, heads, t, d] chunk `chunk` attends to at this layer, and its causal
        mask (None for the first chunk: plain causal attention)."""
        layer, self.layer = self.layer, self.layer + 1
        self.cache.own[self.chunk].append((k, v))
        if self.chunk < self.chunks - 1:
            self.cache.leaves[self.chunk].append((k.detach().requires_grad_(), v.detach().requires_grad_()))
        if self.chunk == 0:
            return k, v, None
        earlier = [self.cache.leaves[j][layer] for j in range(self.chunk)]
        keys = torch.cat([lk for lk, _ in earlier] + [k], dim=2)
        values = torch.cat([lv for _, lv in earlier] + [v], dim=2)
        return keys, values, causal_lower_right(k.shape[2], keys.shape[2])


_RUNNING: list[Running] = []  # the chunk forward in progress (forwards do not nest)


def extend(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """What an attention layer attends to: inside a chunk's forward, the earlier chunks' keys and values
    too (Running.extend); under context parallelism every context rank's (context.py); else its own,
    plainly causal (mask None)."""
    if _RUNNING:
        return _RUNNING[-1].extend(k, v)
    return context.ACTIVE[-1].extend(k, v) if context.ACTIVE else (k, v, None)


def positions(count: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    """The positions of `count` tokens from the `offset`-th token of what this forward holds: a context
    rank's own (context.py), else from the running chunk's first position (0 outside a chunk)."""
    if context.ACTIVE:
        return context.ACTIVE[-1].positions[offset:offset + count].to(device)
    first = position() + offset
    return torch.arange(first, first + count, device=device)


def position() -> int:
    """The position of the running chunk's first token (0 outside a chunk's forward)."""
    return _RUNNING[-1].chunk * _RUNNING[-1].length if _RUNNING else 0


class SequenceChunks:
    """The executor's side of sequence chunks (k = 1: none, each call the plain form): the data of a
    unit, the forward's context, the backward's roots."""

    def __init__(self, chunks: int = 1):
        self.chunks = chunks
        self.caches: dict[tuple[int, int], Cache] = {}

    @classmethod
    def of(cls, plan: Plan) -> SequenceChunks:
        return cls(plan.meta.get("chunks", 1))

    def message_shapes(self, shapes: list) -> list:
        """Each stage's output (shape, dtype) for one unit: a chunk's [b, s/k, ...] of the whole one's."""
        if self.chunks == 1:
            return shapes
        return [(torch.Size((shape[0], shape[1] // self.chunks, *shape[2:])), dtype) for shape, dtype in shapes]

    def data(self, batch, first: int, unit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of `unit`, whose microbatch is `first` + its index in the batch: its
        chunk's columns of them."""
        i, j = split_unit(unit, self.chunks)
        tokens, targets = batch.microbatch(first + i)
        if self.chunks == 1:
            return tokens, targets
        if tokens.shape[1] % self.chunks or targets.shape[1:2] != tokens.shape[1:2]:
            raise ChunkError(f"a microbatch of {tokens.shape[1]} tokens (targets {tuple(targets.shape)}) "
                                  f"cannot be cut into {self.chunks} sequence chunks")
        length = tokens.shape[1] // self.chunks
        columns = slice(j * length, (j + 1) * length)
        return tokens[:, columns], targets[:, columns]

    def forward(self, stage: int, unit: int, length: int):
        """The context of unit's forward on `stage`, its chunk `length` tokens long."""
        if self.chunks == 1:
            return nullcontext()
        return self._forward(stage, unit, length)

    @contextmanager
    def _forward(self, stage: int, unit: int, length: int):
        i, j = split_unit(unit, self.chunks)
        cache = self.caches.setdefault((stage, i), Cache())
        if len(cache.own) != j:
            raise ChunkError(f"the forward of chunk {j} of microbatch {i} on stage {stage} runs after "
                                  f"{len(cache.own)} of its chunks' forwards; it needs those of chunks 0 to {j - 1}"
                                  if j else f"microbatch {i} on stage {stage} runs forward again before its backward")
        cache.own.append([])
        cache.leaves.append([])
        cache.waiting.add(j)
        _RUNNING.append(Running(cache, j, self.chunks, length))
        try:
            yield
        finally:
            _RUNNING.pop()

    def backward_roots(self, stage: int, unit: int, y: torch.Tensor, grad: torch.Tensor | None) -> tuple[list, list]:
        """(tensors, gradients) for torch.autograd.backward of unit on `stage`: its output and, for every
        chunk but the last, its own keys and values with the gradients the later chunks gave them."""
        if self.chunks == 1:
            return [y], [grad]
        i, j = split_unit(unit, self.chunks)
        cache = self.caches.get((stage, i))
        if cache is None or j not in cache.waiting:
            raise ChunkError(f"the backward of chunk {j} of microbatch {i} on stage {stage} runs before its forward")
        later = [c for c in range(j + 1, self.chunks) if c in cache.waiting or c >= len(cache.own)]
        if later:
            raise ChunkError(f"the backward of chunk {j} of microbatch {i} on stage {stage} runs before that "
                                  f"of chunk {later[-1]}, which gives it the gradient of its keys and values")
        roots, grads = [y], [grad]
        for own, leaf in zip(cache.own[j], cache.leaves[j]):
            for tensor, copy in zip(own, leaf):
                if copy.grad is not None:
                    roots.append(tensor)
                    grads.append(copy.grad)
        cache.own[j], cache.leaves[j] = [], []
        cache.waiting.discard(j)
        if j == 0:
            del self.caches[(stage, i)]
        return roots, grads


def check_chunks(plan: Plan, opts) -> None:
    """What a chunked plan cannot run with, refused by name before any process starts."""
    chunks = plan.meta.get("chunks", 1)  # an integer dividing the microbatch units: checked on loading
    if chunks == 1:
        return
    if opts.cp > 1:
        raise PlanError(f"--cp {opts.cp} does not compose with a chunked plan (Seq1F1B's {chunks} chunks) yet: "
                        "Seq1F1B runs a sequence's consecutive chunks one after another while --cp gives each rank "
                        "chunks i and 2cp-1-i of it, so a chunk's attention would need the earlier chunks' keys and "
                        "values from every context rank, which neither exchange provides")
    ops = sorted({i.op for steps in plan.ranks for step in steps for i in step} - RUNS)
    if ops:
        names = {Opcode.I.value: "split backward (I, W)", Opcode.W.value: "split backward (I, W)",
                 Opcode.OVERLAP_F_B.value: "overlapped F & B (OVERLAP_F_B)", Opcode.R.value: "placed recomputation (R)",
                 Opcode.O.value: "offload (O, L)", Opcode.L.value: "offload (O, L)"}
        what = sorted({names.get(op, f"'{op}'") for op in ops})
        raise PlanError(f"the plan runs {chunks} sequence chunks per microbatch with {', '.join(what)}: this runtime "
                        "runs chunks with F and B only; compile the schedule without 'chunks' to run it")
    problem = _option_problem(opts, chunks)
    if problem:
        raise PlanError(f"the plan runs {chunks} sequence chunks per microbatch: {problem}")


def _option_problem(opts, chunks: int) -> str | None:
    seq = opts.model_config.seq
    if seq % chunks:
        return f"--seq {seq} is not a multiple of {chunks}"
    refused = [("--tp", opts.tp > 1, "tensor parallelism"), ("--recompute full", opts.recompute == "full",
               "full recomputation (a layer's replay would not see the earlier chunks' keys and values)"),
               ("--model-code", bool(opts.model_code), "a model of your own (only the runtime's GPT and decoder read "
                "the earlier chunks' keys and values)"),
               ("--loss", bool(opts.loss), "a loss of your own (a chunk's loss is the GPT's cross entropy over "
                "its tokens, divided by the chunks)"), ("--tasks", bool(opts.tasks), "user tasks")]
    for option, given, what in refused:
        if given:
            return f"{option} ({what}) is not supported with sequence chunks; leave it out"
    return None
