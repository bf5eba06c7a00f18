"""Activation bytes a transformer layer keeps for its backward, from the model's facts: the one rule the
cost model reads for Megatron's layer (Korthikanti et al. 2022, table 2) and the runtime's GPT measures.

Per layer and microbatch (s, b, h, a, f as usual, t tensor-parallel, w bytes a value, m bytes a dropout
mask value, 0 without dropout):

    replicated   layer-norm inputs, QKV input, MLP input (4 values of s·b·h), attention-out and MLP-out
                 dropout masks (2 masks of s·b·h); split over t only with sequence parallelism (the
                 QKV and MLP inputs kept as sequence shards and all-gathered again in backward, as
                 Megatron-LM's sequence-parallel linear layers do)
    norm stats   with torch's layer norms, each keeps its mean and 1/std (2 x 2 fp32 values per token;
                 RMSNorm its 1/rms alone, 2 x 1)
    split        Q, K, V and the projection's input (4 s·b·h; with grouped-query attention K and V are
                 s·b·h·kv_heads/heads each), the GeLU's input and the MLP-out input (2 s·b·f; a SwiGLU
                 keeps its gate and up outputs and the MLP-out input, 3 s·b·f): over t
    core         the attention core: with materialised scores the softmax output (a·s² per sequence),
                 with dropout its mask and output too; a fused (flash) kernel keeps one fp32 log-sum-exp
                 per head and token instead (its output is the projection's input, counted there): over t

Under FP8 training (Transformer Engine) the four linear GEMMs' inputs are kept as their FP8 casts, a
byte a value: QKV's and the MLP's (replicated), the projection's and the MLP-out's (split).

Rotary positions keep nothing more (their backward reads the angles, not the activations). Llama-family
models train without dropout (m = 0).

Selective recomputation drops the core, full keeps the layer's input only (s·b·h values, over t with
sequence parallelism). torchtitan's per-op selective checkpointing (selective-ops: parallelize_llama.py's
_save_list and "op" policy at 9dec370) keeps the block's input, the flash attention's output with its
log-sum-exp, and the output of every other matmul of the block counted in forward order, the first, third,
fifth... (Q, K, V, the projection, then a SwiGLU's gate, up and down: Q, V, gate and down kept; a GeLU
MLP's in and out: its in kept); everything else (norms, rotary, the activation, K, the projection, up) is
recomputed in the backward. With t > 1 (sequence-parallel, as torchtitan's apply_tp always is) the block's
input is a sequence shard, a column-parallel matmul keeps its output split over t, a row-parallel one (the
projection, the MLP's last) its whole partial sum (the output before the reduce-scatter), and the two
reduce-scatters' sequence shards are kept too (_c10d_functional.reduce_scatter_tensor is on the list); the
all-gathers are not, so the backward gathers again. With cp > 1 each op sees the rank's s/cp tokens
(context parallelism's ring runs inside the flash op the policy saves). Under torchao's Float8 (dynamic
tensorwise scaling, compiled) the policy sees each Float8Linear's mm on Float8Tensors and saves its
16-bit output as before; the FP8 casts are recomputed, and of each cast's max(abs(x)) the max is kept
(aten.max: a 0-dim value of the cast tensor's dtype, for each weight and each input cast), not the abs
(compiled, the backward reads the scale, not |x|: torchtitan #820 measured tensorwise memory unchanged
without abs on the list). Korthikanti's table is these facts at 16 bits with dropout and scores, f = 4h:
sbh(10 + 24/t + 5as/(ht)), and sbh(34 + 5as/h)/t with sequence parallelism.

This module imports nothing of schedc and no torch: the cost model and the runtime's benchmark read it.
"""
from __future__ import annotations

from dataclasses import dataclass

FP32_BYTES = 4  # log-sum-exp, layer-norm statistics and the loss's log-probabilities are fp32 at any width
INDEX_BYTES = 8  # token and position ids (int64)
FP8_BYTES = 1    # an FP8 value (Transformer Engine keeps its GEMMs' inputs so under FP8 training)
MASK_BYTES = 1   # a bool mask (the vocabulary-parallel lookup's and loss's tokens outside the rank's range)


