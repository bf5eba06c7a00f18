# Tests of tensor and sequence parallelism in the runtime (schedc/runtime/model/tensor_parallel.py, --tp,
# --sequence-parallel, --no-scatter-gather): the layers against dense torch in one process, the weight
# declarations and the rank order, the options refused before torchrun, then a few torchrun launches
# (many plans each) whose three steps' losses and gathered first-step gradients must equal the
# one-process reference's, and whose pipeline messages must be 1/t of the whole with scatter/gather.
from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from schedc.layout import rank_at
from schedc.runtime.__main__ import main as runtime_main
from schedc.runtime.model.gpt import Block, Embed, Head, ModelConfig, ModelError, parallel_run
from schedc.runtime.model.tensor_parallel import (
    PARTIAL, ColumnParallelLinear, Messages, RowParallelLinear, Split, TensorGroup, VocabParallelEmbedding, cut,
    join, parameter_splits, vocab_parallel_loss)
from schedc.runtime.process.world import World
from test_runtime import launch_plans, plans  # noqa: F401 (plans: the session's compiled plans)

MODEL = ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq", "16", "--mb-size", "2"]
STEPS = 3
TOLERANCE = 1e-5
MESSAGE_BYTES = 2 * 16 * 32 * 4  # one boundary tensor of MODEL: mb-size x seq x hidden fp32 values


# -- the layers, in one process ------------------------------------------------------------------------

