# Tests of schedc/runtime/execution/chunks.py, sequence chunks (Seq1F1B) in one process: the GPT run as k chunks
# of its sequence over two stages, forwards in chunk order and backwards in reverse, gives the loss and
# every gradient of the whole sequence run at once; chunks out of that order, and what the runtime does
# not run with chunks, are refused by name. (Their pipelined runs against the one-process reference,
# and their measured activation peak, are in test_runtime.py's grouped launches.)
from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from schedc.plan import Opcode, PlanError, load_plan
from schedc.runtime.execution.chunks import Cache, ChunkError, Running, SequenceChunks
from schedc.runtime.model.data import Batch
from schedc.runtime.model.gpt import ModelConfig, Stage, build_gpt, lm_loss
from schedc.runtime.process.options import parse_options
from schedc.runtime.model.train import check_plan
from schedc.runtime.process.world import Env
from test_runtime import plans  # noqa: F401 (fixture)

CONFIG = ModelConfig(layers=4, hidden=32, heads=2, seq=16, vocab=256, mb_size=2)


def _model(recompute_core: bool = False) -> tuple[Stage, Stage]:
    """The GPT from one seed as two stages: the embedding and two blocks, two blocks and the head."""
    torch.manual_seed(0)
    pieces = build_gpt(CONFIG)
    for _, piece in pieces:
        if hasattr(piece, "recompute_core"):
            piece.recompute_core = recompute_core
    return Stage(pieces[:3]), Stage(pieces[3:])


def _batch() -> Batch:
    gen = torch.Generator().manual_seed(1)
    windows = torch.randint(0, CONFIG.vocab, (CONFIG.mb_size, CONFIG.seq + 1), generator=gen)
    return Batch(windows[:, :-1], windows[:, 1:], CONFIG.mb_size)


def _whole(stages: tuple[Stage, Stage], batch: Batch) -> float:
    """The reference: the whole sequence's mean cross entropy, forward and backward at once."""
    loss = lm_loss(stages[1](stages[0](batch.tokens)), batch.targets)
    loss.backward()
    return loss.item()


def _chunked(stages: tuple[Stage, Stage], batch: Batch, k: int) -> float:
    """k chunks as a pipeline runs them: each chunk's forward on stage 0, its output detached into
    stage 1; then the backwards in reverse chunk order, stage 1's input gradient into stage 0's."""
    chunks, saved, total = SequenceChunks(k), {}, 0.0
    for j in range(k):
        tokens, targets = chunks.data(batch, 0, j)
        with chunks.forward(0, j, tokens.shape[1]):
            y0 = stages[0](tokens)
        x1 = y0.detach().requires_grad_()
        with chunks.forward(1, j, x1.shape[1]):
            loss = lm_loss(stages[1](x1), targets) / k
        total += loss.item()
        saved[j] = (y0, x1, loss)
    for j in reversed(range(k)):
        y0, x1, loss = saved.pop(j)
        torch.autograd.backward(*chunks.backward_roots(1, j, loss, None))
        torch.autograd.backward(*chunks.backward_roots(0, j, y0, x1.grad))
    assert chunks.caches == {}  # every microbatch's cache dropped after its chunk 0's backward
    return total


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("recompute_core", [False, True], ids=["plain", "selective"])
@pytest.mark.parametrize("k", [2, 4])
def test_chunks_give_the_whole_sequences_loss_and_gradients(k, recompute_core):
    """Loss and every parameter's gradient within 1e-6 of the whole sequence's (with the attention
    core recomputed too, as --recompute selective runs it)."""
    batch = _batch()
    whole, chunked = _model(), _model(recompute_core)
    want = _whole(whole, batch)
    got = _chunked(chunked, batch, k)
    assert abs(got - want) <= 1e-6 * abs(want)
    pairs = [(name, p.grad, dict(w.global_parameters())[name].grad)
             for c, w in zip(chunked, whole) for name, p in c.global_parameters()]
    assert len(pairs) == len(list(whole[0].parameters())) + len(list(whole[1].parameters())) > 0
    for name, grad, ref in pairs:
        assert grad is not None and _relative(grad, ref) <= 1e-6, name


