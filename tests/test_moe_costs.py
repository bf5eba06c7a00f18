"""Expert parallelism in the cost model: --ep refused where it cannot be, the all-to-all's time by hand
from the cluster file's figures, the experts' weights and state sharded over ep, the all-to-all hidden
in an overlapped pair and exposed outside one, `op_seconds` for an MoE model, and DeepSeek-V3's Table 2
on the cost model's own op times."""
from __future__ import annotations

import json
import tomllib
from dataclasses import replace

import pytest
from click.testing import CliRunner

from conftest import ROOT, SCHEDULES
from schedc.cli import main
from schedc.driver import compile_source, read_source
from schedc.frontend.elaborate import Options
from schedc.layout import Layout

H800 = tomllib.loads((ROOT / "schedc" / "clusters" / "dgx-h800-80gb.toml").read_text())
SPLIT = ",".join(["4"] * 13 + ["3"] * 3)


def _setting(model: str = "deepseek-v3", **layout):
    from schedc.costmodel.hardware import Setting
    from schedc.costmodel.specs import load_cluster, load_model_spec
    return Setting(load_model_spec(model), load_cluster("dgx-h800-80gb"), Layout(**layout))


def _link(table: str) -> tuple[float, float]:
    """(bytes/s as NCCL reaches it, latency s) of the H800 file's [intra] or [inter]."""
    link = H800[table]
    return link["bandwidth_gbps"] * 1e9 * H800["efficiency"][table], link["latency_us"] * 1e-6


def test_an_all_to_all_inside_one_node_is_nvlink_s_share():
    """Mixtral 8x7B at ep 8, t 1: the 8 ranks fill a node; each token's 2 copies go 7/8 of the time to
    another GPU of it: b·s·h·2 bytes·2·7/8 over NVLink, plus its latency."""
    from schedc.costmodel.experts import all_to_all
    st = _setting("mixtral-8x7b", dp=8, ep=8, microbatch_size=1)
    bandwidth, latency = _link("intra")
    assert all_to_all(st) == pytest.approx(latency + 4096 * 4096 * 2 * 2 * 7 / 8 / bandwidth, rel=1e-12)


def test_node_limited_routing_bounds_the_network_copies_to_topk_group_nodes():
    """DeepSeek-V3 at ep 64, t 1 (its group-limited routing: the flex dispatcher): 8 nodes of 8; a token
    reaches at most topk_group = 4 nodes, 7/8 of them remote: 3.5 network copies (not top_k·56/64 = 7);
    NVLink carries 8·7·(1 - C(252,8)/C(256,8)) copies at once (each GPU of a node reached, its 4 experts
    of 256); the longer. Under the alltoall dispatcher (and without group limits) 8·56/64 network copies."""
    from math import comb

    from schedc.costmodel.experts import all_to_all
    st = _setting(dp=64, ep=64, microbatch_size=1)
    token = 4096 * 7168 * 2
    (near_bw, near_lat), (far_bw, far_lat) = _link("intra"), _link("inter")
    nvlink = 8 * 7 * (1 - comb(252, 8) / comb(256, 8))
    assert all_to_all(st) == pytest.approx(max(near_lat + token * nvlink / near_bw,
                                               far_lat + token * 4 * 7 / 8 / far_bw), rel=1e-12)
    assert all_to_all(replace(st, layout=replace(st.layout, moe_dispatcher="alltoall"))) == pytest.approx(
        far_lat + token * 8 * 56 / 64 / far_bw, rel=1e-12)
    ungrouped = replace(st, model=replace(st.model, n_group=1, topk_group=1))
    assert all_to_all(ungrouped) == pytest.approx(far_lat + token * 8 * 56 / 64 / far_bw, rel=1e-12)


def test_no_expert_parallelism_no_all_to_all_and_a_dense_model_none():
    from schedc.costmodel.stages import stage_costs
    for st in (_setting(dp=64, ep=1), _setting("llama3.1-8b", dp=8)):
        costs = stage_costs(st, 4)
        assert all(part.a2a == 0.0 for parts in costs.parts.values() for part in parts)


