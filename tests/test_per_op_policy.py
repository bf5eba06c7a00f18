"""The per-op policy's saved bytes against torch's own selective checkpointing: torchtitan's policy at
9dec370 (parallelize_llama.py's _save_list and its every-second-mm rule) run by torch.utils.checkpoint on a
block written here as torchtitan's model.py writes it (RMSNorm, grouped-query attention through
scaled_dot_product_attention, SwiGLU), at t = 1 and at t = 2 under torchtitan's apply_tp plan (sequence-
parallel norms, column- and row-parallel linears, on a one-process fake group of 2), and with Float8 linears
written as torchao v0.7.0 writes them (a stand-in for its Float8Tensor). What the policy's
cache holds after the forward, and the block's input the checkpoint keeps, is the table's figure for the
same config to the byte. On CPU the fused attention is _scaled_dot_product_flash_attention_for_cpu, the
CPU form of the CUDA flash op on the list (the same output and fp32 log-sum-exp)."""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import pytest
import torch

from conftest import ROOT
from schedc.costmodel import layer_activation_bytes
from schedc.costmodel.specs import load_cluster, load_cluster_model
from schedc.layout import Layout

F = torch.nn.functional
CONFIG = ROOT / "tests" / "data" / "hf" / "tiny-llama" / "config.json"
SEQ = 32


def save_list() -> set:
    ops = torch.ops
    return {ops.aten.mm.default, ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
            ops._c10d_functional.reduce_scatter_tensor.default, ops.aten.abs.default, ops.aten.max.default}


class Attention(torch.nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        h, self.head = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"]
        kv = c["num_key_value_heads"] * self.head
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(h, n, bias=False) for n in (h, kv, kv, h))

    def forward(self, y):
        b, s, _ = y.shape
        q, k, v = (w(y).view(b, s, -1, self.head).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))