def test_a_later_chunk_sees_the_earlier_ones():
    """The second chunk's output depends on the first chunk's tokens (its keys and values), and its
    positions run on from the first chunk's: not what the same tokens give as a sequence alone."""
    stage, _ = _model()
    tokens = _batch().tokens
    with torch.no_grad():
        whole = stage(tokens)
        chunks = SequenceChunks(2)
        for j in range(2):
            with chunks.forward(0, j, 8):
                part = stage(tokens[:, 8 * j:8 * (j + 1)])
        alone = stage(tokens[:, 8:])
    assert torch.allclose(part, whole[:, 8:], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(alone, whole[:, 8:], rtol=1e-2, atol=1e-2)


def test_chunks_out_of_order_are_refused():
    stage, _ = _model()
    tokens = _batch().tokens
    chunks = SequenceChunks(2)
    with pytest.raises(ChunkError, match="forward of chunk 1 of microbatch 0 on stage 0 runs after 0"):
        with chunks.forward(0, 1, 8):
            stage(tokens[:, 8:])
    chunks = SequenceChunks(2)
    outputs = []
    for j in range(2):
        with chunks.forward(0, j, 8):
            outputs.append(stage(tokens[:, 8 * j:8 * (j + 1)]))
    with pytest.raises(ChunkError, match="backward of chunk 0 of microbatch 0 on stage 0 runs before that "
                                              "of chunk 1, which gives it the gradient of its keys"):
        chunks.backward_roots(0, 0, outputs[0], torch.ones_like(outputs[0]))
    with pytest.raises(ChunkError, match="backward of chunk 1 of microbatch 1 on stage 0 runs before its forward"):
        chunks.backward_roots(0, 3, outputs[1], None)


@pytest.mark.parametrize("options,message", [
    (["--tp", "2"], "--tp (tensor parallelism) is not supported with sequence chunks"),
    (["--recompute", "full"], "--recompute full (full recomputation"),
    (["--model-code", "os:getcwd"], "--model-code (a model of your own"),
    (["--loss", "os:getcwd"], "--loss (a loss of your own"),
    (["--tasks", "schedc.runtime.kfac"], "--tasks (user tasks)"),
    (["--seq", "18"], "--seq 18 is not a multiple of 4"),
])
def test_what_chunks_do_not_run_with_is_refused_by_name(plans, options, message):  # noqa: F811
    path = plans("seq1f1b", p=2, m=2, k=4)
    opts = parse_options([str(path), "--seq", "16", *options])
    with pytest.raises(PlanError, match="the plan runs 4 sequence chunks per microbatch: " + re.escape(message)):
        check_plan(load_plan(path), opts, Env(0, 2 * opts.tp, 0))


def test_a_split_backward_with_chunks_is_refused(plans):  # noqa: F811
    """Every B of a chunked plan split into I and W: refused by name; the plan as compiled runs."""
    path = plans("seq1f1b", p=2, m=2, k=2)
    plan = load_plan(path)
    split = tuple(tuple(tuple(x for i in step for x in ((i._replace(op=Opcode.I.value), i._replace(op=Opcode.W.value))
                                                         if i.op == Opcode.B else (i,)))
                        for step in steps) for steps in plan.ranks)
    opts = parse_options([str(path), "--seq", "16"])
    with pytest.raises(PlanError, match=r"2 sequence chunks per microbatch with split backward \(I, W\): this "
                                        "runtime runs chunks with F and B only"):
        check_plan(replace(plan, ranks=split), opts, Env(0, 2, 0))
    check_plan(plan, opts, Env(0, 2, 0))


def test_schedc_run_refuses_chunks_with_tensor_parallelism_before_torchrun(plans):  # noqa: F811
    from click.testing import CliRunner
    from schedc.cli import main
    plan = plans("seq1f1b", p=2, m=2, k=4)
    result = CliRunner().invoke(main, ["run", str(plan), "--seq", "16", "--tp", "2"])
    assert result.exit_code == 2, result.output
    assert "the plan runs 4 sequence chunks per microbatch: --tp (tensor parallelism) is not supported" in result.output
    assert "Traceback" not in result.output and "torchrun" not in result.output


def test_a_chunked_runs_profile_gives_a_microbatchs_costs():
    """--profile-out of a chunked run: an op's cost per microbatch, the sum of its chunks' (2 chunks of
    1 and 3 ms, and of 2 and 2 ms: 4 ms a microbatch), as a compile's costs declare it (1/k a chunk)."""
    from schedc.runtime.execution.trace import Event, profile
    ms = 1_000_000
    events = [Event(0, 0, "F", 0, unit, start * ms, end * ms, 0)
              for unit, (start, end) in enumerate([(0, 1), (1, 4), (4, 6), (6, 8)])]
    assert profile(events, 1, 2, chunks=2) == {"unit": "ms", "microbatch_size": 2, "F": [4.0]}
    assert profile(events, 1, 2) == {"unit": "ms", "microbatch_size": 2, "F": [2.0]}


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_a_later_chunks_lower_right_causal_bias_equals_the_boolean_mask(chunk, heads, kv_heads):
    """What `extend` gives chunk j of 4 (queries 4 tokens, keys 4 (j + 1)) attends as the boolean mask
    built here does (query a at position 4j + a sees keys 0 .. 4j + a), forward and backward, within
    1e-6; the bias is torch's lower-right causal form, not a mask tensor."""
    from torch.nn.attention.bias import CausalBias, CausalVariant
    length, gen = 4, torch.Generator().manual_seed(2)
    cache = Cache(own=[[] for _ in range(chunk)], leaves=[[] for _ in range(chunk)])
    for j in range(chunk):
        cache.leaves[j].append((torch.randn(2, kv_heads, length, 8, generator=gen),
                                torch.randn(2, kv_heads, length, 8, generator=gen)))
    cache.own.append([])
    cache.leaves.append([])
    k, v = (torch.randn(2, kv_heads, length, 8, generator=gen) for _ in range(2))
    keys, values, bias = Running(cache, chunk, 4, length).extend(k, v)
    assert isinstance(bias, CausalBias) and bias.variant == CausalVariant.LOWER_RIGHT
    mask = torch.tensor([[key <= chunk * length + query for key in range(keys.shape[2])] for query in range(length)])
    q = torch.randn(2, heads, length, 8, generator=gen)
    got_in = [t.clone().requires_grad_() for t in (q, keys, values)]
    want_in = [t.clone().requires_grad_() for t in (q, keys, values)]
    got = F.scaled_dot_product_attention(*got_in, attn_mask=bias, enable_gqa=True)
    want = F.scaled_dot_product_attention(*want_in, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(got, want, atol=1e-6)
    dy = torch.randn(got.shape, generator=gen)
    got.backward(dy)
    want.backward(dy)
    for a, b in zip(got_in, want_in):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