def test_expert_weights_are_sharded_over_ep_and_their_state_over_d_cp_over_ep():
    """Stage 1 of DeepSeek-V3 over 16 stages holds 4 MoE layers; at ep 8 each GPU keeps 256/8 experts of
    3·7168·2048 weights a layer, 7/8 fewer than at ep 1; with the distributed optimizer the experts'
    12 bytes of fp32 state are split over d/ep = 2 ranks, the rest over d = 16."""
    from schedc.costmodel.bytes import held_bytes, stage_params
    expert = 3 * 7168 * 2048
    whole, sharded = (_setting(dp=16, ep=ep, stage_layers=tuple(int(n) for n in SPLIT.split(",")))
                      for ep in (1, 8))
    assert stage_params(whole.model, 1, 16, 1, whole.layout) - stage_params(sharded.model, 1, 16, 1, sharded.layout) \
        == pytest.approx(4 * 256 * expert * 7 / 8, rel=1e-12)
    schedule = compile_source(read_source(SCHEDULES / "1f1b.sched"), Options({"p": "16", "m": "16"})).schedule
    optimizer = replace(sharded.layout, distributed_optimizer=True)
    params = stage_params(sharded.model, 1, 16, 1, optimizer)
    experts = 4 * 32 * expert
    state = held_bytes(sharded.model, optimizer, schedule)[1][0]
    assert state == pytest.approx((params - experts) * (4 + 12 / 16) + experts * (4 + 12 / 2), rel=1e-12)


def test_an_overlapped_pair_hides_the_all_to_all_under_the_other_half_s_compute():
    from schedc.costmodel.hardware import Part
    from schedc.costmodel.stages import overlapped_pair
    assert overlapped_pair(Part(3, a2a=4), Part(6, a2a=4)) == Part(9, a2a=1)
    # the pipeline's message first, then the all-to-all, behind the other half's compute
    assert overlapped_pair(Part(1, p2p=4, a2a=1), Part(2, a2a=3)) == Part(3, p2p=2, a2a=3)


@pytest.mark.parametrize("flags, words", [
    (["--dp", "8", "--ep", "3"], "error: --ep 3 does not divide the model's 8 experts"),
    (["--dp", "4", "--ep", "8"], "--ep 8 does not divide d x cp = 4 x 1 = 4"),
])
def test_ep_is_refused_by_name(flags, words):
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=4", "-D", "m=8", "--model", "mixtral-8x7b",
                                       "--cluster", "dgx-h100-80gb", *flags])
    assert result.exit_code == 2 and words in result.output, result.output
    assert "Traceback" not in result.output


def test_ep_not_dividing_the_experts_points_at_the_experts_key():
    path = ROOT / "schedc" / "models" / "mixtral-8x7b.toml"
    line = next(n for n, row in enumerate(path.read_text().splitlines(), 1) if row.startswith("experts"))
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=4", "-D", "m=8", "--model", "mixtral-8x7b",
                                       "--cluster", "dgx-h100-80gb", "--dp", "6", "--ep", "3"])
    assert f"{path}:{line}:1: error: --ep 3" in result.output, result.output


def test_ep_on_a_dense_model_is_refused():
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=4", "-D", "m=8", "--model", "llama3.1-8b",
                                       "--cluster", "dgx-h100-80gb", "--dp", "2", "--ep", "2"])
    assert result.exit_code == 2 and "--ep 2: the model has no experts" in result.output, result.output


def _simulate(schedule: str, model: str = "deepseek-v3", extra=()) -> dict:
    args = ["simulate", schedule, "-D", "p=16", "-D", "m=32", "--model", model, "--cluster", "dgx-h800-80gb",
            "--tp", "1", "--microbatch-size", "1", "--recompute", "full", "--distributed-optimizer", *extra, "--json"]
    if model == "deepseek-v3":
        args += ["--dp", "128", "--ep", "64", "--stage-layers", SPLIT]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture(scope="module")
def dualpipe():
    return _simulate("dualpipe")


def test_json_reports_op_times_and_all_to_all_for_an_moe_model_only(dualpipe):
    ops, a2a = dualpipe["op_seconds"], dualpipe["a2a_seconds"]
    assert set(ops) == {"F", "B", "I", "W", "FB"} and all(len(row) == 16 for row in ops.values())
    assert all(a2a["W"][s] == 0 for s in range(16)) and all(a2a["F"][s] > 0 for s in range(16))
    assert all(a2a["FB"][s] < a2a["F"][s] + a2a["B"][s] for s in range(1, 15))  # the pair hides some
    dense = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=4", "-D", "m=8", "--model", "llama3.1-8b",
                                      "--cluster", "dgx-h100-80gb", "--json"])
    assert "op_seconds" not in json.loads(dense.output)


