# Tests of the long-context keys of a config.json in the runtime (schedc/runtime/model/spans.py): Llama
# 3.1's "llama3" rope_scaling against a hand computation of the frequencies, and a sliding window's
# banded mask against attention written out query by query; a window under sequence chunks or --cp
# refused by name before launch. The runs against the one-process reference are in
# tests/test_runtime_tied.py's launches (the tiny Mistral with a window of 6 at seq 16).
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from schedc.runtime.model.decoder import grouped_attention_core, rotary_table
from schedc.runtime.model.gpt import build_pieces, build_model
from schedc.runtime.model.spans import band, llama3_frequencies
from schedc.runtime.process.options import parse_options
from test_runtime import plans  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]
WINDOWED = REPO / "tests/data/hf/tiny-mistral-window/config.json"
TIED_LLAMA = REPO / "tests/data/hf/tiny-llama-tied/config.json"


def test_llama3_scaling_of_the_frequencies_by_hand():
    """head_dim 8, theta 500,000: inverse frequencies 1, 500000^-1/4 = 0.0376060, 500000^-1/2 =
    0.00141421, 500000^-3/4 = 5.31830e-5, wavelengths 2π/f = 6.283, 167.08, 4442.9, 118143. With factor 4,
    low_freq_factor 1, high_freq_factor 4 and 256 original positions: the first is shorter than 256/4 =
    64 (kept); the second between 64 and 256, blended with smooth = (256/167.08 - 1)/(4 - 1) = 0.177403:
    f·((1 - 0.177403)/4 + 0.177403) = 0.0144051; the last two longer than 256, divided by 4."""
    inverse = 1.0 / 500000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    scaled = llama3_frequencies(inverse, (4.0, 1.0, 4.0, 256))
    assert scaled.tolist() == pytest.approx([1.0, 0.0144051, 0.000353553, 1.32957e-05], rel=1e-5)
    cos, sin = rotary_table(3, 8, 500000.0, (4.0, 1.0, 4.0, 256))
    assert cos[2, 1].item() == pytest.approx(math.cos(2 * 0.01440506), rel=1e-6)  # position 2, frequency 1
    assert sin[2, 5].item() == pytest.approx(math.sin(2 * 0.01440506), rel=1e-5)  # the second half repeats


def test_a_tied_llama_config_builds_its_scaled_rotary_table(plans):  # noqa: F811
    cfg = parse_options([str(plans("1f1b", p=2, m=4)), "--model", str(TIED_LLAMA), "--seq", "16"]).model_config
    assert cfg.rope_scaling == (4.0, 1.0, 4.0, 32)
    attention = build_pieces(build_model, cfg, seed=0)[1][1].self_attn
    want = llama3_frequencies(1.0 / 500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16), cfg.rope_scaling)
    assert torch.allclose(attention.cos[5, :8].double(), torch.cos(5 * want), atol=1e-6)
    assert not torch.allclose(want, 1.0 / 500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))


def _by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Attention query by query: query i's softmax over keys max(0, i - window + 1) .. i, each key
    head shared by heads / kv heads query heads."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    for head in range(q.shape[1]):
        for i in range(q.shape[2]):
            keys = range(max(0, i - window + 1), i + 1)
            scores = torch.stack([(q[:, head, i] * k[:, head // group, j]).sum(-1) for j in keys], dim=-1)
            weights = torch.softmax(scores / math.sqrt(q.shape[-1]), dim=-1)
            out[:, head, i] = sum(weights[:, n:n + 1] * v[:, head // group, j] for n, j in enumerate(keys))
    return out


def test_the_banded_mask_is_attention_within_the_window():
    """[2, 4 heads over 2 key/value heads, 10 tokens, 8] at a window of 3: each query's min(3, i + 1)
    keys; the mask's rows count them."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 10, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    got = grouped_attention_core(q, k, v, band(10, 3))
    assert torch.allclose(got, _by_hand(q, k, v, 3), atol=1e-6)
    assert (band(10, 3) == 0).sum(1).tolist() == [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]


def test_a_windowed_config_builds_the_band_once(plans):  # noqa: F811
    cfg = parse_options([str(plans("1f1b", p=2, m=4)), "--model", str(WINDOWED), "--seq", "16"]).model_config
    assert cfg.window == 6
    pieces = build_pieces(build_model, cfg, seed=0)
    masks = [piece.self_attn.band for _, piece in pieces[1:-1]]
    assert all(mask is masks[0] for mask in masks) and (masks[0] == 0).sum().item() == 6 * 7 // 2 + 10 * 6
    unwindowed = parse_options([str(plans("1f1b", p=2, m=4)), "--model", str(WINDOWED), "--seq", "6"]).model_config
    assert not build_pieces(build_model, unwindowed, seed=0)[1][1].self_attn.windowed  # the window covers seq


@pytest.mark.parametrize("schedule,params,option,named", [
    ("seq1f1b", {"p": 2, "m": 4, "k": 2}, [], "sequence chunks (Seq1F1B)"),
    ("1f1b", {"p": 2, "m": 4}, ["--cp", "2"], "--cp 2")])
def test_a_window_split_by_chunks_or_context_ranks_is_refused_before_launch(plans, schedule, params,  # noqa: F811
                                                                             option, named):
    from click.testing import CliRunner
    from schedc.cli import main
    result = CliRunner().invoke(main, ["run", str(plans(schedule, **params)), "--model", str(WINDOWED), "--seq", "16",
                                       *option])
    assert result.exit_code == 2, result.output
    assert f"sliding_window 6 (< seq 16) with {named}" in result.output and "Traceback" not in result.output
