"""The activation table's per-op selective checkpointing (--recompute selective-ops, torchtitan's "op" policy
at 9dec370: parallelize_llama.py's _save_list, every second mm not saved): the bytes a block keeps and the
GEMMs its backward recomputes, by hand from the policy and the block's matmuls; where it is refused."""
from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.costmodel import Setting, layer_activation_bytes, layer_parts
from schedc.costmodel.activations import Facts, Sizes, layer_bytes
from schedc.costmodel.hardware import R
from schedc.costmodel.specs import load_cluster, load_cluster_model
from schedc.layout import Layout

from conftest import ROOT

H100 = replace(load_cluster("dgx-h100-80gb"), attention=None)  # its attention as GEMMs (no kernel table)
GIB = 2 ** 30


def test_the_per_op_policy_keeps_the_input_every_odd_matmul_and_the_attention_output():
    """Llama 3.1 8B (h 4096, 8 of 32 heads for K and V: 1024 wide, SwiGLU 14336), b 2, s 8192, bf16. The
    block's mm in forward order: wq, wk, wv, wo, w1, w3, w2; the policy saves the 1st, 3rd, 5th, 7th
    (wq 4096, wv 1024, w1 14336, w2 4096 values a token), the flash kernel's output (4096) and its fp32
    log-sum-exp (32 a token), and the checkpoint keeps the block's input (4096)."""
    tokens = 2 * 8192
    values = 4096 + (4096 + 1024 + 14336 + 4096) + 4096
    by_hand = 2 * tokens * values + 4 * 32 * tokens
    assert by_hand == 1_042_284_544
    sizes = Sizes(seq=8192, batch=2, hidden=4096, heads=32, ffn=14336, kv_heads=8)
    facts = Facts(value_bytes=2, scores=False, gated=True, stat_values=1)
    assert layer_bytes(sizes, facts, recompute="selective-ops") == by_hand
    model = load_cluster_model("llama3.1-8b", H100, seq=8192)
    assert layer_activation_bytes(model, Layout(microbatch_size=2, recompute="selective-ops")) == by_hand
    # 32 layers: 31.06 GiB, where Megatron's selective keeps 17 values a token of h per layer and more
    assert 32 * by_hand / GIB == pytest.approx(31.06, abs=0.005)
    assert layer_activation_bytes(model, Layout(microbatch_size=2, recompute="selective")) > 2 * by_hand


def test_a_gelu_block_keeps_q_v_and_the_mlp_input_gemm_output():
    """GeLU MLP, multi-head attention: mm are Q, K, V, O, fc1, fc2; kept Q, V, fc1 (h, h, f) beside the
    input and the attention's output."""
    sizes = Sizes(seq=16, batch=1, hidden=8, heads=2, ffn=32)
    facts = Facts(value_bytes=2, scores=False)
    assert layer_bytes(sizes, facts, recompute="selective-ops") == 2 * 16 * (8 + 8 + 8 + 32 + 8) + 4 * 2 * 16


def test_the_backward_recomputes_k_the_projection_and_up_and_the_elementwise_work():
    """R of selective-ops: the GEMMs of wk (bs x 1024 x 4096), wo (bs x 4096 x 4096) and w3 (bs x 14336
    x 4096), each at the cluster's efficiency of its smallest dimension (gemm x d / (d + 128)), and the
    forward's memory-bound work (F less its GEMMs and attention); Megatron's selective with a flash
    kernel recomputes nothing."""
    model = load_cluster_model("llama3.1-8b", H100, seq=8192)
    bs, peak = 2 * 8192, H100.peak_flops

    def gemm(n: int, k: int) -> float:
        small = min(bs, n, k)
        return 2 * bs * n * k / (peak * H100.gemm_efficiency * small / (small + 128))

    ops = layer_parts(Setting(model, H100, Layout(microbatch_size=2, recompute="selective-ops")))
    none = layer_parts(Setting(model, H100, Layout(microbatch_size=2, recompute="none")))
    forward_gemms = gemm(4096 + 2 * 1024, 4096) + gemm(4096, 4096) + gemm(2 * 14336, 4096) + gemm(4096, 14336)
    attention = 2 * 2 * bs * 8192 * 4096 / (peak * H100.gemm_efficiency * 128 / 256)  # QK^T and AV, head dim 128
    elementwise = none["F"].compute - forward_gemms - attention
    assert elementwise > 0
    recomputed = gemm(1024, 4096) + gemm(4096, 4096) + gemm(14336, 4096)
    assert ops[R].compute == pytest.approx(recomputed + elementwise, rel=1e-9)
    assert ops["F"] == none["F"] and ops["I"] == none["I"]
    selective = layer_parts(Setting(model, H100, Layout(microbatch_size=2, recompute="selective")))
    assert selective[R].compute == 0.0