class FeedForward(torch.nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.w1, self.w2, self.w3 = (torch.nn.Linear(i, o, bias=False) for i, o in ((h, f), (f, h), (h, f)))

    def forward(self, y):
        return self.w2(F.silu(self.w1(y)) * self.w3(y))


class Block(torch.nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = torch.nn.RMSNorm(c["hidden_size"]), torch.nn.RMSNorm(c["hidden_size"])
        self.attention, self.feed_forward = Attention(c), FeedForward(c)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def policy(meta: dict):
    """torchtitan's _custom_policy: the ops on the list saved, but every second mm."""
    from torch.utils.checkpoint import CheckpointPolicy
    listed = save_list()

    def decide(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        keep = func in listed and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return decide


def local_bytes(tensor) -> int:
    from torch.distributed.tensor import DTensor
    tensor = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return tensor.numel() * tensor.element_size()


def cached_bytes(block, x) -> int:
    """The bytes the policy's cache holds after one forward of the checkpointed block, plus its input;
    then a backward, so the recomputation runs from the cache."""
    from torch.utils._pytree import tree_flatten
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    caches = []

    def contexts():
        made = create_selective_checkpoint_contexts(policy(defaultdict(int)))
        caches.append(made[0].storage)
        return made

    out = checkpoint(block, x, use_reentrant=False, context_fn=contexts)
    held = [getattr(leaf, "val", leaf) for entries in caches[0].values() for entry in entries.values()
            if isinstance(entry, tuple) or hasattr(entry, "val") for leaf in tree_flatten(entry)[0]]
    total = sum(local_bytes(t) for t in held if isinstance(t, torch.Tensor)) + local_bytes(x)
    getattr(out, "to_local", lambda: out)().float().sum().backward()
    return total


def table_bytes(**layout) -> float:
    h100 = replace(load_cluster("dgx-h100-80gb"), attention=None)
    model = load_cluster_model(str(CONFIG), h100, seq=SEQ)
    return layer_activation_bytes(model, Layout(microbatch_size=1, recompute="selective-ops", **layout))


def test_torchs_cache_under_the_policy_is_the_tables_at_t1():
    torch.manual_seed(0)
    block = Block(json.loads(CONFIG.read_text())).to(torch.bfloat16)
    x = torch.randn(1, SEQ, block.attention.wq.in_features, dtype=torch.bfloat16, requires_grad=True)
    assert cached_bytes(block, x) == table_bytes() == 30_208


@pytest.fixture
def fake_group_of_two():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


def test_torchs_cache_under_the_policy_is_the_tables_at_t2_sequence_parallel(fake_group_of_two):
    """torchtitan's apply_tp block plan at 9dec370; the block's input is the rank's sequence shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    torch.manual_seed(0)
    block = Block(json.loads(CONFIG.read_text())).to(torch.bfloat16)
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    parallelize_module(block, init_device_mesh("cpu", (2,)), {
        "attention_norm": SequenceParallel(), "attention": gather,
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(), "feed_forward": gather,
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel()})
    x = torch.randn(1, SEQ // 2, 64, dtype=torch.bfloat16, requires_grad=True)
    assert cached_bytes(block, x) == table_bytes(tp=2, sequence_parallel=True) == 21_248


class Float8(torch.Tensor):
    """A stand-in for torchao's Float8Tensor (v0.7.0, tensorwise): FP8 data and a scale under the original
    dtype, whose mm dequantizes and returns that dtype (float8_ops.float8_mm: output_dtype = a._orig_dtype)."""

    @staticmethod
    def __new__(cls, data, scale, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=dtype, device=data.device)

    def __init__(self, data, scale, dtype) -> None:
        self.data8, self.scale, self.orig = data, scale, dtype

    def high(self):
        return (self.data8.float() / self.scale).to(self.orig)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            return args[0].high() @ args[1].high()
        if func in (torch.ops.aten.t.default, torch.ops.aten.detach.default):
            return Float8(func(args[0].data8), args[0].scale, args[0].orig)
        raise NotImplementedError(func)


def to_float8(x):
    """torchao's hp_tensor_to_float8_dynamic: amax = max(abs(x)) (tensor_to_amax), scale, clamp, cast."""
    scale = 448.0 / torch.max(torch.abs(x)).float().clamp(min=1e-12)
    return Float8((x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale, x.dtype)


class Float8Matmul(torch.autograd.Function):
    """torchao's manual_float8_matmul_with_args_in_float8: saves the two FP8 casts, torch.mm on them."""

    @staticmethod
    def forward(ctx, x8, w8t):
        ctx.save_for_backward(x8, w8t)
        return torch.mm(x8, w8t)

    @staticmethod
    def backward(ctx, grad):
        x8, w8t = ctx.saved_tensors
        return grad @ w8t.high().t(), x8.high().t() @ grad


class Float8Linear(torch.nn.Module):
    def __init__(self, linear) -> None:
        super().__init__()
        self.weight = linear.weight

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        return Float8Matmul.apply(to_float8(flat), to_float8(self.weight).t()).view(*x.shape[:-1], -1)


def test_torchs_cache_under_the_policy_with_float8_linears_is_the_tables_and_the_eager_abs():
    """The policy sees each Float8 linear's aten.mm on the two casts (its dispatch mode before the subclass)
    and caches the 16-bit output, so the count is BF16's; each cast's max is a 0-dim bf16 value (2 a
    linear). Eager, it caches every abs(x) and abs(W) too (why --fp8 --eager is refused); compiled,
    torchtitan #820 measured tensorwise memory the same without abs on the list: the table's --fp8
    figure is the cache less the abs outputs."""
    torch.manual_seed(0)
    block = Block(json.loads(CONFIG.read_text())).to(torch.bfloat16)
    for owner in (block.attention, block.feed_forward):
        for name, child in list(owner.named_children()):
            setattr(owner, name, Float8Linear(child))
    x = torch.randn(1, SEQ, 64, dtype=torch.bfloat16, requires_grad=True)
    tokens, linears = SEQ, [block.attention.wq, block.attention.wk, block.attention.wv, block.attention.wo,
                            block.feed_forward.w1, block.feed_forward.w3, block.feed_forward.w2]
    abs_bytes = sum(2 * (tokens * lin.weight.shape[1] + lin.weight.numel()) for lin in linears)
    assert cached_bytes(block, x) - abs_bytes == table_bytes(fp8=True) == 30_236
