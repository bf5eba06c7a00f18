"""costmodel/state_terms: a device's training state by term (weights, gathered stage, gradients, optimizer
state) held to hand arithmetic for the runtime's fp32 GPT at every ZeRO level, and to bytes.held_bytes'
sum for 16-bit models over library schedules and layouts."""
from __future__ import annotations

import pytest

from schedc.costmodel.bytes import held_bytes
from schedc.costmodel.specs import ModelSpec
from schedc.costmodel.state_terms import TERMS, padded, state_terms
from schedc.driver import compile_file
from schedc.layout import Layout

H, V, S = 32, 256, 16
BLOCK = 12 * H * H + 13 * H   # qkv, proj, fc, out (weights and biases) and two layer norms
FIRST = (V + S) * H + 2 * BLOCK  # token and position tables, two blocks
LAST = 2 * BLOCK + 2 * H + V * H  # two blocks, the final norm, the untied output projection
RUNTIME_GPT = ModelSpec(4, H, 2, S, V, 4 * H, dtype="fp32", tied_embeddings=False)


def _hand(p: int, level: int, reshard: bool, d: int = 2) -> dict:
    """One stage of p fp32 parameters on its device at ZeRO `level`, sharded d ways (p even): 4-byte
    weights and gradients, AdamW's 8 bytes of moments; an fp32 shard the optimizer steps is a copy
    (4 bytes more) at levels 1 and 2; the stage in use whole at 2 and 3 (its gradients; at 3 its
    weights too, resharding or not: one stage a device)."""
    shard = p // d
    return {0: {"weights": 4 * p, "gathered": 0, "gradients": 4 * p, "optimizer_state": 8 * p},
            1: {"weights": 4 * p, "gathered": 0, "gradients": 4 * p, "optimizer_state": 12 * shard},
            2: {"weights": 4 * p, "gathered": 0, "gradients": 4 * shard + 4 * p, "optimizer_state": 12 * shard},
            3: {"weights": 4 * shard, "gathered": 4 * p, "gradients": 4 * shard + 4 * p,
                "optimizer_state": 8 * shard}}[level]


@pytest.mark.parametrize("level, reshard", [(0, False), (1, False), (2, False), (3, True), (3, False)])
def test_the_runtime_gpt_in_fp32_is_the_hand_count(level, reshard):
    schedule = compile_file("1f1b", ["p=2", "m=4"]).schedule
    got = state_terms(RUNTIME_GPT, Layout(dp=2, zero=level, reshard_after_forward=reshard), schedule)
    assert got == [_hand(FIRST, level, reshard), _hand(LAST, level, reshard)]


def test_a_stage_is_padded_to_its_shards():
    """A stage that 3 shards do not divide is padded to a multiple of 3: the flat buffers' padding, predicted."""
    odd = ModelSpec(4, H, 2, S, V + 1, 4 * H, dtype="fp32", tied_embeddings=False)  # V + 1 rows: 32 more each
    assert (FIRST + H) % 3 and padded(7, 4) == 8
    schedule = compile_file("1f1b", ["p=2", "m=4"]).schedule
    (first, _) = state_terms(odd, Layout(dp=3, zero=1), schedule)
    assert first["weights"] == 4 * padded(FIRST + H, 3)


@pytest.mark.parametrize("name, params", [("1f1b", ["p=4", "m=8"]), ("interleaved_1f1b", ["p=2", "v=2", "m=4"]),
                                          ("zbv", ["p=2", "m=4"]), ("gpipe", ["p=1", "m=2"])])
@pytest.mark.parametrize("layout", [Layout(), Layout(dp=4, overlap_grad_reduce=True), Layout(dp=4, zero=1),
                                    Layout(dp=4, zero=2), Layout(dp=4, zero=3),
                                    Layout(dp=4, zero=3, reshard_after_forward=False),
                                    Layout(dp=2, cp=2, zero=3), Layout(tp=2, dp=2, zero=2)])
def test_the_terms_sum_to_the_held_bytes_of_a_16_bit_model(name, params, layout):
    model = ModelSpec(8, 64, 4, 32, 128, 256)  # bf16; every stage's count divides by 4
    schedule = compile_file(name, params).schedule
    sums = [sum(device[t] for t in TERMS) for device in state_terms(model, layout, schedule)]
    assert sums == pytest.approx([state for state, _, _ in held_bytes(model, layout, schedule)], rel=1e-12)


@pytest.mark.parametrize("layout", [[], ["--zero", "1"], ["--zero", "2"], ["--zero", "3", "--cp", "2"]])
def test_simulate_json_gives_the_terms_of_its_largest_device(tmp_path, layout):
    """simulate --cluster --json's state_breakdown: the largest device's terms, summing to its
    weights_gradients_optimizer_gib (both rounded to 1e-6 GiB)."""
    import json
    from click.testing import CliRunner
    from schedc.cli import main
    model = tmp_path / "model.toml"
    model.write_text('layers = 8\nhidden = 64\nheads = 4\nseq = 256\nvocab = 100\nattention = "flash"\n')
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=4", "--model", str(model), "--cluster",
                                       "dgx-h100-80gb", "--dp", "2", *layout, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    terms = out["state_breakdown"]
    assert list(terms) == [t + "_gib" for t in TERMS]
    assert sum(terms.values()) == pytest.approx(out["memory_breakdown"]["weights_gradients_optimizer_gib"], abs=4e-6)
    assert (terms["gathered_gib"] > 0) == ("3" in layout)


@pytest.mark.parametrize("layout", [Layout(dp=4, ep=2, zero=1), Layout(dp=4, ep=2, zero=3),
                                    Layout(tp=2, dp=4, ep=2, etp=1, zero=2)])
def test_a_mixture_of_experts_terms_sum_to_its_held_bytes(layout):
    """The routed experts' state sharded over the expert-data-parallel ranks (bytes.expert_shards), the
    rest over d x cp: the terms still sum to held_bytes'."""
    model = ModelSpec(8, 64, 4, 32, 128, 256, experts=4, top_k=2, moe_ffn=64, first_k_dense=1)
    schedule = compile_file("1f1b", ["p=2", "m=4"]).schedule
    sums = [sum(device[t] for t in TERMS) for device in state_terms(model, layout, schedule)]
    assert sums == pytest.approx([state for state, _, _ in held_bytes(model, layout, schedule)], rel=1e-12)