TINY = str(ROOT / "tests" / "data" / "hf" / "tiny-llama" / "config.json")  # h 64, 4 heads, 2 kv heads (K, V 32 wide), f 176


def tiny_bytes(**layout) -> float:
    model = load_cluster_model(TINY, H100, seq=32)
    return layer_activation_bytes(model, Layout(microbatch_size=1, recompute="selective-ops", **layout))


def test_the_per_op_policy_at_t2_keeps_split_outputs_whole_partial_sums_and_the_reduce_scatters():
    """t = 2, sequence-parallel (torchtitan's apply_tp at 9dec370: attention_norm and ffn_norm
    SequenceParallel, wq wk wv w1 w3 ColwiseParallel, wo w2 RowwiseParallel to Shard(1)), s 32, b 1, bf16,
    values a token a rank kept:"""
    kept = {"block input, a sequence shard": 64 / 2,
            "wq (mm 1), its 2 of 4 heads": 64 / 2,
            "wv (mm 3), 1 of 2 kv heads": 32 / 2,
            "flash output": 64 / 2,
            "wo's reduce-scatter (wo, mm 4, recomputed)": 64 / 2,
            "w1 (mm 5), half the width": 176 / 2,
            "w2 (mm 7), its whole partial sum": 64,
            "w2's reduce-scatter": 64 / 2}
    assert sum(kept.values()) == 328
    by_hand = 2 * 32 * 328 + 4 * (4 // 2) * 32  # and the fp32 log-sum-exp of the rank's 2 heads
    assert by_hand == 21_248
    assert tiny_bytes(tp=2, sequence_parallel=True) == by_hand


def test_the_per_op_policy_under_float8_keeps_the_16_bit_outputs_and_two_amax_a_matmul():
    """torchao's Float8Linear (dynamic tensorwise scaling, compiled): the policy sees each linear's mm on
    Float8Tensors and keeps its bf16 output, as in bf16; the FP8 casts are recomputed; each cast's
    max(abs(x)) keeps its max, a 0-dim bf16 value, for the input and the weight of the 7 linears."""
    kept = {"block input": 64, "wq": 64, "wv": 32, "flash output": 64, "w1": 176, "w2": 64}
    assert sum(kept.values()) == 464
    by_hand = 2 * 32 * 464 + 4 * 4 * 32 + 2 * (2 * 7)
    assert by_hand == 30_236
    assert tiny_bytes(fp8=True) == by_hand
    assert tiny_bytes(fp8=True) - tiny_bytes() == 28


def test_the_per_op_policy_at_cp2_keeps_the_ranks_tokens():
    """cp = 2: each op of the block sees the rank's 16 of the 32 tokens (the ring runs inside the flash op
    the policy saves): the t = 1 list, 464 values a token, and 4 fp32 log-sum-exp values a token. With
    t = 2 (SP) and --fp8 as well: the t = 2 list's 328 values, 2 heads' log-sum-exp and 11 bf16 amax values
    (torchao's float8_tensor_parallel: the attention's and the MLP's inputs cast once before their gathers,
    wo's and w2's inputs by Float8RowwiseParallel, and the 7 weights)."""
    assert tiny_bytes(cp=2) == 2 * 16 * 464 + 4 * 4 * 16 == 15_104
    assert tiny_bytes(cp=2, tp=2, sequence_parallel=True, fp8=True) == 2 * 16 * 328 + 4 * 2 * 16 + 2 * 11 == 10_646


def test_the_backward_at_t2_in_fp8_recomputes_split_gemms_at_the_fp8_rate_and_gathers_again():
    """R at t = 2, SP, --fp8 (8B, b 2, s 8192): wk (bs x 512 x 4096), wo (bs x 4096 x 2048), w3 (bs x 7168 x
    4096) at the FP8 peak and efficiency, the forward's elementwise work (its casts too); and the two
    all-gathers the policy does not keep, half the forward's 2 all-gathers and 2 reduce-scatters."""
    model = load_cluster_model("llama3.1-8b", H100, seq=8192)
    bs = 2 * 8192
    c = H100

    def gemm(n: float, k: float, fp8: bool) -> float:
        small = min(bs, n, k)
        peak, share = (c.fp8_flops, c.gemm_fp8_efficiency or c.gemm_efficiency) if fp8 else (c.peak_flops, c.gemm_efficiency)
        return 2 * bs * n * k / (peak * share * small / (small + c.gemm_half_dim))

    lay = Layout(microbatch_size=2, recompute="selective-ops", tp=2, sequence_parallel=True, fp8=True)
    ops = layer_parts(Setting(model, H100, lay))
    none = layer_parts(Setting(model, H100, replace(lay, recompute="none")))
    forward_gemms = sum(gemm(n, k, True) for n, k in ((2048 + 2 * 512, 4096), (4096, 2048), (14336, 4096), (4096, 7168)))
    attention = 2 * 2 * bs * 8192 * 2048 / (c.peak_flops * c.gemm_efficiency * 128 / (128 + c.gemm_half_dim))
    elementwise = none["F"].compute - forward_gemms - attention
    recomputed = gemm(512, 4096, True) + gemm(4096, 2048, True) + gemm(7168, 4096, True)
    assert ops[R].compute == pytest.approx(recomputed + elementwise, rel=1e-9)
    assert ops[R].tp == pytest.approx(none["F"].tp / 2, rel=1e-12) and ops[R].tp > 0
    overlapped = layer_parts(Setting(model, H100, replace(lay, tp_comm_overlap=True)))
    assert overlapped[R].tp < ops[R].tp


@pytest.mark.parametrize("model, extra, named", [
    ("llama3.1-8b", ["--tp", "2"], "--tp 2 without --sequence-parallel"),
    ("llama3.1-8b", ["--fp8", "--eager"], "--fp8 with --eager"),
    ("mixtral-8x7b", [], "experts")])
def test_selective_ops_elsewhere_than_it_is_modelled_is_refused_by_name(model, extra, named):
    args = ["simulate", "1f1b", "-D", "p=2", "--model", model, "--seq", "8192", "--cluster", "dgx-h100-80gb",
            "--microbatch-size", "1", "--global-batch", "8", "--recompute", "selective-ops", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "--recompute selective-ops (torchtitan's per-op policy) is modelled" in result.output
    assert f"not with {named}" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("model, extra, named", [(TINY, ["--tp", "2"], "--tp 2 without --sequence-parallel"),
                                                 ("mixtral-8x7b", [], "experts")])
def test_tune_leaves_out_the_per_op_policy_where_it_is_not_modelled(model, extra, named):
    """The same rule for tune's candidates: a t without sequence parallelism (or an MoE model, once a
    KeyError) searches the other recomputations, and refuses by name when only the policy was asked."""
    args = ["tune", "--model", model, "--seq", "32", "--cluster", "dgx-h100-80gb", "--gpus", "4",
            "--global-batch", "8", "--pp", "1", *extra, "--recompute"]
    refused = CliRunner().invoke(main, args + ["selective-ops"])
    assert refused.exit_code == 2 and f"not with {named}" in refused.output, refused.output
    if model == TINY:
        searched = CliRunner().invoke(main, args + ["selective-ops,full"])
        assert searched.exit_code == 0 and "--recompute full" in searched.output, searched.output
        parallel = CliRunner().invoke(main, args[:-1] + ["--sequence-parallel", "--recompute", "selective-ops"])
        assert parallel.exit_code == 0 and "--tp 2" in parallel.output, parallel.output


def test_simulate_predicts_torchtitans_table1_layout_within_the_gpu():
    """torchtitan's Table 1 layout (8B, FSDP 8, b 2, s 8192, per-op checkpointing) on the 96 GB machine: with
    Megatron's selective it did not fit (111.55 GiB predicted); the per-op policy's 32 layers, the fp32
    logits (4·s·b·V) and one layer rebuilt in its backward (what no recomputation keeps, 34 bytes a token
    and hidden value in bf16 (norm inputs 4, Q K V and the projection's input 2.5, SwiGLU 3 x 3.5), its
    1/rms and log-sum-exp, less what the policy keeps) do."""
    from conftest import ROOT
    cluster = str(ROOT / "benchmarks" / "data" / "h100-96gb-grand-teton.toml")
    args = ["simulate", "1f1b", "-D", "p=1", "--model", "llama3.1-8b", "--seq", "8192", "--cluster", cluster,
            "--dp", "8", "--microbatch-size", "2", "--global-batch", "16", "--zero", "3", "--recompute"]
    fits = CliRunner().invoke(main, args + ["selective-ops"])
    assert fits.exit_code == 0, fits.output
    tokens, kept = 2 * 8192, 1_042_284_544
    rebuilt = 34 * tokens * 4096 + 4 * 2 * tokens + 4 * 32 * tokens - kept
    activations = (32 * kept + 4 * tokens * 128256 + rebuilt) / GIB
    assert f"activations {activations:.2f}," in fits.output and f"{activations:.2f}" == "40.05"
    assert CliRunner().invoke(main, args + ["selective"]).exit_code != 0


def test_the_runtime_refuses_selective_ops_by_name():
    from schedc.runtime.process.options import OptionError, parse_options
    with pytest.raises(OptionError, match="--recompute selective-ops .* not run"):
        parse_options(["plan.json", "--recompute", "selective-ops"])
    assert parse_options(["plan.json", "--recompute", "selective"]).layout == replace(
        parse_options(["plan.json"]).layout, recompute="selective")
