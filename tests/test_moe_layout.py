"""Expert layouts and token dispatchers in the cost model: the copies a token sends under Megatron-Core's
alltoall dispatcher and under a flex (DeepEP, HybridEP) one, against an enumeration of every routing of a
small model and against hand arithmetic for Qwen3-30B-A3B; MoE parallel folding (--etp): the default
(etp = t) as before, the Qwen3-235B-A22B row's layout (t 2, ep 32, etp 1) by hand, its refusals; and the
published rows' commands as their recipes set them."""
from __future__ import annotations

import importlib.util
import itertools
import sys
import tomllib
from dataclasses import replace
from math import comb
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from conftest import ROOT
from schedc.cli import main
from schedc.layout import Layout

H100 = tomllib.loads((ROOT / "schedc" / "clusters" / "dgx-h100-80gb.toml").read_text())


def _setting(model: str, **layout):
    from schedc.costmodel.hardware import Setting
    from schedc.costmodel.specs import load_cluster, load_model_spec
    return Setting(load_model_spec(model), load_cluster("dgx-h100-80gb"), Layout(**layout))


def _link(table: str) -> tuple[float, float]:
    """(bytes/s as NCCL reaches it, latency s) of the H100 file's [intra] or [inter]."""
    return H100[table]["bandwidth_gbps"] * 1e9 * H100["efficiency"][table], H100[table]["latency_us"] * 1e-6


