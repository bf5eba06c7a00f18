"""The attention core at its kernel's achieved rate, block by block, where the cluster names the kernel
([attention], kernels.py), and context parallelism's ring as the stack runs it: the blocks each step
computes, the merge of each step's partial output through HBM, and the key/value exchange each step
leaves exposed. Without the table costmodel/stages.py charges the attention as a GEMM, as before.

The two rings (Megatron-Core's load balance in both: the sequence in 2·cp chunks, GPU i holding chunks
i and 2·cp-1-i):
- "p2p", Transformer Engine's attn_forward_func_with_cp (cp_comm_type "p2p", Megatron-Core's default):
  each step sends the keys and values to the next GPU while the step's block computes; the backward
  sends them with their gradients; each step's partial output is merged by one fused kernel
  (flash_attn_fwd_out_correction: out += out_step * exp(lse_step - lse), at the output's dtype).
- "all-gather", torch's _templated_ring_attention of late 2024 (torch/distributed/tensor/experimental/
  _attention.py, the torch of torchtitan's December 2024 benchmarks: enable_load_balance and
  _RotateMethod.ALL_GATHER its defaults): the keys and values all-gathered once per forward, waited for
  after the first (diagonal) block; the backward all-gathers them again and passes the key/value
  gradients round in fp32 (an all-to-all per step, the last one waited for after the loop); every merge
  an eager fp32 op through HBM (_SDPAMerger: the step's output cast to fp32, out - sigmoid(lse_step -
  lse) * (out - out_step); the gradients accumulated in fp32, torch.cat copies for the partial chunks
  and the send buffer).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..descriptions.facts import window_share
from .hardware import Setting

BACKWARD_FLOPS = 2.5   # a flash backward's products over its forward's (five against two: FlashAttention-2,
                       # Dao 2023, section 3.1.2; the FlashAttention papers' benchmarks count it so)
FP32 = 4               # bytes of the fp32 values torch's merges and gradient exchange use

# HBM bytes per value of the GPU's attention output (b·(s/cp)·h/t values), per ring step after the first:
TORCH_MERGE_BYTES = 38  # _SDPAMerger, eager: cast 2 read + 4 write; out - out_step 4 + 4 read, 4 write;
                        # times the sigmoid 4 read, 4 write; out - that 4 + 4 read, 4 write
TE_MERGE_BYTES = 6      # flash_attn_fwd_out_correction, one fused kernel at 16 bits: out and out_step
                        # read, out written
# backward, per ring step: per query value (dq) and per key or value value (dk, dv)
TORCH_DQ_BYTES = 10     # grad_query += block's: the fp32 sum read and written (8), the block's 16-bit read (2)
TORCH_DKV_BYTES = 26    # the same add (10), _partial_update's torch.cat copy of the fp32 sum (8), the
                        # send buffer's torch.cat of grad_key and grad_value (8)
TE_GRAD_BYTES = 6       # the gradients' accumulation as the forward's fused read-modify-write at 16 bits
KV_CAT_BYTES = 4        # torch's forward: torch.cat of the keys and values into the send buffer per step


@dataclass(frozen=True, slots=True)
class Block:
    """One attention kernel call: its queries, keys and whether the causal mask applies."""

    queries: int
    keys: int
    causal: bool


def ring_blocks(cp: int, tokens: int) -> tuple[Block, ...]:
    """The blocks one GPU's attention computes, one per ring step, holding `tokens` (s/cp) of the
    sequence: without context parallelism the whole causal sequence; with it, step 0 its own two chunks
    under the mask, then cp - 1 half blocks without one (from an earlier GPU all its queries against
    the first key chunk, from a later GPU its second query chunk against both). Each half block's rate
    is the kernel's at the shorter side, tokens/2: the GPUs that get the short key side set the pace,
    and the ring waits for the slowest each step.

    >>> ring_blocks(1, 8192)
    (Block(queries=8192, keys=8192, causal=True),)
    >>> ring_blocks(3, 8192)[1:]
    (Block(queries=8192, keys=4096, causal=False), Block(queries=8192, keys=4096, causal=False))
    """
    return (Block(tokens, tokens, True),) + (Block(tokens, tokens // 2, False),) * (cp - 1)


def block_flops(st: Setting, block: Block) -> float:
    """A block's forward FLOPs on one GPU: QK^T and the product with V, 2·2·q·k·d per query head (a/t
    of them, b sequences); half of that under the causal mask (the count the FlashAttention papers'
    causal rates use)."""
    m, lay = st.model, st.layout
    flops = 4 * lay.microbatch_size * (m.heads / lay.tp) * block.queries * block.keys * (m.hidden / m.heads)
    return flops / 2 if block.causal else flops


def block_seconds(st: Setting, block: Block) -> tuple[float, float]:
    """A block's forward and backward seconds at the kernel's rates for its key length (scaled to the
    cluster's peak where the table names the peak it was measured at)."""
    kernel = st.cluster.attention
    flops = block_flops(st, block) / kernel.scaled(st.cluster.peak_flops)
    forward = flops / kernel.rate("forward_causal" if block.causal else "forward", block.keys)
    backward = BACKWARD_FLOPS * flops / kernel.rate("backward_causal" if block.causal else "backward", block.keys)
    return forward, backward


def kernel_terms(st: Setting) -> tuple[float, float, float]:
    """attention_terms' three with a kernel table: the forward's blocks with the merges, nothing
    through HBM beside (a flash kernel), the backward's blocks with the gradients' accumulation. A
    sliding window w < s leaves the kernel the band's pairs (window_share: it skips the blocks outside
    the band; context parallelism with a window is refused before this)."""
    share = window_share(st.tokens, st.model.window)
    blocks = [block_seconds(st, b) for b in ring_blocks(st.layout.cp, st.tokens)]
    merge_forward, merge_backward = merge_seconds(st)
    return (share * sum(f for f, _ in blocks) + merge_forward, 0.0, share * sum(b for _, b in blocks) + merge_backward)


def exchanged_values(st: Setting) -> tuple[float, float]:
    """Values per ring step on one GPU: (its attention output's, its keys' and values' as the ring
    carries them: at the key/value heads, or at the query heads where the model repeats them first)."""
    m, lay = st.model, st.layout
    kv_hidden = m.hidden if st.cluster.attention.repeated_kv else m.kv_hidden
    tokens = lay.microbatch_size * st.tokens
    return tokens * m.hidden / lay.tp, 2 * tokens * kv_hidden / lay.tp


def merge_seconds(st: Setting) -> tuple[float, float]:
    """The ring's merges through HBM, forward and backward (none without context parallelism): each
    step after the first merges its partial output, every backward step accumulates the gradients."""
    cp = st.layout.cp
    if cp == 1:
        return 0.0, 0.0
    out, kv = exchanged_values(st)
    if st.cluster.attention.context_parallel == "all-gather":
        forward = (cp - 1) * (TORCH_MERGE_BYTES * out + KV_CAT_BYTES * kv)
        backward = cp * (TORCH_DQ_BYTES * out + TORCH_DKV_BYTES * kv)
    else:
        forward = (cp - 1) * TE_MERGE_BYTES * out
        backward = cp * TE_GRAD_BYTES * (out + kv)
    return st.hw.memory(forward), st.hw.memory(backward)


def kernel_ring_exposed(st: Setting) -> tuple[float, float]:
    """Seconds of the key/value exchange one layer's forward and backward leave exposed, one
    microbatch, behind the blocks as kernel_terms times them (module docstring: the two rings).

    p2p: step i's keys and values (and, backward, their gradients: twice the bytes) travel while step
    i - 1's block computes. all-gather: the gather of all cp GPUs' keys and values hides under the
    diagonal block only (forward, and again backward); the backward's fp32 gradient of each step
    travels under the next step's block, the last one under nothing."""
    blocks = [block_seconds(st, b) for b in ring_blocks(st.layout.cp, st.tokens)]
    _, kv = exchanged_values(st)
    width, hw, cp = st.model.width, st.hw, st.layout.cp
    if st.cluster.attention.context_parallel == "p2p":
        message = hw.message(kv * width, st.cp_in_node)
        return (sum(max(0.0, message - f) for f, _ in blocks[:-1]),
                sum(max(0.0, 2 * message - b) for _, b in blocks[:-1]))
    per_node = max(1, min(cp, st.cluster.gpus_per_node // st.layout.tp))
    gather = hw.all_gather(cp * kv * width, cp, per_node)
    gradient = hw.message(kv * FP32, st.cp_in_node)
    forward = max(0.0, gather - blocks[0][0])
    backward = max(0.0, gather - blocks[0][1]) + sum(max(0.0, gradient - b) for _, b in blocks[1:]) + gradient
    return forward, backward