@dataclass(frozen=True, slots=True)
class Sizes:
    """One microbatch through one layer: sequence s, microbatch b, hidden h, heads a, MLP width f,
    vocabulary (for the last stage's logits)."""

    seq: int
    batch: int
    hidden: int
    heads: int
    ffn: int
    vocab: int = 0
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: as many as heads

    @property
    def kv_hidden(self) -> float:
        """The width of K (and of V): h for multi-head attention, h * kv_heads / heads with fewer."""
        return self.hidden * self.kv_heads / self.heads if self.kv_heads else self.hidden


@dataclass(frozen=True, slots=True)
class Facts:
    """What a model keeps beyond its sizes: bytes of a value and of a dropout mask value (0: no
    dropout), whether attention materialises its scores, whether layer norms keep statistics, and
    whether the model's end pieces (embedding ids; final norm, logits and loss) are counted."""

    value_bytes: float
    mask_bytes: float = 0.0
    scores: bool = True
    norm_stats: bool = False
    ends: bool = False
    gated: bool = False   # a SwiGLU MLP: its first GEMM's output of 2f (gate and up) kept, not a GeLU input of f
    stat_values: int = 2  # fp32 values a norm keeps per token with norm_stats: LayerNorm's mean and 1/std, RMSNorm's 1/rms
    fp8_inputs: bool = False  # FP8 GEMMs (--fp8): Transformer Engine keeps their inputs as FP8 casts; the per-op policy their amaxes
    position_ids: bool = True  # with ends: learned positions, whose lookup keeps its ids (rotary: none)


def megatron(width: float) -> Facts:
    """Megatron's layer as Korthikanti counts it: dropout, materialised scores, no norm statistics,
    layers only; at another width than 16 bits every term (masks too) scales with it, as the cost
    model has always scaled the table."""
    return Facts(value_bytes=width, mask_bytes=width / 2, scores=True)


# The runtime's GPT (schedc/runtime/model/gpt.py) in fp32: no dropout, torch's layer norms, and
# scaled_dot_product_attention's fused kernel on CPU (it keeps a log-sum-exp, not the scores).
RUNTIME_GPT = Facts(value_bytes=4, mask_bytes=0, scores=False, norm_stats=True, ends=True)


def runtime_decoder(mlp: str, norm: str, positions: str) -> Facts:
    """The runtime's Llama-family decoder (schedc/runtime/model/decoder.py) in fp32 by its facts' names: the
    GPT's kernels, a SwiGLU keeping its gate and up inputs (Megatron-Core's fused SwiGLU), an RMSNorm
    its 1/rms, rotary positions no ids."""
    return Facts(value_bytes=4, mask_bytes=0, scores=False, norm_stats=True, ends=True, gated=mlp == "swiglu",
                 stat_values=1 if norm == "rmsnorm" else 2, position_ids=positions == "learned")


def layer_bytes(z: Sizes, facts: Facts, tp: int = 1, sequence_parallel: bool = False,
                recompute: str = "none") -> float:
    """Bytes one layer keeps for one microbatch until its backward (the module's table). The terms
    per s·b·h are summed as Korthikanti's formula sums them, so the cost model's figures are his to
    the last bit; the fp32 statistics come on top."""
    sbh, w, m = z.seq * z.batch * z.hidden, facts.value_bytes, facts.mask_bytes
    spread = tp if sequence_parallel else 1
    if recompute == "selective-ops":
        return op_policy_bytes(z, facts, tp)
    if recompute == "full":
        return w * sbh / spread
    replicated = 4 * w + 2 * m
    qkv = 2 + 2 * z.kv_hidden / z.hidden  # Q and the projection's input, K and V (kv_heads of them)
    split = (qkv + (3 if facts.gated else 2) * z.ffn / z.hidden) * w
    if facts.fp8_inputs:  # QKV's and the MLP's inputs, the projection's and the MLP-out's, a byte each
        replicated = 2 * w + 2 * FP8_BYTES + 2 * m
        split = (qkv - 1) * w + FP8_BYTES + ((2 if facts.gated else 1) * w + FP8_BYTES) * z.ffn / z.hidden
    per_sbh = (replicated + split) / tp if sequence_parallel else replicated + split / tp
    tokens = z.seq * z.batch
    stats = 2 * facts.stat_values * FP32_BYTES * tokens / spread if facts.norm_stats else 0
    if recompute == "none" and facts.scores:
        per_sbh += z.heads * z.seq * (w + (m + w if m else 0)) / (z.hidden * tp)
    elif recompute == "none":
        stats += FP32_BYTES * z.heads * tokens / tp  # the fused kernel's log-sum-exp
    return sbh * per_sbh + stats


