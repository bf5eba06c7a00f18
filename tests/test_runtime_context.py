# Tests of context parallelism's pieces (schedc/runtime/execution/context.py), in one process: the load-balanced
# chunk assignment, the positions each rank holds, and causal attention from each simulated rank's
# queries over the gathered keys and values against full attention of the whole sequence (outputs and
# the gradients of queries, keys and values); the all-gather's backward over two gloo ranks.
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from schedc.runtime.execution.context import GatherSequence, chunk_ranges, exchange, positions, take
from schedc.runtime.model.gpt import attention_core
from test_runtime import plans  # noqa: F401 (fixture)


@pytest.mark.parametrize("seq,cp", [(8, 1), (8, 2), (12, 3), (16, 4)])
def test_every_position_is_held_once_and_the_causal_work_is_balanced(seq, cp):
    """Rank i holds chunks i and 2cp-1-i; together the ranks hold each position once; under the causal
    mask each rank's queries see the same number of keys (chunk i sees i+1 chunks' worth, 2cp-1-i sees
    2cp-i: 2cp+1 chunks' worth each, as Megatron-Core's balance gives)."""
    held = [positions(seq, cp, r).tolist() for r in range(cp)]
    assert sorted(p for ranks in held for p in ranks) == list(range(seq))
    size = seq // (2 * cp)
    for r in range(cp):
        low, high = chunk_ranges(seq, cp, r)
        assert (low.start, high.start) == (r * size, (2 * cp - 1 - r) * size)
    work = [sum(p + 1 for p in ranks) for ranks in held]
    assert len(set(work)) == 1


def test_take_is_the_positions_of_the_tensor():
    x = torch.arange(2 * 12).view(2, 12)
    assert take(x, 3, 1).tolist() == [[2, 3, 8, 9], [14, 15, 20, 21]]
    assert take(x, 3, 1)[0].tolist() == positions(12, 3, 1).tolist()


def _simulated_gather(locals_by_name: dict[str, list[torch.Tensor]]):
    """A gather for a single process: a rank's local tensor is looked up and every rank's joined along
    the sequence, in rank order (what the all-gather gives each rank)."""
    index = {id(t): name for name, parts in locals_by_name.items() for t in parts}

    def gather(x: torch.Tensor) -> torch.Tensor:
        name = index.get(id(x))
        if name is None:  # the positions, viewed [1, 1, t, 1]
            return torch.cat([p.view(1, 1, -1, 1).float() for p in locals_by_name["positions"]], dim=2)
        return torch.cat(locals_by_name[name], dim=2)
    return gather


@pytest.mark.parametrize("cp", [1, 2, 3])
def test_context_attention_is_full_causal_attention(cp):
    """Whole-sequence causal attention of random q, k, v (b 2, 2 heads, sequence 12, width 4) against the
    cp ranks' outputs each at its own positions: equal, and so are the gradients of q, k and v (the
    loss a weighted sum of the outputs)."""
    torch.manual_seed(0)
    shape, seq = (2, 2, 12, 4), 12
    q, k, v = (torch.randn(shape, dtype=torch.float64, requires_grad=True) for _ in range(3))
    weight = torch.randn(shape, dtype=torch.float64)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = torch.autograd.grad((full * weight).sum(), (q, k, v))

    ks, vs = [take(k, cp, r, dim=2) for r in range(cp)], [take(v, cp, r, dim=2) for r in range(cp)]
    mine = [positions(seq, cp, r) for r in range(cp)]
    gather = _simulated_gather({"k": ks, "v": vs, "positions": mine})
    out = torch.zeros(shape, dtype=torch.float64)
    loss = 0
    for r in range(cp):
        y = attention_core(take(q, cp, r, dim=2), *exchange(ks[r], vs[r], mine[r], gather))
        out[:, :, mine[r]] = y.detach()
        loss = loss + (y * take(weight, cp, r, dim=2)).sum()
    assert torch.allclose(out, full.detach(), rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(loss, (q, k, v))
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-12, atol=1e-12)