@pytest.fixture
def world_of_one():
    """A gloo process group of one rank: every collective returns its input, so a layer given
    TensorGroup(2, r) computes tensor rank r's part alone, and the parts can be summed here."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_cut_and_join_are_inverse_and_qkv_blocks_keep_each_ranks_heads():
    full = torch.arange(12 * 4.0).view(12, 4)
    for split in (Split(0), Split(1), Split(0, blocks=3)):
        for t in (1, 2, 4):
            shards = [cut(full, split, TensorGroup(t, r)) for r in range(t)]
            assert torch.equal(join(shards, split), full)
    # qkv as three blocks of 4 rows (q, k, v); rank 1 of 2 holds rows 2-3 of each
    assert cut(full, Split(0, blocks=3), TensorGroup(2, 1))[:, 0].tolist() == [8, 12, 24, 28, 40, 44]


def test_column_and_row_parallel_parts_sum_to_the_dense_layer(world_of_one):
    torch.manual_seed(0)
    dense, x = nn.Linear(6, 8), torch.randn(3, 5, 6, requires_grad=True)
    want = dense(x)
    want.sum().backward()
    outs, grads = [], []
    for r in range(2):
        layer = ColumnParallelLinear(dense, TensorGroup(2, r, world_of_one))
        xr = x.detach().requires_grad_()
        out = layer(xr)
        out.sum().backward()
        outs.append(out)
        grads.append(xr.grad)
        assert torch.allclose(layer.weight.grad, cut(dense.weight.grad, Split(0), TensorGroup(2, r)))
    assert torch.allclose(torch.cat(outs, dim=-1), want, atol=1e-6)
    assert torch.allclose(sum(grads), x.grad, atol=1e-6)  # f's all-reduce, summed here
    rows = [RowParallelLinear(dense, TensorGroup(2, r, world_of_one)) for r in range(2)]
    parts = [row(x.detach()[..., r * 3:(r + 1) * 3]) - row.bias for r, row in enumerate(rows)]
    assert torch.allclose(sum(parts) + dense.bias, want, atol=1e-6)  # g's all-reduce, summed here


def test_vocab_parallel_embedding_parts_sum_to_the_dense_lookup(world_of_one):
    torch.manual_seed(0)
    dense, ids = nn.Embedding(10, 4), torch.randint(0, 10, (2, 7))
    parts = [VocabParallelEmbedding(dense, TensorGroup(2, r, world_of_one))(ids) for r in range(2)]
    assert torch.equal(sum(parts), dense(ids))


def test_vocab_parallel_cross_entropy_equals_torchs(world_of_one):
    torch.manual_seed(0)
    logits, targets = (3 * torch.randn(2, 5, 11)).requires_grad_(), torch.randint(0, 11, (2, 5))
    loss = vocab_parallel_loss(TensorGroup(1, 0, world_of_one))(logits, targets)
    loss.backward()
    dense = logits.detach().requires_grad_()
    want = F.cross_entropy(dense.flatten(0, 1), targets.flatten())
    want.backward()
    assert torch.allclose(loss, want) and torch.allclose(logits.grad, dense.grad, atol=1e-7)


def test_the_gpt_pieces_declare_their_splits_under_the_unpartitioned_names():
    cfg = ModelConfig(layers=1, hidden=8, heads=2, seq=4, vocab=16)
    for sp in (False, True):
        rest = PARTIAL if sp else None
        tp = TensorGroup(2, 0, None, sp)
        for full, splits in ((Embed(cfg), {"tok.weight": Split(0)}),
                             (Block(cfg), {"qkv.weight": Split(0, 3), "qkv.bias": Split(0, 3), "proj.weight": Split(1),
                                           "fc.weight": Split(0), "fc.bias": Split(0), "out.weight": Split(1)}),
                             (Head(cfg), {"lm.weight": Split(0)})):
            names = [name for name, _ in full.named_parameters()]
            got = parameter_splits(full.tensor_parallel(tp))
            assert list(got) == names
            assert got == {name: splits.get(name, rest) for name in names}


def test_a_piece_without_a_parallel_form_is_replicated_and_refused_under_sequence_parallelism():
    run = [("embed", nn.Embedding(16, 8)), ("out", nn.Linear(8, 16))]
    assert parallel_run(run, TensorGroup(2, 0)) == run
    with pytest.raises(ModelError, match="--sequence-parallel: the model's pieces 'embed', 'out' have no tensor_parallel"):
        parallel_run(run, TensorGroup(2, 0, None, True))


def test_a_piece_whose_weights_t_does_not_divide_is_refused_naming_it():
    with pytest.raises(ModelError, match=r"--tp 8: the model's piece 'mlp0' cannot be cut: a weight of shape "
                                         r"\(60, 15\) has 60 along dim 0, not a multiple of 8"):
        parallel_run([("mlp0", UserMLP(15))], TensorGroup(8, 0))


def test_messages_cut_boundary_tensors_into_slices_for_the_same_tensor_rank():
    shape, x = torch.Size([2, 4, 6]), torch.arange(48.0).view(2, 4, 6)
    scattered = Messages(TensorGroup(2, 1), scatter=True)
    assert scattered.wire_shape(shape) == torch.Size([24]) and torch.equal(scattered.outgoing(x), torch.arange(24.0, 48))
    whole = Messages(TensorGroup(2, 1), scatter=False)
    assert whole.wire_shape(shape) == shape and torch.equal(whole.outgoing(x), x)
    shard = Messages(TensorGroup(2, 1, None, True))  # already [b, s/t, h]: sent as it is
    assert shard.wire_shape(shape) == torch.Size([2, 2, 6]) and torch.equal(shard.outgoing(x[:, 2:]), x[:, 2:])
    assert Messages(TensorGroup()).wire_shape(shape) == shape
    odd = torch.Size([1, 3, 5])  # a user model's boundary that t does not divide goes whole
    assert Messages(TensorGroup(2, 0)).wire_shape(odd) == odd


@pytest.mark.parametrize("tp,dp", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_world_ranks_follow_the_layout_order(tp, dp):
    devices = 2
    for rank in range(devices * dp * tp):
        world = World(rank, devices * dp * tp, devices, dp, torch.device("cpu"), tp=tp)
        assert rank == rank_at(world.plan_rank, world.replica, world.tensor, tp, dp)
        assert [world.global_rank(p) for p in range(devices)] == [
            rank_at(p, world.replica, world.tensor, tp, dp) for p in range(devices)]
        assert world.dp_ranks() == [rank_at(world.plan_rank, d, world.tensor, tp, dp) for d in range(dp)]
    assert World(3, 4, 2, 2, torch.device("cpu")).plan_rank == 1  # t = 1: rank = plan rank x dp + replica


# -- options refused before torchrun -------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--tp", "0"], "--tp must be >= 1, got 0"),
    (["--tp", "3"], "--tp 3 does not divide the model's heads 4"),
    (["--tp", "8", "--heads", "8"], "--tp 8 does not divide the model's vocabulary 260"),
    (["--sequence-parallel"], "--sequence-parallel needs --tp 2 or more"),
    (["--tp", "2", "--sequence-parallel", "--seq", "15"],
     "--sequence-parallel: --tp 2 does not divide the sequence length 15"),
    (["--tp", "2", "--nproc", "2"], "with --tp 2 and --dp 1 (t x p x d) it needs 4 processes, not --nproc 2"),
    (["--tp", "2", "--fault-kill", "4:0"], "the run has ranks 0 to 3 (the plan's devices x --dp 1 x --tp 2)"),
    (["--tp", "2", "--dp", "65"], "260 processes on this machine (the plan's 2 devices x --dp 65 x --tp 2)"),
])
def test_schedc_run_refuses_a_tensor_layout_that_does_not_fit(plans, args, message):  # noqa: F811
    from click.testing import CliRunner
    from schedc.cli import main
    vocab = ["--vocab", "260"] if "--vocab" not in args else []
    result = CliRunner().invoke(main, ["run", str(plans("1f1b", p=2, m=4)), *vocab, *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_a_world_without_room_for_the_tensor_ranks_is_refused_by_the_ranks(plans, capsys):  # noqa: F811
    assert runtime_main([str(plans("1f1b", p=2, m=4)), *MODEL, "--tp", "2"]) == 1
    assert ("with --tp 2 and --dp 1 (t x p x d) it needs 4 processes, but 1 were started"
            in capsys.readouterr().err)


# -- under torchrun, against the one-process reference ---------------------------------------------------

SCHEDULES = {"1f1b": ("1f1b", {"p": 2, "m": 4}), "zb_h1": ("zb_h1", {"p": 2, "m": 3}),
             "interleaved_1f1b": ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4}),
             "one_stage": ("1f1b", {"p": 1, "m": 4})}


@pytest.fixture(scope="session")
def reference3(tmp_path_factory):
    """reference3(plan, model, dp) -> (the 3 steps' losses, first-step grads) of the one-process run."""
    root, cache = tmp_path_factory.mktemp("reference3"), {}

    def run(plan: Path, model: list[str], dp: int = 1):
        from schedc.plan import load_plan
        key = (load_plan(plan).meta["microbatches"] * dp, tuple(model))
        if key not in cache:
            out = root / f"ref{len(cache)}"
            assert runtime_main([str(plan), "--reference", *model, "--dp", str(dp), "--steps", str(STEPS), "--quiet",
                                 "--save-grads", str(out), "--metrics-out", str(out / "metrics.jsonl")]) == 0
            cache[key] = _result(out)
        return cache[key]
    return run


def _result(directory: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
    losses = [json.loads(line)["loss"] for line in (directory / "metrics.jsonl").read_text().splitlines()]
    return losses, torch.load(directory / "grads.pt")


def _sent(directory: Path) -> list[int]:
    return json.loads((directory / "sent.json").read_text())["bytes_sent"]


def worst_error(got: tuple, want: tuple) -> float:
    """The largest relative error over the losses and every gradient (names must match)."""
    (losses, grads), (ref_losses, ref_grads) = got, want
    assert len(losses) == len(ref_losses) == STEPS and sorted(grads) == sorted(ref_grads)
    errors = [abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)]
    errors += [((grads[k] - ref).norm() / ref.norm().clamp_min(1e-12)).item() for k, ref in ref_grads.items()]
    return max(errors)


def run_cases(plans, reference3, tmp_path, nproc: int, dp: int, cases: dict[str, tuple]):  # noqa: F811
    """Run every case (name: SCHEDULES key, options) in one launch of `nproc` ranks; each must equal the
    reference within TOLERANCE. Returns the bytes each rank sent, by case."""
    jobs = []
    for name, (schedule, options) in cases.items():
        out = tmp_path / name
        library, params = SCHEDULES[schedule]
        jobs.append((plans(library, **params),
                     [*options, "--dp", str(dp), "--steps", str(STEPS), "--quiet", "--save-grads", str(out),
                      "--metrics-out", str(out / "metrics.jsonl")]))
    run = launch_plans(jobs, nproc, tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    for (name, (schedule, options)), (plan, _) in zip(cases.items(), jobs):
        error = worst_error(_result(tmp_path / name), reference3(plan, _model_options(options), dp))
        assert error <= TOLERANCE, f"{name}: relative error {error:.2e}"
        print(f"{name}: largest relative error {error:.2e}, bytes sent {_sent(tmp_path / name)}")
    return {name: _sent(tmp_path / name) for name in cases}


TP_FLAGS = ("--sequence-parallel", "--no-scatter-gather", "--distributed-optimizer")


def _model_options(options: list[str]) -> list[str]:
    """The options that shape the model and its data (what the reference takes)."""
    kept, skip = [], False
    for option in options:
        if skip:
            skip = False
        elif option == "--tp":
            skip = True
        elif option not in TP_FLAGS:
            kept.append(option)
    return kept


@pytest.mark.slow
def test_tensor_parallel_runs_match_the_reference(plans, reference3, tmp_path):  # noqa: F811
    """t = 2, p = 2: three schedules, scatter/gather on and off, sequence parallelism, and a user model
    whose MLP pieces give their own parallel form (its embedding and output replicated); each rank's
    message is half a boundary tensor with scatter/gather or sequence parallelism, all of it without."""
    tp = [*MODEL, "--tp", "2"]
    user = ["--model-code", "test_tensor_parallel:build_user", "--layers", "2", "--seq", "8", "--mb-size", "2",
            "--synthetic", "--tp", "2"]
    cases = {"1f1b": ("1f1b", tp), "1f1b_whole": ("1f1b", [*tp, "--no-scatter-gather"]),
             "1f1b_sp": ("1f1b", [*tp, "--sequence-parallel"]),
             "zb_h1": ("zb_h1", tp), "zb_h1_sp": ("zb_h1", [*tp, "--sequence-parallel"]),
             "zb_h1_whole": ("zb_h1", [*tp, "--no-scatter-gather"]),
             "interleaved": ("interleaved_1f1b", tp),
             "interleaved_sp": ("interleaved_1f1b", [*tp, "--sequence-parallel", "--no-scatter-gather"]),
             "user": ("1f1b", user)}
    sent = run_cases(plans, reference3, tmp_path, 4, 1, cases)
    m = SCHEDULES["1f1b"][1]["m"]  # stage 0's ranks send m activations, stage 1's m gradients
    assert sent["1f1b"] == sent["1f1b_sp"] == [m * MESSAGE_BYTES // 2] * 4
    assert sent["1f1b_whole"] == [m * MESSAGE_BYTES] * 4


@pytest.mark.slow
def test_data_parallel_ranks_in_the_layout_order_match_the_reference(plans, reference3, tmp_path):  # noqa: F811
    """t = 1, d = 2 (rank = plan rank x 2 + replica), with and without the distributed optimizer."""
    cases = {"1f1b_zero": ("1f1b", [*MODEL, "--distributed-optimizer"]), "zb_h1": ("zb_h1", MODEL),
             "interleaved_zero": ("interleaved_1f1b", [*MODEL, "--distributed-optimizer"])}
    sent = run_cases(plans, reference3, tmp_path, 4, 2, cases)
    assert sent["1f1b_zero"] == [SCHEDULES["1f1b"][1]["m"] * MESSAGE_BYTES] * 4


@pytest.mark.slow
def test_tensor_and_data_parallel_together_match_the_reference(plans, reference3, tmp_path):  # noqa: F811
    """t = 2, d = 2 on one stage (four ranks: the tensor groups, each tensor rank's data-parallel group
    and the distributed optimizer over it, without pipeline messages; p = 2 as well is the slow test)."""
    tp = [*MODEL, "--tp", "2", "--distributed-optimizer"]
    run_cases(plans, reference3, tmp_path, 4, 2, {"zero": ("one_stage", tp),
                                                   "zero_sp": ("one_stage", [*tp, "--sequence-parallel"])})


@pytest.mark.slow
def test_a_tensor_parallel_run_resumes_from_its_checkpoint_with_the_references_losses(
        plans, reference3, tmp_path):  # noqa: F811
    """Two steps of t = 2 with sequence parallelism saved (each rank its shards), then resumed for the
    third in the same launch: the reference's third loss; a checkpoint of t = 2 is refused with t = 1."""
    plan = plans("1f1b", p=2, m=4)
    common = [*MODEL, "--tp", "2", "--sequence-parallel", "--quiet"]
    jobs = [(plan, [*common, "--steps", "2", "--save", str(tmp_path / "ckpt")]),
            (plan, [*common, "--steps", str(STEPS), "--resume", str(tmp_path / "ckpt"),
                    "--metrics-out", str(tmp_path / "resumed.jsonl")])]
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    (loss,) = [json.loads(line)["loss"] for line in (tmp_path / "resumed.jsonl").read_text().splitlines()]
    want = reference3(plan, MODEL)[0][2]
    assert abs(loss - want) <= TOLERANCE * abs(want)
    from click.testing import CliRunner
    from schedc.cli import main
    result = CliRunner().invoke(main, ["run", str(plan), *MODEL, "--steps", "4", "--resume", str(tmp_path / "ckpt")])
    assert result.exit_code == 2 and "made with world 4, this run has world 2" in result.output, result.output


@pytest.mark.slow
def test_tensor_data_and_pipeline_parallel_on_eight_ranks(plans, reference3, tmp_path):  # noqa: F811
    """t = 2, p = 2, d = 2: eight ranks, the distributed optimizer over each tensor rank's replicas."""
    tp = [*MODEL, "--tp", "2", "--distributed-optimizer"]
    cases = {"1f1b_sp": ("1f1b", [*tp, "--sequence-parallel"]), "zb_h1": ("zb_h1", tp),
             "interleaved_whole": ("interleaved_1f1b", [*tp, "--no-scatter-gather"])}
    sent = run_cases(plans, reference3, tmp_path, 8, 2, cases)
    assert sent["1f1b_sp"] == [SCHEDULES["1f1b"][1]["m"] * MESSAGE_BYTES // 2] * 8


# -- a user model that gives its pieces' parallel forms ----------------------------------------------

class UserMLP(nn.Module):
    """x + W2 tanh(W1 x): W1 column-parallel, W2 row-parallel in its tensor-parallel form."""

    def __init__(self, width: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))

    def tensor_parallel(self, tp: TensorGroup) -> nn.Module:
        return ParallelUserMLP(self, tp)


class ParallelUserMLP(nn.Module):
    def __init__(self, full: UserMLP, tp: TensorGroup):
        super().__init__()
        self.fc1, self.fc2 = ColumnParallelLinear(full.fc1, tp), RowParallelLinear(full.fc2, tp)

    forward = UserMLP.forward


def build_user(cfg: ModelConfig) -> list[tuple[str, nn.Module]]:
    width = 16
    blocks = [(f"mlp{i}", UserMLP(width)) for i in range(cfg.layers)]
    return [("embed", nn.Embedding(cfg.vocab, width)), *blocks, ("out", nn.Linear(width, cfg.vocab))]
