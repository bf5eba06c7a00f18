"""costmodel/kernels.py and costmodel/attention.py: a cluster's attention kernel table (read, located
errors, written back), the rate lookup, the ring's blocks and their FLOPs, the merges' HBM bytes and the
exchange each ring leaves exposed, each against hand arithmetic."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from conftest import ROOT
from schedc.costmodel.attention import (TORCH_DKV_BYTES, TORCH_DQ_BYTES, TORCH_MERGE_BYTES, Block, block_flops,
                                        block_seconds, kernel_ring_exposed, merge_seconds, ring_blocks)
from schedc.costmodel.hardware import Setting
from schedc.costmodel.kernels import AttentionKernel
from schedc.costmodel.specs import dump_cluster, load_cluster, load_cluster_model
from schedc.costmodel.stages import attention_terms, layer_parts
from schedc.diagnostics import SchedError
from schedc.layout import Layout

H100 = load_cluster("dgx-h100-80gb")
TITAN = ROOT / "benchmarks" / "data" / "h100-96gb-grand-teton.toml"
FLAT = AttentionKernel("flat 100", (512.0, 16384.0), (100e12, 100e12), (100e12, 100e12), (100e12, 100e12))


def setting(cp: int, kernel: AttentionKernel | None = FLAT, seq: int = 8192, **layout) -> Setting:
    cluster = replace(H100, attention=kernel)
    return Setting(load_cluster_model("llama3.1-8b", cluster, seq), cluster, Layout(cp=cp, **layout))


def test_the_rate_is_linear_in_log_length_and_flat_past_the_ends():
    k = AttentionKernel("k", (1024.0, 4096.0), (200e12, 400e12), (100e12, 300e12), (150e12, 300e12))
    assert k.rate("forward", 2048) == pytest.approx(300e12)       # halfway in log2: 10 -> 12
    assert k.rate("forward", 1024 * 2 ** 0.5) == pytest.approx(250e12)
    assert k.rate("forward", 100) == 200e12 and k.rate("forward", 1e6) == 400e12
    assert k.rate("forward_causal", 4096) == 300e12
    assert k.rate("backward_causal", 1024) == pytest.approx(150e12 * 100 / 200)   # the causal share of the forward


def test_the_ring_computes_the_diagonal_then_half_blocks():
    assert ring_blocks(1, 32768) == (Block(32768, 32768, True),)
    assert ring_blocks(4, 2048) == (Block(2048, 2048, True),) + (Block(2048, 1024, False),) * 3


def test_each_block_does_a_cp_th_of_the_causal_sequence():
    # Llama 3.1 8B: 32 heads of 128; s = 8192 over cp = 4: s/cp = 2048, each block 4·32·2048·1024·128
    st = setting(4)
    flops = [block_flops(st, b) for b in ring_blocks(4, st.tokens)]
    assert flops == [4 * 32 * 2048 * 2048 * 128 / 2] + [4 * 32 * 2048 * 1024 * 128] * 3
    assert flops[0] == 34_359_738_368
    whole_causal = 4 * 32 * 8192 * 8192 * 128 / 2
    assert sum(flops) == whole_causal / 4


def test_a_block_takes_its_flops_at_the_kernels_rate():
    st = setting(2)
    forward, backward = block_seconds(st, Block(4096, 2048, False))
    flops = 4 * 32 * 4096 * 2048 * 128
    assert forward == pytest.approx(flops / 100e12)
    assert backward == pytest.approx(2.5 * flops / 100e12)


def test_without_the_table_a_flash_kernel_is_charged_as_before():
    st = setting(2, kernel=None)
    hw = st.hw
    gemm = 2 * hw.gemm(4096, 4096, 128, count=32)   # today's: the s/cp block as a GEMM, times (cp + 1) / 2
    assert attention_terms(st) == (gemm * 1.5, 0.0, 2.5 * gemm * 1.5)


def test_torch_merges_move_their_fp32_bytes_through_hbm():
    kernel = replace(FLAT, context_parallel="all-gather")
    st = setting(4, kernel)
    out, kv = 2048 * 4096, 2 * 2048 * 1024      # the output's values, the keys' and values' (8 kv heads)
    forward, backward = merge_seconds(st)
    rate = H100.hbm_bandwidth * H100.hbm_efficiency
    assert forward == pytest.approx(3 * (TORCH_MERGE_BYTES * out + 4 * kv) / rate)
    assert backward == pytest.approx(4 * (TORCH_DQ_BYTES * out + TORCH_DKV_BYTES * kv) / rate)
    assert 3 * (38 * out + 4 * kv) == 1_006_632_960
    repeated = setting(4, replace(kernel, repeated_kv=True))   # torchtitan repeats K/V to the 32 query heads
    assert merge_seconds(repeated)[1] == pytest.approx(4 * (10 * out + 26 * 2 * 2048 * 4096) / rate)
    assert merge_seconds(setting(1, kernel)) == (0.0, 0.0)


def test_the_p2p_ring_hides_each_message_under_the_previous_block():
    message = H100.intra_latency + 2 * 2048 * 1024 * 2 / (H100.intra_bandwidth * H100.intra_efficiency)
    assert kernel_ring_exposed(setting(4)) == (0.0, 0.0)   # 8.4 MB in 24 µs, under blocks of 344 µs
    fast = AttentionKernel("fast", (512.0,), (1e18,), (1e18,), (1e18,))
    block = 34_359_738_368 / 1e18                  # each of the 4 blocks' forward FLOPs at 1e18 FLOP/s
    forward, backward = kernel_ring_exposed(setting(4, fast))
    assert forward == pytest.approx(3 * (message - block))               # blocks of next to nothing hide next to nothing
    assert backward == pytest.approx(3 * (2 * message - 2.5 * block))    # keys, values and their gradients


def test_the_all_gather_ring_hides_the_gather_under_the_diagonal_only():
    fast = AttentionKernel("fast", (512.0,), (1e18,), (1e18,), (1e18,), "all-gather")
    st = setting(4, fast)
    kv_bytes = 2 * 2048 * 1024 * 2
    bus = H100.intra_bandwidth * H100.intra_efficiency
    gather = (2 * 3 / 4 * 4 * kv_bytes / bus + 2 * 3 * H100.intra_latency) / 2   # half a ring all-reduce in the node
    gradient = H100.intra_latency + 2 * 2048 * 1024 * 4 / bus                      # fp32 dk, dv to the next GPU
    block = 34_359_738_368 / 1e18
    forward, backward = kernel_ring_exposed(st)
    assert forward == pytest.approx(gather - block)
    assert backward == pytest.approx(gather - 2.5 * block + 3 * (gradient - 2.5 * block) + gradient)  # the last after


def test_a_ring_across_nodes_gathers_over_the_network():
    fast = AttentionKernel("fast", (512.0,), (1e18,), (1e18,), (1e18,), "all-gather")
    st = setting(2, fast, tp=8)   # t·cp = 16: the two GPUs of a ring sit in two nodes
    kv_bytes = 2 * 4096 * 1024 / 8 * 2
    gather = (2 * 1 / 2 * 2 * kv_bytes / (H100.inter_bandwidth * H100.inter_efficiency) + 2 * H100.inter_latency) / 2
    assert kernel_ring_exposed(st)[0] == pytest.approx(gather - 4 * 4 * 4096 * 4096 * 128 / 2 / 1e18)


def test_the_layer_carries_the_exposed_exchange_in_its_cp_part():
    fast = AttentionKernel("fast", (512.0,), (1e18,), (1e18,), (1e18,), "all-gather")
    st = setting(4, fast)
    parts = layer_parts(st)
    assert (parts["F"].cp, parts["I"].cp) == pytest.approx(kernel_ring_exposed(st))


def test_the_torchtitan_cluster_carries_flashattention2s_figures():
    titan = load_cluster(str(TITAN))
    k = titan.attention
    assert k.context_parallel == "all-gather" and k.repeated_kv
    assert k.rate("forward_causal", 16384) == 335e12 and k.rate("backward", 512) == 214e12
    assert k.rate("forward", 2 ** 12.5) == pytest.approx((368e12 + 370e12) / 2)
    assert math.isclose(k.rate("backward_causal", 16384), 322e12 * 335 / 370)


def test_the_attention_table_is_written_back_and_read_to_the_same_kernel(tmp_path):
    titan = load_cluster(str(TITAN))
    path = tmp_path / "again.toml"
    path.write_text(dump_cluster(titan))
    assert load_cluster(str(path)) == titan


@pytest.mark.parametrize("text, message, line", [
    ("forward_tflops = [1, 2]", "'attention.forward_tflops' has 2 figures for 3 lengths", 6),
    ("forward_tflops = [1, 2, -3]", "'attention.forward_tflops' must be a list of 1 to 64 numbers", 6),
    ("forward_tflops = [1, 2, 3]\ncontext_parallel = \"ring\"", "'attention.context_parallel' must be one of", 7),
    ("forward_tflops = [1, 2, 3]\nflops = 3", "unknown key 'attention.flops'", 7),
])
def test_a_bad_attention_table_is_a_located_error(tmp_path, text, message, line):
    base = (ROOT / "schedc" / "clusters" / "dgx-h100-80gb.toml").read_text()
    base = base[:base.index("\n[attention]")] + "\n"  # the file without its own table
    path = tmp_path / "bad.toml"
    path.write_text(base + "\n[attention]\nlengths = [512, 1024, 2048]\nforward_causal_tflops = [1, 2, 3]\n"
                    "backward_tflops = [1, 2, 3]\n" + text + "\n")
    with pytest.raises(SchedError) as caught:
        load_cluster(str(path))
    diag = caught.value.diagnostics[0]
    assert message in diag.message
    assert diag.span.line == base.count("\n") + line


def test_rates_measured_on_one_gpu_follow_a_clocked_down_peak():
    measured = replace(FLAT, measured_peak=989e12)
    st = setting(2, measured)
    slow = Setting(st.model, replace(st.cluster, peak_flops=741.75e12), st.layout)   # three quarters of the peak
    block = Block(4096, 2048, False)
    assert block_seconds(st, block) == pytest.approx(block_seconds(setting(2), block))   # dgx-h100: 989 as measured
    assert block_seconds(slow, block)[0] == pytest.approx(4 / 3 * block_seconds(st, block)[0])


def test_latent_attention_keeps_its_own_charge_under_a_kernel_table():
    # MLA's heads are not the table's 128 wide: experts.mla_swap charges it, against the GEMM form
    with_table = replace(H100, attention=FLAT)
    model = load_cluster_model("deepseek-v3", H100, 4096)
    without = replace(H100, attention=None)
    assert attention_terms(Setting(model, with_table, Layout(cp=2))) == attention_terms(Setting(model, without, Layout(cp=2)))