def _gather_worker(rank: int, path: str) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    x = torch.full((1, 1, 2, 1), float(rank + 1), requires_grad=True)
    y = GatherSequence.apply(x, None, 2)
    assert y.view(-1).tolist() == [1.0, 1.0, 2.0, 2.0]
    (y * torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 4, 1) * (rank + 1)).sum().backward()
    # rank 0's x sits at positions 0, 1 of both ranks' gathers, weighted 1, 2 there by rank 0 and 2, 4 by
    # rank 1: summed 3, 6; rank 1's at positions 2, 3: 9, 12
    want = [[3.0, 6.0], [9.0, 12.0]][rank]
    assert x.grad.view(-1).tolist() == want
    dist.destroy_process_group()


@pytest.mark.slow
def test_the_gather_backward_sums_every_ranks_gradient(tmp_path):
    """Two gloo ranks: the all-gather joins along the sequence in rank order, and the gradient of each
    rank's part is the sum over both ranks' uses of it (a reduce-scatter)."""
    import torch.multiprocessing as mp
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_gather_worker, args=(str(tmp_path / "store"),), nprocs=2, join=True)


MODEL = ["--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]
# name: (schedule, params, options); the reference takes the options but the layout's
CASES = {
    "cp_1f1b": ("1f1b", {"p": 2, "m": 4}, ["--cp", "2"]),
    "cp_zb_h1": ("zb_h1", {"p": 2, "m": 4}, ["--cp", "2"]),
    "cp_zb_h1_full": ("zb_h1", {"p": 2, "m": 4}, ["--cp", "2", "--recompute", "full"]),
    "cp_dualpipev_selective": ("dualpipev", {"p": 2, "m": 4}, ["--cp", "2", "--recompute", "selective"]),
    "cp_interleaved_clip": ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4}, ["--cp", "2", "--clip-grad", "0.05"]),
    "cp_tp_sp": ("gpipe", {"p": 1, "m": 2}, ["--cp", "2", "--tp", "2", "--sequence-parallel", "--recompute",
                                              "selective"]),
}
WIDE = {  # eight ranks
    "cp_tp_sp_1f1b": ("1f1b", {"p": 2, "m": 4}, ["--cp", "2", "--tp", "2", "--sequence-parallel"]),
    "cp_dp_zb_h1": ("zb_h1", {"p": 2, "m": 4}, ["--cp", "2", "--dp", "2"]),
    "zero3_tp_interleaved": ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4}, ["--zero", "3", "--tp", "2", "--dp", "2"]),
}
SHARDED = {  # four ranks: ZeRO's shards over d x cp
    "cp_dp_zero1": ("1f1b", {"p": 1, "m": 4}, ["--cp", "2", "--dp", "2", "--zero", "1"]),
    "cp_dp_zero2": ("1f1b", {"p": 1, "m": 4}, ["--cp", "2", "--dp", "2", "--zero", "2"]),
    "cp_dp_zero3": ("1f1b", {"p": 1, "m": 4}, ["--cp", "2", "--dp", "2", "--zero", "3"]),
    "cp_dp_zero3_kept": ("1f1b", {"p": 1, "m": 4}, ["--cp", "2", "--dp", "2", "--zero", "3",
                                                     "--no-reshard-after-forward"]),
    "cp_zero3_zb_h1": ("zb_h1", {"p": 2, "m": 4}, ["--cp", "2", "--zero", "3"]),
}
LAYOUT = {"--cp": 1, "--tp": 1, "--sequence-parallel": 0, "--recompute": 1, "--zero": 1,
          "--no-reshard-after-forward": 0}  # option: values it takes


def _reference_options(options: list[str]) -> list[str]:
    out, skip = [], 0
    for option in options:
        if skip:
            skip -= 1
        elif option in LAYOUT:
            skip = LAYOUT[option]
        else:
            out.append(option)
    return out


def _run_against_reference(plans, tmp_path, cases: dict, nproc: int) -> None:  # noqa: F811
    from test_runtime import _dump, launch_plans
    from test_runtime_training import TOLERANCE, _errors, _losses, _reference
    jobs = [(plans(schedule, **params), [*MODEL, *options, "--steps", "3", "--quiet", "--save-grads", str(tmp_path / name),
                                         "--metrics-out", str(tmp_path / name / "metrics.jsonl")])
            for name, (schedule, params, options) in cases.items()]
    run = launch_plans(jobs, nproc, tmp_path)
    assert run.returncode == 0, run.stderr
    for name, (schedule, params, options) in cases.items():
        reference = _reference_options(options)
        dp = int(reference[reference.index("--dp") + 1]) if "--dp" in reference else 1
        reference = [o for o in reference if o not in ("--dp", str(dp))] if dp > 1 else reference
        want, want_losses = _reference(tmp_path, name, plans(schedule, **params), [*MODEL, *reference, "--steps", "3"], dp)
        loss, grads = _errors(_dump(tmp_path / name), want)
        assert loss <= TOLERANCE and grads <= TOLERANCE, (name, loss, grads)
        assert _losses(tmp_path / name / "metrics.jsonl") == pytest.approx(want_losses, rel=TOLERANCE), name