def op_matmuls(z: Sizes, facts: Facts, tp: int = 1) -> tuple[tuple[float, float], ...]:
    """A block's matmuls as a rank computes them, (output width, input width), in the order its forward runs
    them (torchtitan's Llama block: wq, wk, wv, wo, then w1, w3, w2 for a SwiGLU; a GeLU MLP's in and out).
    Over t the column-parallel ones split their output, the row-parallel ones (wo, the MLP's last) their
    input and give a whole partial sum. The per-op policy keeps the outputs of [::2] and recomputes [1::2]
    (costmodel/stages.py's op_policy_gemms)."""
    h, kv, f = z.hidden, z.kv_hidden, z.ffn
    mlp = ((f / tp, h), (f / tp, h), (h, f / tp)) if facts.gated else ((f / tp, h), (h, f / tp))
    return ((h / tp, h), (kv / tp, h), (kv / tp, h), (h, h / tp)) + mlp


def op_policy_bytes(z: Sizes, facts: Facts, tp: int = 1) -> float:
    """Bytes torchtitan's per-op policy keeps of one block on one rank (a flash kernel; t > 1 sequence-
    parallel): the block's input, the odd-numbered matmuls' outputs (the policy saves mm but every second
    one), the flash kernel's output and its fp32 log-sum-exp per head and token, with t > 1 the two
    reduce-scatters' outputs, under FP8 the amax of each cast: every matmul's weight and input (t = 1: each
    Float8Linear casts its own), at t > 1 the inputs cast once a module (torchao's PrepareFloat8ModuleInput
    before the attention's and the MLP's gathers, Float8RowwiseParallel before wo and the MLP's last).

        Llama 3.1 8B, b 2, s 8192 (h 4096, kv 1024, f 14336, 32 heads), bf16:
        2·16384·(4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4·32·16384 = 1,042,284,544
    """
    tokens, matmuls = z.seq * z.batch, op_matmuls(z, facts, tp)
    kept = sum(width for width, _ in matmuls[::2])
    scattered = 2 * z.hidden / tp if tp > 1 else 0.0
    values = tokens * (z.hidden / tp + kept + z.hidden / tp + scattered)
    amax = len(matmuls) + (4 if tp > 1 else len(matmuls)) if facts.fp8_inputs else 0
    return facts.value_bytes * (values + amax) + FP32_BYTES * z.heads * tokens / tp


def end_bytes(z: Sizes, facts: Facts, first: bool, last: bool, tp: int = 1,
              sequence_parallel: bool = False) -> float:
    """What the model's end pieces keep (with facts.ends): the first stage's token ids and position ids
    (a slice of them under sequence parallelism; none with rotary positions, facts.position_ids; with
    t > 1 the vocabulary-parallel lookup's mask of tokens outside the rank's range, a byte a token); the
    last stage's final layer norm (input, statistics) and the logits' input, both on sequence shards
    under sequence parallelism, the loss's fp32 probabilities (1/t of the vocabulary with t > 1) and
    targets, and the total weight (t = 1) or the outside-the-range mask (t > 1)."""
    if not facts.ends:
        return 0.0
    sb, total = z.seq * z.batch, 0.0
    spread = tp if sequence_parallel else 1
    mask = MASK_BYTES * sb if tp > 1 else 0
    if first:
        total += INDEX_BYTES * (sb + (z.seq // spread if facts.position_ids else 0)) + mask
    if last:
        stats = facts.stat_values * FP32_BYTES * sb / spread if facts.norm_stats else 0
        total += 2 * facts.value_bytes * sb * z.hidden / spread + stats + FP32_BYTES * sb * z.vocab / tp
        total += INDEX_BYTES * sb + (mask if tp > 1 else FP32_BYTES)
    return total


def stage_bytes(z: Sizes, facts: Facts, layers: int, first: bool, last: bool, tp: int = 1,
                sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes a stage of `layers` layers keeps for one microbatch: its layers and, with facts.ends, the
    end pieces it holds (recomputation repeats layers only)."""
    return layers * layer_bytes(z, facts, tp, sequence_parallel, recompute) + \
        end_bytes(z, facts, first, last, tp, sequence_parallel)
