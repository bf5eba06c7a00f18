# Tests of the runtime's meta-device construction (runtime/model/init.py): a piece's weights are the same
# whichever other pieces a process holds (the one-process reference builds every piece, a rank only its
# own), a parameter without a reset_parameters keeps its constructor's value, shapes and dtypes are
# traced without any weights, and four ranks of a 1.61 GB GPT each stay below the whole model's bytes.
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from schedc.runtime.model.init import is_materialized, materialize_pieces, module_seed
from schedc.runtime.model import ModelConfig, Stage, boundary_shapes, build_model, build_pieces, partition
from test_runtime import ENV, _repo, plans  # noqa: F401 (fixture)

GPT = ModelConfig(layers=4, hidden=32, heads=2, seq=8, vocab=64, mb_size=2)
LLAMA = ModelConfig(layers=4, hidden=32, heads=4, kv_heads=2, seq=8, vocab=64, mb_size=2, mlp="swiglu",
                    norm="rmsnorm", positions="rope", bias="none")


@pytest.mark.parametrize("cfg", [GPT, LLAMA], ids=["gpt", "llama"])
def test_a_piece_gets_the_same_weights_whichever_pieces_are_held(cfg):
    whole = dict(Stage(build_pieces(build_model, cfg, seed=3)).global_parameters())
    pieces = build_pieces(build_model, cfg, seed=3, materialize=False)
    held = {pieces[2][0], pieces[-1][0]}
    materialize_pieces(pieces, 3, keep=held)
    for name, piece in pieces:
        assert is_materialized(piece) == (name in held)
    part = dict(Stage([(n, p) for n, p in pieces if n in held]).global_parameters())
    assert part and set(part) < set(whole)
    for name, param in part.items():
        assert torch.equal(param, whole[name]), name


def test_each_module_draws_from_its_own_seed():
    one = dict(Stage(build_pieces(build_model, GPT, seed=0)).global_parameters())
    assert not torch.equal(one["blocks.0.fc.weight"], one["blocks.1.fc.weight"])  # not one seed for all
    other = dict(Stage(build_pieces(build_model, GPT, seed=1)).global_parameters())
    assert not torch.equal(one["blocks.0.fc.weight"], other["blocks.0.fc.weight"])
    assert module_seed(0, "blocks.0.fc") != module_seed(0, "blocks.1.fc")
    # nn.Linear's rule under the module's seed, built here by hand
    torch.manual_seed(module_seed(0, "blocks.0.fc"))
    want = nn.Linear(GPT.hidden, GPT.ffn)
    assert torch.equal(one["blocks.0.fc.weight"], want.weight) and torch.equal(one["blocks.0.fc.bias"], want.bias)


class Scaled(nn.Module):
    """A user piece whose parameter has no reset_parameters: kept as constructed."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.gain


def user_model(cfg):
    return [("embed", nn.Embedding(cfg.vocab, 4)), ("scale", Scaled()), ("head", nn.Linear(4, cfg.vocab))]


def test_a_parameter_without_reset_parameters_is_kept_as_built():
    a = build_pieces(user_model, GPT, seed=5, materialize=False)
    b = build_pieces(user_model, GPT, seed=5)
    assert not a[1][1].gain.is_meta and a[0][1].weight.is_meta
    assert torch.equal(a[1][1].gain, b[1][1].gain)


@pytest.mark.parametrize("bf16", [False, True])
def test_boundary_shapes_need_no_weights(bf16):
    held = build_pieces(build_model, GPT, seed=0)
    bare = build_pieces(build_model, GPT, seed=0, materialize=False)
    want = boundary_shapes(held, partition(held, 2), GPT, bf16)
    assert boundary_shapes(bare, partition(bare, 2), GPT, bf16) == want
    assert not any(is_materialized(piece) for _, piece in bare[1:-1])  # traced on copies


@pytest.mark.slow
def test_four_ranks_of_a_large_gpt_each_hold_less_than_the_model(plans, tmp_path):  # noqa: F811
    """1F1B on 4 ranks over a 32-layer, hidden-1024 GPT: 12 h^2 + 13 h parameters a layer (hand
    arithmetic) times 32 is 1.61 GB of fp32; every rank's peak resident memory stays below it."""
    h, layers = 1024, 32
    model_bytes = 4 * layers * (12 * h * h + 13 * h)
    assert 1.60e9 < model_bytes < 1.62e9
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "schedc.runtime.process.launch", "--standalone", "--nproc-per-node", "4", "-m",
               "schedc.runtime", str(plans("1f1b", p=4, m=4)), "--layers", str(layers), "--hidden", str(h),
               "--heads", "16", "--seq", "16", "--mb-size", "1", "--vocab", "256", "--optimizer", "sgd",
               "--steps", "1", "--quiet", "--report-out", str(report), "--timeout", "120"]
    run = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300, cwd=_repo())
    assert run.returncode == 0, run.stdout + run.stderr
    ranks = json.loads(report.read_text())["memory"]["ranks"]
    assert sorted(r["plan_rank"] for r in ranks) == [0, 1, 2, 3]
    assert max(r["peak_rss_bytes"] for r in ranks) < model_bytes
    assert all(r["parameter_bytes"] < model_bytes / 3 for r in ranks)  # a quarter each, give or take the ends


class WithBuffer(nn.Module):
    """reset_parameters covers the weight only; the buffer is the constructor's."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(3))
        self.register_buffer("scale", torch.arange(3.0))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.uniform_(self.weight)


def test_materializing_keeps_a_modules_buffers():
    pieces = build_pieces(lambda cfg: [("a", WithBuffer()), ("b", WithBuffer())], GPT, seed=0, materialize=False)
    assert pieces[0][1].weight.is_meta
    materialize_pieces(pieces, 0, keep={"a"})
    assert torch.equal(pieces[0][1].scale, torch.arange(3.0)) and not pieces[0][1].weight.is_meta
    torch.manual_seed(module_seed(0, "a"))
    assert torch.equal(pieces[0][1].weight, torch.rand(3))  # uniform_ draws as rand does