@pytest.mark.slow
def test_context_parallel_runs_give_the_reference(plans, tmp_path):  # noqa: F811
    """One 4-rank launch, three AdamW steps each: cp = 2 under 1F1B and ZB-H1 (split I/W) at p = 2, with
    full recomputation, DualPipeV's pairs with selective recomputation, interleaved 1F1B with clipping
    (the norm counted on one context rank), and cp = 2 with t = 2 and sequence parallelism: the first
    step's gradients and the three losses are the one-process reference's, rel <= 1e-5."""
    _run_against_reference(plans, tmp_path, CASES, 4)


@pytest.mark.slow
def test_eight_rank_combinations(plans, tmp_path):  # noqa: F811
    """One 8-rank launch: cp = 2, t = 2 with sequence parallelism under 1F1B at p = 2; cp = 2, d = 2
    under ZB-H1 at p = 2 (gradients averaged over data x context); ZeRO-3 with t = 2, d = 2 under
    interleaved 1F1B at p = 2 (each tensor rank's shards gathered over its data-parallel pair)."""
    _run_against_reference(plans, tmp_path, WIDE, 8)


@pytest.mark.slow
def test_context_parallel_runs_with_zero_give_the_reference(plans, tmp_path):  # noqa: F811
    """One 4-rank launch, three AdamW steps each: cp = 2, d = 2 at p = 1 under ZeRO 1, 2 and 3 (resharding
    after each op, and not), the weights, gradients and optimizer state sharded over the four data x
    context ranks; and cp = 2 alone under ZB-H1 at p = 2 with ZeRO 3 (sharded over the two context
    ranks): the first step's gradients (gathered from the shards) and the three losses are the
    one-process reference's, rel <= 1e-5."""
    _run_against_reference(plans, tmp_path, SHARDED, 4)


def test_the_shards_are_over_data_and_context_ranks():
    """--zero 3 with --cp 2 and --dp 1 is accepted (two context ranks to shard over); with neither it is not."""
    from schedc.runtime.process.options import OptionError, parse_options
    opts = parse_options(["plan.json", *MODEL, "--cp", "2", "--zero", "3"])
    assert (opts.zero, opts.cp, opts.dp) == (3, 2, 1)
    with pytest.raises(OptionError, match="give --dp 2 or more \\(or --cp 2 or more"):
        parse_options(["plan.json", *MODEL, "--zero", "2"])


def test_a_chunked_plan_with_context_parallelism_is_refused_with_its_reason():
    from schedc.driver import compile_file
    from schedc.plan import PlanError
    from schedc.runtime.execution.chunks import check_chunks
    from schedc.runtime.process.options import parse_options
    plan = compile_file("seq1f1b", ["p=2", "m=4", "k=2"]).plan
    with pytest.raises(PlanError, match="chunks i and 2cp-1-i of it, so a chunk's attention would need"):
        check_chunks(plan, parse_options(["plan.json", *MODEL, "--cp", "2"]))


@pytest.mark.parametrize("options,message", [
    (["--cp", "3"], "--cp 3 cuts the sequence into 6 equal chunks; the sequence length 16 (--seq) does not divide"),
    (["--cp", "4", "--seq", "24", "--heads", "4", "--tp", "4", "--sequence-parallel"],
     "--tp 4 does not divide each context rank's 6 tokens"),
    (["--cp", "2", "--tasks", "kfac"], "--cp 2 does not compose with --tasks yet (K-FAC's factors are taken"),
    (["--cp", "0"], "--cp must be >= 1"),
])
def test_context_options_that_do_not_fit_are_refused(options, message):
    from schedc.runtime.process.options import OptionError, parse_options
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_options(["plan.json", *MODEL, *options])