def test_dualpipe_hides_the_all_to_all_and_1f1b_exposes_it(dualpipe):
    one = _simulate("1f1b")
    assert one["overlap_hidden_s"] == 0 and dualpipe["overlap_hidden_s"] > 0
    assert one["breakdown"]["expert_parallel_comm_s"] > 0
    assert dualpipe["iteration_s"] < one["iteration_s"]


# DeepSeek-V3 report, Table 2, on the cost model's op times of a middle stage of DeepSeek-V3 at EP 64 (16
# stages, no recomputation: every stage alike): the bubble (the most a device idles) and the activations
# (microbatches held at the peak).
@pytest.fixture(scope="module")
def table() -> dict[str, float]:
    from schedc.costmodel.stages import stage_costs
    st = _setting(dp=128, ep=64, microbatch_size=1, recompute="none",
                  stage_layers=tuple(int(n) for n in SPLIT.split(",")))
    costs = stage_costs(st, 16).costs()
    return {kind: costs[kind][1] for kind in ("F", "B", "I", "W", "FB")}


def _run(name: str, costs: dict, p: int, m: int):
    result = compile_source(read_source(SCHEDULES / f"{name}.sched"), Options({"p": str(p), "m": str(m)},
                                                                              costs=costs))
    assert result.ok, [d.message for d in result.diagnostics]
    return max(result.stats["idle"]), max(result.stats["peak_memory"])


@pytest.mark.parametrize("PP", [8, 16])
def test_table_2_1f1b_and_zb1p_bubbles_on_the_cost_model_s_op_times(table, PP):
    c = table
    assert _run("1f1b", {"F": c["F"], "B": c["B"]}, PP, 2 * PP)[0] == pytest.approx((PP - 1) * (c["F"] + c["B"]),
                                                                                    rel=1e-6)
    idle, held = _run("zb_h1", {k: c[k] for k in ("F", "B", "I", "W")}, PP, 2 * PP)
    assert idle == pytest.approx((PP - 1) * (c["F"] + c["B"] - 2 * c["W"]), rel=1e-6) and held == PP


