# Tests of the tensor-parallel collectives (schedc/runtime/model/tensor_parallel.py) in one process: the
# collectives are replaced by fakes of a two-rank group whose other rank holds 10 x + 1 where this one holds
# x, so each result is checked against a cat or a sum built here; the list forms (all_gather,
# reduce_scatter) must not be called, and the all-reduce must not copy a contiguous tensor.
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from schedc.runtime.model.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, TensorGroup, all_gather, all_reduce, input_half,
    reduce_scatter)

RANK = 1


def peer(x: torch.Tensor) -> torch.Tensor:
    """What the other rank of the fake group holds where this one holds x."""
    return 10 * x + 1


@pytest.fixture
def calls(monkeypatch):
    """Fake two-rank collectives, counted by name; the list forms raise."""
    counted: dict[str, int] = {}

    def count(name):
        counted[name] = counted.get(name, 0) + 1

    def gather_into(out, x, group=None):
        count("all_gather_into_tensor")
        mine = [x, peer(x)] if RANK == 0 else [peer(x), x]
        assert out.shape == (2 * x.shape[0], *x.shape[1:])  # gloo's and NCCL's contract: joined along dim 0
        out.copy_(torch.cat(mine))

    def scatter_tensor(out, parts, op=dist.ReduceOp.SUM, group=None):
        count("reduce_scatter_tensor")
        assert parts.shape == (2 * out.shape[0], *out.shape[1:])
        mine = parts.chunk(2)[RANK]
        out.copy_(mine + peer(mine))

    def reduce(x, op=dist.ReduceOp.SUM, group=None):
        count("all_reduce")
        x.add_(peer(x))

    def refused(*args, **kwargs):
        raise AssertionError("a list-form collective was called")

    for name, fake in (("all_gather_into_tensor", gather_into), ("reduce_scatter_tensor", scatter_tensor),
                       ("all_gather_single", gather_into), ("reduce_scatter_single", scatter_tensor)):
        monkeypatch.setattr(dist, name, fake, raising=False)  # the old names and torch 2.13's
    monkeypatch.setattr(dist, "all_reduce", reduce)
    monkeypatch.setattr(dist, "all_gather", refused)
    monkeypatch.setattr(dist, "reduce_scatter", refused)
    return counted


def joined(x: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [x, peer(x)] if RANK == 0 else [peer(x), x]
    return torch.cat(parts, dim=dim)


@pytest.mark.parametrize("shape, dim", [((3, 4, 5), 1), ((1, 4, 5), 1), ((6, 5), 0), ((2, 3, 4), 2)])
def test_gather_and_scatter_equal_a_cat_and_a_chunked_sum(calls, shape, dim):
    tp = TensorGroup(2, RANK)
    x = torch.randn(shape)
    assert torch.equal(all_gather(x, tp, dim), joined(x, dim))
    assert torch.equal(reduce_scatter(x, tp, dim), (x + peer(x)).chunk(2, dim=dim)[RANK])
    assert calls == {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1}


def test_all_reduce_of_a_contiguous_tensor_is_in_place(calls):
    x = torch.randn(3, 4)
    want = x + peer(x)
    assert all_reduce(x, TensorGroup(2, RANK)) is x and torch.equal(x, want)
    strided = torch.randn(4, 3).T
    assert torch.equal(all_reduce(strided, TensorGroup(2, RANK)), strided + peer(strided))


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_the_parallel_linears_run_forward_and_backward_without_list_collectives(calls, sequence_parallel):
    torch.manual_seed(0)
    tp = TensorGroup(2, RANK, sequence_parallel=sequence_parallel)
    column, row = ColumnParallelLinear(nn.Linear(6, 8), tp), RowParallelLinear(nn.Linear(8, 6), tp)
    x = torch.randn(2, 4, 6, requires_grad=True)
    y = row(column(x))
    y.square().sum().backward()
    assert x.grad is not None and column.weight.grad is not None and row.weight.grad is not None
    # each linear one collective forward, one backward; the gathered column linear gathers its input again
    # in backward (it keeps only its shard: _GatheredLinear)
    want = {"all_gather_into_tensor": 3, "reduce_scatter_tensor": 2} if sequence_parallel else {"all_reduce": 2}
    assert calls == want


def test_the_row_parallel_sum_keeps_autograd_right(calls):
    """The forward all-reduce writes into the linear's output; g's backward is the identity, so the input
    gradient is still dy W."""
    torch.manual_seed(0)
    dense = nn.Linear(4, 3, bias=False)
    row = RowParallelLinear(dense, TensorGroup(2, RANK))
    x = torch.randn(5, 2, requires_grad=True)
    partial = x @ row.weight.T
    y = row(x)
    assert torch.allclose(y, partial + peer(partial), atol=1e-6)
    y.sum().backward()
    assert torch.allclose(x.grad, torch.ones(5, 3) @ row.weight, atol=1e-6)


def _split_backward(module: nn.Module, x: torch.Tensor, calls: dict) -> tuple[dict, dict]:
    """I then W as the executor runs them (torch's stage_backward_input / _weight): the collectives each
    called, counted apart."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    y = module(x).clone()  # a stage's output, which I detaches in place: not a view
    calls.clear()
    with input_half():
        _, groups = stage_backward_input([y], [torch.ones_like(y)], [x], module.parameters())
    in_i = dict(calls)
    calls.clear()
    stage_backward_weight(module.parameters(), groups)
    return in_i, dict(calls)


class Scaled(nn.Module):
    """A weight before the gathered linear, whose gradient W computes too."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.scale, self.linear = nn.Parameter(torch.full((6,), 1.5)), linear

    def forward(self, x):
        return self.linear(x * self.scale)


@pytest.mark.parametrize("before", [None, "op", "weight"])
def test_a_split_backward_of_the_gathered_linear_gathers_once_in_i_and_not_in_w(calls, before):
    """Under sequence parallelism the input gradient (I) gathers the input and reduce-scatters; the
    weight gradient (W) takes the gathered input I kept and calls no collective, also where a weight
    comes before the linear (torch's W starts that weight's gradient from what I gave it); the
    gradients are the one-pass backward's, bit for bit."""
    torch.manual_seed(0)
    tp = TensorGroup(2, RANK, sequence_parallel=True)
    dense = nn.Linear(6, 8)
    x = torch.randn(2, 4, 6)
    wrap = {None: lambda m: m, "op": lambda m: nn.Sequential(nn.Tanh(), m), "weight": Scaled}[before]
    split, fused = wrap(ColumnParallelLinear(dense, tp)), wrap(ColumnParallelLinear(dense, tp))
    xs, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    in_i, in_w = _split_backward(split, xs, calls)
    assert in_i == {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1}
    assert in_w == {}
    fused(xf).backward(torch.ones(2, 8, 4))  # the sequence gathered, this rank's 4 of 8 features
    assert torch.equal(xs.grad, xf.grad)
    for (name, a), b in zip(split.named_parameters(), fused.parameters()):
        assert torch.equal(a.grad, b.grad), name