def _enumerated(experts: int, top_k: int, ep: int, per_node: int) -> dict[str, float]:
    """Every top_k set of experts equally likely (uniform routing), a token of GPU 0: experts / ep experts
    a GPU in order, per_node GPUs a node. alltoall: a copy per chosen expert off GPU 0, over NVLink when
    in node 0; flex: one network copy per other node reached, landing on the GPU of GPU 0's local index
    (0) there, and one NVLink copy per GPU reached other than the one it starts from in each node."""
    gpu = [e // (experts // ep) for e in range(experts)]
    sums = dict.fromkeys(("alltoall_nvlink", "alltoall_network", "flex_nvlink", "flex_network"), 0.0)
    routings = list(itertools.combinations(range(experts), top_k))
    for chosen in routings:
        gpus = {gpu[e] for e in chosen}
        sums["alltoall_nvlink"] += sum(1 for e in chosen if gpu[e] != 0 and gpu[e] // per_node == 0)
        sums["alltoall_network"] += sum(1 for e in chosen if gpu[e] // per_node != 0)
        nodes = {g // per_node for g in gpus}
        sums["flex_network"] += len(nodes - {0})
        sums["flex_nvlink"] += sum(1 for g in gpus if g % per_node != 0)  # landing GPU: local index 0
    return {key: value / len(routings) for key, value in sums.items()}


@pytest.mark.parametrize("experts, top_k, ep, per_node", [(8, 2, 4, 2), (12, 3, 6, 3), (16, 4, 8, 4), (8, 2, 4, 4)])
def test_the_copies_a_token_sends_match_every_routing_enumerated(experts, top_k, ep, per_node):
    from schedc.costmodel.experts import flex_copies
    m = SimpleNamespace(experts=experts, top_k=top_k, n_group=1, topk_group=1)
    nodes = ep // per_node
    seen = _enumerated(experts, top_k, ep, per_node)
    assert flex_copies(m, ep, per_node, nodes) == pytest.approx((seen["flex_nvlink"], seen["flex_network"]), rel=1e-12)
    assert seen["alltoall_nvlink"] == pytest.approx(top_k * (per_node - 1) / ep, rel=1e-12)
    assert seen["alltoall_network"] == pytest.approx(top_k * (ep - per_node) / ep, rel=1e-12)


def test_the_smallest_case_by_hand():
    """8 experts, top 2, 4 GPUs of 2 experts, 2 nodes: the token misses node 1's 4 experts with chance
    (4/8)(3/7) = 3/14, so 11/14 network copies (alltoall: 2·2/4 = 1); it reaches GPU 1 (and, forwarded,
    GPU 3) with chance 1 - (6/8)(5/7) = 13/28 each: 13/14 NVLink copies (alltoall: 2·1/4 = 1/2)."""
    from schedc.costmodel.experts import flex_copies, miss
    assert miss(8, 2, 4) == pytest.approx(3 / 14, rel=1e-15)
    m = SimpleNamespace(experts=8, top_k=2, n_group=1, topk_group=1)
    assert flex_copies(m, 4, 2, 2) == pytest.approx((13 / 14, 11 / 14), rel=1e-15)


def test_qwen3_30b_s_all_to_all_under_its_recipe_s_flex_dispatcher_by_hand():
    """Megatron-Bridge's Qwen3-30B-A3B row: 16 H100s, EP 16 over two nodes of 8, 128 experts (8 a GPU),
    top 8, b·s = 4096 tokens of 2048 x 2 bytes. alltoall: 8·8/16 = 4 copies a token over InfiniBand.
    flex: 1 - C(64,8)/C(128,8) = 0.9969 over InfiniBand and 2·7·(1 - C(120,8)/C(128,8)) = 5.77 over
    NVLink; InfiniBand's the longer."""
    from schedc.costmodel.experts import all_to_all
    token = 4096 * 2048 * 2
    (near_bw, near_lat), (far_bw, far_lat) = _link("intra"), _link("inter")
    layout = dict(dp=16, ep=16, microbatch_size=1, recompute="none")
    network = 1 - comb(64, 8) / comb(128, 8)
    nvlink = 2 * 7 * (1 - comb(120, 8) / comb(128, 8))
    assert round(network, 4) == 0.9969 and round(nvlink, 2) == 5.77
    flex = all_to_all(_setting("qwen3-30b-a3b", moe_dispatcher="flex", **layout))
    assert flex == pytest.approx(max(near_lat + token * nvlink / near_bw, far_lat + token * network / far_bw), rel=1e-12)
    alltoall = all_to_all(_setting("qwen3-30b-a3b", moe_dispatcher="alltoall", **layout))
    assert alltoall == pytest.approx(far_lat + token * 4 / far_bw, rel=1e-12)
    assert all_to_all(_setting("qwen3-30b-a3b", **layout)) == alltoall  # no group-limited routing: alltoall


def test_etp_equal_to_t_is_the_default_bit_for_bit():
    from schedc.costmodel.stages import stage_costs
    for model, layout in (("mixtral-8x7b", dict(tp=2, dp=8, ep=4)), ("qwen3-235b-a22b", dict(tp=4, dp=8, ep=8))):
        default, given = (stage_costs(_setting(model, **layout, **extra), 4).costs() for extra in ({}, {"etp": layout["tp"]}))
        assert default == given


def test_qwen3_235b_s_folded_expert_layout_by_hand():
    """t 2, d 16, ep 32, etp 1 (the row's): the 32 GPUs of a stage are the expert group, 8 to a node (its
    ranks one apart, tensor innermost); each GPU dispatches its b·s/t = 2048 tokens and each of its
    128/32 = 4 experts computes 32 x 2048 x 8 / 128 = 4096 of them at its whole width (3·4096·1536
    weights, not split); the experts' optimizer state over t·d/(etp·ep) = 1 GPU, the rest over 16."""
    from schedc.costmodel import experts
    from schedc.costmodel.bytes import expert_shards, stage_expert_params
    st = _setting("qwen3-235b-a22b", tp=2, dp=16, ep=32, etp=1, microbatch_size=1, sequence_parallel=True,
                  account_for_embedding=True, account_for_loss=True, distributed_optimizer=True)
    assert experts.tokens_per_expert(st) == 4096 and experts.ep_per_node(st) == 8
    assert stage_expert_params(st.model, st.layout, 32, 5) == 3 * 4 * 3 * 4096 * 1536  # 3 layers a stage
    assert expert_shards(st.layout, 16) == 1 and expert_shards(replace(st.layout, etp=2), 16) == 1
    assert expert_shards(replace(st.layout, ep=8), 16) == 4


@pytest.mark.parametrize("model, flags, words", [
    ("qwen3-235b-a22b", ["--tp", "2", "--dp", "16", "--ep", "32", "--etp", "2"],
     "--etp 2 x --ep 32 = 64 does not divide t x cp x d = 2 x 1 x 16 = 32"),
    ("qwen3-235b-a22b", ["--tp", "2", "--dp", "16", "--ep", "32"], "--ep 32 does not divide d x cp = 16 x 1 = 16"),
    ("llama3.1-8b", ["--dp", "2", "--etp", "1"], "--etp 1: the model has no experts"),
    ("qwen3-235b-a22b", ["--dp", "40", "--ep", "8", "--etp", "5"], "--etp 5 does not divide 'moe_ffn' (1536)"),
    ("qwen3-235b-a22b", ["--dp", "16", "--ep", "8", "--etp", "0"], "--etp must be a positive integer, got 0"),
])
def test_etp_is_refused_by_name(model, flags, words):
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=2", "-D", "m=4", "--model", model,
                                       "--cluster", "dgx-h100-80gb", "--stage-layers", _split(model), *flags])
    assert result.exit_code == 2 and words in result.output, result.output
    assert "Traceback" not in result.output


def _split(model: str) -> str:
    return {"qwen3-235b-a22b": "47,47", "llama3.1-8b": "16,16"}[model]


def _published_rows():
    spec = importlib.util.spec_from_file_location("published_rows", ROOT / "benchmarks" / "published_rows.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_published_moe_rows_run_as_their_recipes_set_them():
    """Qwen3-235B-A22B (26.04.01): combined 1F1B (the recipe overlaps the all-to-all), etp 1, Megatron-Core's
    alltoall dispatcher, the embedding and loss counted as layers; Qwen3-30B-A3B: the flex dispatcher."""
    rows = _published_rows()
    by_id = {row["id"]: row for row in rows.load()["row"]}
    big, _ = rows.command(by_id["bridge-26.04.01-qwen3-235b-a22b"])
    assert big[:5] == ["combined_1f1b", "-D", "p=8", "-D", "v=4"]
    text = " ".join(big)
    assert "--etp 1 --moe-dispatcher alltoall" in text and "--account-for-embedding --account-for-loss" in text
    small, _ = rows.command(by_id["bridge-26.04.01-qwen3-30b-a3b"])
    assert small[0] == "1f1b" and "--etp 1 --moe-dispatcher flex" in " ".join(small)