@pytest.mark.parametrize("PP", [8, 16])
def test_table_2_dualpipe_bubble_and_activations_on_the_cost_model_s_op_times(table, PP):
    """DualPipe's (PP/2 - 1)(F&B + B - 3W) and PP + 1 activations. The table's chunks take as long for
    their input gradient as for their forward (B = F + W): the cost model's F, W and F&B (the all-to-all
    hidden in it) with I = F; its own I, longer than F (the backward's attention is 2.5 forwards'), idles
    less than the formula says (benchmarks/moe_dualpipe.py prints both)."""
    c = table
    assert c["FB"] < c["F"] + c["B"]  # the all-to-all partly hidden
    premise = {**c, "I": c["F"], "B": c["F"] + c["W"]}
    formula = (PP // 2 - 1) * (premise["FB"] + premise["B"] - 3 * premise["W"])
    for m in (2 * PP, 3 * PP):
        idle, held = _run("dualpipe", premise, PP, m)
        assert idle == pytest.approx(formula, rel=0.01) and held == PP + 1
    assert _run("dualpipe", c, PP, 2 * PP)[1] == PP + 1


def test_moe_model_flops_per_token_match_megatron_bridge_s_published_ratio():
    """Megatron-Bridge's Qwen3-30B-A3B row (26.06, H100 FP8): 203 TFLOP/s/GPU at 8,826 tokens/s/GPU, 23.0
    GFLOP a token, counting causal attention's products half (as its summary does): the model FLOPs less
    half their attention products (3 passes x 2·s·2·q_hidden a layer and token) give it within 1 %."""
    from schedc.costmodel.prediction import model_flops
    from schedc.costmodel.specs import load_model_spec
    m = load_model_spec("qwen3-30b-a3b")
    per_token = model_flops(m, Layout(recompute="none"), 1) / m.seq
    half_attention = 3 * 2 * m.seq * 2 * m.q_hidden * m.layers / 2
    assert (per_token - half_attention) == pytest.approx(203e12 / 8826, rel=0.01)


def test_the_library_qwen3_moe_files_have_their_published_parameters():
    from schedc.costmodel.specs import load_model_spec
    from schedc.descriptions.facts import activated_parameters, parameters
    # the model cards' figures and their last digit (activated within one: sources round it differently)
    for name, total, active, unit in (("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.1e9), ("qwen3-235b-a22b", 235e9, 22e9, 1e9)):
        m = load_model_spec(name)
        assert abs(parameters(m) - total) <= unit / 2 and abs(activated_parameters(m) - active) <= unit


def test_an_moe_layer_keeps_its_experts_widths_and_the_tokens_copies():
    """Mixtral 8x7B, t 1, b 1, s 4096, no recomputation, flash: the Llama-family table at the MLP width of
    a token's two experts (2·14336) plus the second copy of each token the experts keep (s·h·2 bytes),
    against the dense layer of that width; with full recomputation only the layer's input."""
    from schedc.costmodel.bytes import layer_activation_bytes
    from schedc.costmodel.specs import load_model_spec
    moe = load_model_spec("mixtral-8x7b")
    dense = replace(moe, experts=0, top_k=0, moe_ffn=0, ffn=2 * 14336)
    layout = Layout(microbatch_size=1, recompute="none")
    assert layer_activation_bytes(moe, layout) - layer_activation_bytes(dense, layout) == 4096 * 4096 * 2
    full = replace(layout, recompute="full")
    assert layer_activation_bytes(moe, full) == layer_activation_bytes(dense, full) == 2 * 4096 * 4096


def test_a_capacity_factor_caps_the_busiest_expert_s_tokens():
    from schedc.costmodel import experts
    st = _setting("mixtral-8x7b", dp=8, ep=8, microbatch_size=1)
    mean = 4096 * 2 * 8 / 8
    assert experts.tokens_per_expert(st) == mean * experts.EXPERT_IMBALANCE
    capped = replace(st, model=replace(st.model, capacity_factor=0.5))
    assert experts.tokens_per_expert(capped) == mean * 0.5


def test_tune_takes_ep_as_a_constraint_and_names_it_in_the_winner():
    """The README's command: every candidate is laid out with --ep 64 (d = 128), and the winner's
    commands carry it; DualPipe is ranked (it hides the all-to-all) and every row fits 80 GiB."""
    result = CliRunner().invoke(main, [
        "tune", "--model", "deepseek-v3", "--cluster", "dgx-h800-80gb", "--gpus", "2048", "--ep", "64", "--tp", "1",
        "--pp", "16", "--microbatch-size", "1", "--fp8", "--global-batch", "4096", "--distributed-optimizer",
        "--account-for-embedding", "--account-for-loss", "--schedules", "dualpipe,1f1b,interleaved_1f1b", "--cp", "1"])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip()[:1].isdigit()]
    assert {row[1] for row in rows} == {"dualpipe", "1f1b", "interleaved_1f1b"}
    assert all(row[4] == "128" and float(row[11]) <= 80 for row in rows)
    assert "--ep 64" in result.output.split("the winner:")[1]


def test_latent_attention_keeps_its_wider_heads_and_latents():
    """DeepSeek-V3, t 1, b 1, s 4096: Q and K 128·192 wide where the table counts 7168, V and the output
    128·128, and the two latents (1536; 512 + 64) the up-projections read: 55,360 more values a token."""
    from schedc.costmodel.bytes import layer_activation_bytes
    from schedc.costmodel.specs import load_model_spec
    m = load_model_spec("deepseek-v3")
    plain = replace(m, kv_lora_rank=0, q_lora_rank=0, qk_rope_head_dim=0, qk_nope_head_dim=0, v_head_dim=0)
    layout = Layout(microbatch_size=1, recompute="none")
    extra = 2 * (128 * 192 - 7168) + 2 * (128 * 128 - 7168) + 1536 + 512 + 64
    assert extra == 55_360
    assert layer_activation_bytes(m, layout) - layer_activation_bytes(plain, layout) == 2 * 4096 * extra
