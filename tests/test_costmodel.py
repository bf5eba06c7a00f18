"""costmodel: op costs, messages, memory and the step's prediction from a model on a cluster, against
independent constructions: the papers' formulas (Narayanan et al. 2021 equations 2 and 3, Korthikanti
et al. 2022 table 2), NCCL's bus-bandwidth definition, the bubble formulas, Megatron-LM's Table 1 and
the directions of its Figures 12, 13 and 14."""
from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import pytest
from click.testing import CliRunner

from conftest import ROOT
from schedc.cli import main
from schedc.costmodel.specs import ClusterSpec, ModelSpec, load_cluster
from schedc.layout import Layout
from schedc.costmodel import (Hardware, Setting, layer_activation_bytes, layer_parts, link_times, model_flops,
                              stage_costs, stage_params)
from schedc.plan import load_plan
from schedc.driver.cluster import compile_for

A100 = load_cluster("dgx-a100-80gb")
MODELS = ROOT / "schedc" / "models"

# Narayanan et al. (2021) Table 1: hidden, heads, layers, t, p, GPUs, batch, teraFLOP/s per GPU measured;
# microbatch size and interleaving (layers per virtual stage) from Megatron-LM's sc21/run_table_1.sh
TABLE_1 = [
    (2304, 24, 24, 1, 1, 32, 512, 16, 1, True, 137),
    (3072, 32, 30, 2, 1, 64, 512, 16, 1, True, 138),
    (4096, 32, 36, 4, 1, 128, 512, 16, 1, True, 142),
    (6144, 48, 40, 8, 1, 256, 1024, 8, 1, True, 135),
    (8192, 64, 48, 8, 2, 512, 1536, 4, 1, False, 138),
    (10240, 80, 60, 8, 4, 1024, 1792, 2, 3, False, 140),
    (12288, 96, 80, 8, 8, 1536, 2304, 2, 2, False, 148),
    (16384, 128, 96, 8, 16, 1920, 2160, 1, 2, False, 155),
    (20480, 128, 105, 8, 35, 2520, 2520, 1, 3, False, 163),
    (25600, 160, 128, 8, 64, 3072, 3072, 1, 1, False, 163),
]


def gpt(layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200) -> ModelSpec:
    return ModelSpec(layers, hidden, heads, seq, vocab, 4 * hidden)


def ideal(cluster: ClusterSpec = A100) -> ClusterSpec:
    """GEMMs at peak whatever their size, free memory traffic and free communication."""
    return replace(cluster, gemm_efficiency=1.0, gemm_half_dim=1e-9, hbm_bandwidth=1e30,
                   intra_bandwidth=1e30, inter_bandwidth=1e30, intra_latency=0.0, inter_latency=0.0)


def run(schedule: str, model: ModelSpec, layout: Layout, cluster: ClusterSpec = A100, **params):
    """Checked and simulated on the cluster, not lowered (as `schedc simulate --cluster`)."""
    return compile_for(schedule, {k: str(v) for k, v in params.items()}, Setting(model, cluster, layout),
                       lower=False)


def test_model_flops_are_the_papers_equation_3():
    for h, a, layers, t, p, n, batch, *_ in TABLE_1:
        model, s, v = gpt(layers, h, a), 2048, 51200
        eq3 = 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
        assert model_flops(model, Layout(), batch) == pytest.approx(eq3, rel=1e-12)
        no_recompute = 72 * batch * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
        assert model_flops(model, Layout(recompute="none"), batch) == pytest.approx(no_recompute, rel=1e-12)


def test_parameters_are_the_papers_equation_2_plus_the_final_layer_norm():
    for h, a, layers, *_ in TABLE_1:
        model = gpt(layers, h, a)
        eq2 = 12 * layers * h**2 * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * layers * h))
        assert stage_params(model, 1, 1, 0) == pytest.approx(eq2 + 2 * h, rel=1e-12)
    model = gpt(128, 25600, 160)  # 1T: the paper's 1008.0 billion
    assert stage_params(model, 1, 1, 0) / 1e9 == pytest.approx(1008.0, abs=0.05)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_activation_bytes_are_korthikantis_table_2(t):
    model, b = gpt(24, 4096, 32), 2
    s, h, a = 2048, 4096, 32
    sbh = s * b * h
    assert layer_activation_bytes(model, Layout(tp=t, microbatch_size=b, recompute="none")) == \
        pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert layer_activation_bytes(model, Layout(tp=t, microbatch_size=b, recompute="none", sequence_parallel=True)) == \
        pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert layer_activation_bytes(model, Layout(tp=t, microbatch_size=b, recompute="selective")) == \
        pytest.approx(sbh * (10 + 24 / t))
    assert layer_activation_bytes(model, Layout(tp=t, microbatch_size=b, recompute="selective",
                                                sequence_parallel=True)) == pytest.approx(sbh * 34 / t)
    assert layer_activation_bytes(model, Layout(tp=t, microbatch_size=b)) == pytest.approx(2 * sbh)


@pytest.mark.parametrize("t", [1, 4])
def test_on_an_ideal_gpu_a_layer_costs_its_flops_over_peak(t):
    model, b = gpt(4, 4096, 32), 2
    s, h = 2048, 4096
    flops = (24 * b * s * h * h + 4 * b * s * s * h) / t  # one layer's forward, per GPU
    for recompute, backward in (("none", 2), ("full", 3), ("selective", 2 + 4 * b * s * s * h / t / flops)):
        st = Setting(model, ideal(), Layout(tp=t, microbatch_size=b, recompute=recompute))
        parts = layer_parts(st)
        assert parts["F"].total == pytest.approx(flops / A100.peak_flops)
        assert (parts["I"] + parts["W"] + parts["recompute"]).total == pytest.approx(backward * flops / A100.peak_flops)
        assert parts["W"].total == pytest.approx(24 * b * s * h * h / t / A100.peak_flops)


def test_gemm_efficiency_is_half_at_the_half_dimension():
    hw = Hardware(A100)
    n = A100.gemm_half_dim
    assert hw.gemm(n, 8192, 8192) == pytest.approx(2 * n * 8192 * 8192 / (A100.peak_flops * A100.gemm_efficiency / 2))


def test_all_reduce_follows_ncclss_bus_bandwidth():
    """NCCL: busbw = algbw * 2(n-1)/n; in a node the bus runs at intra x its efficiency."""
    hw, size = Hardware(A100), 1e9
    busbw = A100.intra_bandwidth * A100.intra_efficiency
    for n in (2, 4, 8):
        latency = 2 * (n - 1) * A100.intra_latency
        assert hw.all_reduce(size, n, 8) == pytest.approx(size * 2 * (n - 1) / n / busbw + latency)
    # across nodes the network carries a 1/8 share per GPU: slower than in a node, faster than a flat ring
    two_nodes = hw.all_reduce(size, 16, 8)
    assert hw.all_reduce(size, 8, 8) < two_nodes < size * 2 * 15 / 16 / (A100.inter_bandwidth * A100.inter_efficiency)


def test_messages_take_the_link_the_two_stages_sit_on():
    model = gpt(8, 4096, 32)
    st = Setting(model, A100, Layout(tp=1, dp=2, microbatch_size=1))  # 4 pipeline devices per node
    links = link_times(st, 8)
    size = 2048 * 4096 * 2
    assert links[0][1] == pytest.approx(A100.intra_latency + size / (A100.intra_bandwidth * A100.intra_efficiency))
    assert links[3][4] == pytest.approx(A100.inter_latency + size / (A100.inter_bandwidth * A100.inter_efficiency))
    assert links[2][2] == 0.0 and links[4][3] == links[3][4]
    tp8 = link_times(Setting(model, A100, Layout(tp=8, microbatch_size=1)), 2)  # scatter/gather over 8 NICs
    gather = Hardware(A100).all_gather(size, 8, 8)
    assert tp8[0][1] == pytest.approx(A100.inter_latency + size / 8 / (A100.inter_bandwidth * A100.inter_efficiency)
                                      + gather)


def test_stage_costs_put_the_embedding_first_and_the_logits_last():
    st = Setting(gpt(8, 2048, 16), A100, Layout(microbatch_size=2))
    costs = stage_costs(st, 4).costs()
    f = costs["F"]
    assert f[0] > f[1] and f[3] > f[1] and f[1] == pytest.approx(f[2])
    assert costs["B"][3] > costs["B"][1]
    assert costs["FB"][1] == pytest.approx(f[1] + costs["B"][1])
    assert costs["B"][2] == pytest.approx(costs["I"][2] + costs["W"][2])


BUBBLES = [
    ("gpipe", {"p": 4, "m": 8}, Fraction(3, 8)),
    ("1f1b", {"p": 4, "m": 8}, Fraction(3, 8)),
    ("1f1b", {"p": 8, "m": 16}, Fraction(7, 16)),
    ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}, Fraction(3, 16)),
    ("interleaved_1f1b", {"p": 2, "v": 4, "m": 4}, Fraction(1, 16)),
]


def _free_communication(cluster: ClusterSpec) -> ClusterSpec:
    return replace(cluster, intra_bandwidth=1e30, inter_bandwidth=1e30, intra_latency=0.0, inter_latency=0.0)


@pytest.mark.parametrize("name,params,formula", BUBBLES)
def test_with_free_communication_the_bubble_is_the_formula(name, params, formula):
    """Every stage holds the same layers; on a GPU where every GEMM runs at peak and memory traffic is
    free, the end stages' extra (embedding, final layer norm, a logit layer of one class) is under 1e-4
    of a stage, and the bubble (idle over busy time) is the formula to 1e-4."""
    stages = params["p"] * params.get("v", 1)
    model = gpt(2 * stages, 1024, 16, seq=512, vocab=1)
    on = run(name, model, Layout(tp=1, microbatch_size=1), ideal(), **params)
    assert on.compiled.stats["bubble"] == pytest.approx(float(formula), rel=1e-4)
    assert on.prediction.breakdown["pipeline_comm_s"] == 0.0


@pytest.mark.parametrize("name,params,formula", BUBBLES)
def test_on_a100_the_end_stages_lengthen_the_bubble(name, params, formula):
    """With A100's efficiencies (communication free) the first and last stages also carry the
    embedding and the logit layer of 51,200 words, which the formulas leave out: the bubble is above
    the formula, and closer to it when each stage holds more layers (the extra weighs less)."""
    stages = params["p"] * params.get("v", 1)
    bubble = {per: run(name, gpt(per * stages, 8192, 64), Layout(tp=1, microbatch_size=1),
                       _free_communication(A100), **params).compiled.stats["bubble"] for per in (2, 8)}
    assert float(formula) < bubble[8] < bubble[2]


def throughput(schedule: str, model: ModelSpec, t: int, d: int, batch: int, **params) -> float:
    """teraFLOP/s per GPU of a Megatron-LM run (blocking sends), microbatch size 1 as in Figs. 12-14."""
    layout = Layout(tp=t, dp=d, microbatch_size=1, global_batch=batch, blocking_p2p=True)
    return run(schedule, model, layout, **params).prediction.tflops_per_gpu


@pytest.mark.parametrize("small,large", [(12, 60), (24, 48)])
def test_interleaving_helps_more_at_small_batch(small, large):
    """Fig. 12: GPT-3 175B on 96 GPUs (t=8, p=12), interleaved (2 chunks) against 1F1B."""
    model = gpt(96, 12288, 96)
    gain = {batch: throughput("interleaved_1f1b", model, 8, 1, batch, p=12, v=2)
            / throughput("1f1b", model, 8, 1, batch, p=12) for batch in (small, large)}
    assert gain[small] > gain[large] > 1.0


@pytest.mark.parametrize("batch", [32, 128])
def test_tensor_parallelism_across_nodes_is_worse_than_within(batch):
    """Fig. 13: the 162.2B GPT on 64 GPUs, (p, t) = (8, 8) against (4, 16) and (2, 32)."""
    model = gpt(32, 20480, 128)
    within = throughput("1f1b", model, 8, 1, batch, p=8)
    across = [throughput("1f1b", model, t, 1, batch, p=64 // t) for t in (16, 32)]
    assert within > across[0] > across[1]


@pytest.mark.parametrize("batch", [32, 512])
def test_throughput_falls_as_the_pipeline_grows_at_fixed_gpus(batch):
    """Fig. 14: the 5.9B GPT on 64 GPUs, t=1, p x d = 64, p from 2 to 32."""
    model = gpt(32, 3840, 32)
    rates = [throughput("1f1b", model, 1, 64 // p, batch, p=p) for p in (2, 4, 8, 16, 32)]
    assert all(a > b for a, b in zip(rates, rates[1:]))


@pytest.mark.parametrize("row", TABLE_1, ids=[f"{r[0]}h" for r in TABLE_1])
def test_table_1_rows_are_predicted_within_10_percent_and_fit_in_80_gb(row):
    h, a, layers, t, p, n, batch, b, v, overlap, measured = row
    layout = Layout(tp=t, dp=n // (t * p), microbatch_size=b, global_batch=batch, overlap_grad_reduce=overlap,
                    blocking_p2p=True)
    on = run("interleaved_1f1b" if v > 1 else "1f1b", gpt(layers, h, a), layout, p=p, **({"v": v} if v > 1 else {}))
    assert on.prediction.gpus == n
    assert on.prediction.tflops_per_gpu == pytest.approx(measured, rel=0.10)
    assert on.prediction.memory_bytes < A100.memory_bytes and on.compiled.ok


def test_the_breakdown_adds_up_to_the_iteration():
    layout = Layout(tp=8, dp=2, microbatch_size=1, global_batch=32)
    pred = run("interleaved_1f1b", gpt(16, 8192, 64), layout, p=4, v=2).prediction
    assert sum(pred.breakdown.values()) == pytest.approx(pred.iteration_s)
    assert all(value >= -1e-9 for value in pred.breakdown.values())
    assert pred.breakdown["pipeline_comm_s"] > 0 and pred.breakdown["tensor_parallel_comm_s"] > 0
    assert pred.memory_bytes == pytest.approx(sum(pred.memory_parts.values()))


def test_blocking_sends_hold_the_sender_for_the_message():
    """With blocking sends an op that feeds another device holds it for the message's time; the
    message then adds nothing on the way, and the step is longer (each device waits for its sends)."""
    model, base = gpt(16, 8192, 64), Layout(tp=8, dp=2, microbatch_size=1, global_batch=32)
    free, held = (run("1f1b", model, replace(base, blocking_p2p=b), p=4) for b in (False, True))
    costs, plain = held.compiled.schedule.costs, free.compiled.schedule.costs
    message = link_times(Setting(model, A100, base), 4)[0][1]
    assert costs["F"][0] == pytest.approx(plain["F"][0] + message)  # F(0) sends to stage 1
    assert costs["F"][3] == pytest.approx(plain["F"][3])              # the last F sends nothing
    assert costs["B"][0] == pytest.approx(plain["B"][0]) and costs["B"][1] == pytest.approx(plain["B"][1] + message)
    assert held.prediction.iteration_s > free.prediction.iteration_s
    assert held.prediction.breakdown["pipeline_comm_s"] > 0
    assert sum(held.prediction.breakdown.values()) == pytest.approx(held.prediction.iteration_s)


def test_memory_is_the_larger_of_the_backwards_and_the_steps_peak_plus_the_allowance():
    """Per GPU: 16 bytes per parameter (18 with torch DDP's gradient buckets), plus the larger of the
    activations and the optimizer step's fp32 gradients (4 per parameter), through the allocator's
    fragmentation, plus the reserved GiB."""
    model = gpt(8, 4096, 32)
    for overlap, recompute, bucket in ((False, "full", 0), (True, "full", 2), (True, "none", 2)):
        layout = Layout(tp=2, dp=2, microbatch_size=1, global_batch=8, recompute=recompute,
                        overlap_grad_reduce=overlap)
        pred = run("1f1b", model, layout, p=1).prediction
        params = stage_params(model, 2, 1, 0)
        parts = pred.memory_parts
        assert parts["weights_gradients_optimizer"] == pytest.approx((16 + bucket) * params)
        assert parts["optimizer_step"] == pytest.approx(max(0.0, 4 * params - parts["activations"]))
        allocated = (16 + bucket) * params + max(parts["activations"], 4 * params)
        assert pred.memory_bytes == pytest.approx(allocated / (1 - A100.fragmentation) + A100.memory_reserved)
        assert pred.memory_bytes == pytest.approx(sum(parts.values()))
    # full recomputation keeps little: the step's fp32 gradients are the peak; without it the activations
    assert run("1f1b", model, replace(layout, recompute="full"), p=1).prediction.memory_parts["optimizer_step"] > 0
    assert pred.memory_parts["optimizer_step"] == 0


@pytest.mark.parametrize("d", [1, 4, 16])
def test_the_distributed_optimizer_keeps_megatrons_bytes_per_parameter(d):
    """Megatron-LM's README ("Distributed Optimizer", fp16 weights and gradients): 20 bytes per
    parameter at the step without it, 4 + 16/d with it: the state kept (16, or 4 + 12/d) and the step's
    fp32 gradients (4, or 4/d), the peak where (short sequences) the activations are smaller. The
    gradient exchange takes the all-reduce's time; Adam runs over 1/d of the parameters."""
    model = gpt(8, 4096, 32, seq=16)
    layout = Layout(tp=2, dp=d, microbatch_size=1, global_batch=8 * d, recompute="full")
    params = stage_params(model, 2, 1, 0)
    plain = run("1f1b", model, layout, p=1).prediction
    sharded = run("1f1b", model, replace(layout, distributed_optimizer=True), p=1).prediction
    for pred, kept, step in ((plain, 16, 4), (sharded, 4 + 12 / d, 4 / d)):
        parts = pred.memory_parts
        assert parts["activations"] < step * params
        assert parts["weights_gradients_optimizer"] == pytest.approx(kept * params)
        at_step = parts["weights_gradients_optimizer"] + parts["activations"] + parts["optimizer_step"]
        assert at_step == pytest.approx((20 if pred is plain else 4 + 16 / d) * params)
    assert sharded.breakdown["data_parallel_comm_s"] == pytest.approx(plain.breakdown["data_parallel_comm_s"])
    assert sharded.breakdown["optimizer_s"] == pytest.approx(plain.breakdown["optimizer_s"] / d)


def test_with_the_distributed_optimizer_only_the_reduce_scatter_hides_behind_the_backward():
    """Overlapped (--overlap-grad-reduce), the gradients' reduce-scatter, half the exchange, and the
    tied embedding's all-reduce hide behind the last backward; the weights' all-gather, the other half,
    follows the step, exposed. No torch DDP bucket copy is kept."""
    from schedc.costmodel import Tail
    tail = Tail(exchange=1.0, embedding=0.2, optimizer=0.0)
    plain, overlap = Layout(), Layout(overlap_grad_reduce=True)
    sharded, both = Layout(distributed_optimizer=True), Layout(overlap_grad_reduce=True, distributed_optimizer=True)
    assert tail.exposed(plain, 5.0) == tail.exposed(sharded, 5.0) == pytest.approx(1.2)
    assert tail.exposed(overlap, 0.3) == pytest.approx(0.9) and tail.exposed(overlap, 5.0) == 0.0
    assert tail.exposed(both, 0.3) == pytest.approx(0.9) and tail.exposed(both, 1.0) == pytest.approx(0.5)
    assert tail.exposed(both, None) == 0.5 and tail.exposed(overlap, None) == 0.0
    model = gpt(8, 4096, 32)
    layout = Layout(tp=1, dp=64, microbatch_size=1, global_batch=64, recompute="full")
    full = run("1f1b", model, replace(layout, distributed_optimizer=True), p=1).prediction
    hidden = run("1f1b", model, replace(layout, distributed_optimizer=True, overlap_grad_reduce=True), p=1).prediction
    exchange = full.breakdown["data_parallel_comm_s"]  # p = 1: no embedding all-reduce; the backward is longer
    assert exchange > 0 and hidden.breakdown["data_parallel_comm_s"] == pytest.approx(exchange / 2)
    assert hidden.memory_parts["weights_gradients_optimizer"] == pytest.approx(
        full.memory_parts["weights_gradients_optimizer"])


def test_chimeras_replicas_shard_the_optimizer_state_over_twice_d():
    """Chimera's two pipelines hold every stage twice: its gradients are summed over 2d GPUs, and the
    distributed optimizer splits a stage's state over those 2d."""
    from schedc.costmodel import stage_params
    model = gpt(8, 4096, 32, seq=16)
    layout = Layout(tp=1, dp=2, microbatch_size=1, global_batch=16, recompute="full", distributed_optimizer=True)
    pred = run("chimera", model, layout, p=2).prediction
    held = stage_params(model, 1, 2, 0) + stage_params(model, 1, 2, 1)  # device 0: stage 0 and, reversed, stage 1
    assert pred.memory_parts["weights_gradients_optimizer"] == pytest.approx((4 + 12 / 4) * held)


def test_memory_over_the_gpu_is_an_error():
    layout = Layout(tp=1, microbatch_size=8, global_batch=64, recompute="none")
    on = run("1f1b", gpt(32, 8192, 64), layout, p=2)
    assert not on.compiled.ok and on.prediction.memory_bytes > A100.memory_bytes
    assert "exceeds the GPU's 80 GiB" in on.compiled.diagnostics[-1].message


def test_simulate_prints_the_prediction_and_compile_writes_it_into_the_plan(tmp_path):
    args = ["1f1b", "-D", "p=4", "--model", str(MODELS / "gpt-39.1b.toml"), "--cluster", "dgx-a100-80gb",
            "--tp", "8", "--dp", "2", "--microbatch-size", "2", "--global-batch", "32"]
    result = CliRunner().invoke(main, ["simulate", *args, "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    for key in ("iteration_s", "tflops_per_gpu", "peak_fraction", "memory_gib_per_gpu"):
        assert stats[key] > 0
    assert set(stats["memory_breakdown"]) == {"weights_gradients_optimizer_gib", "activations_gib",
                                              "optimizer_step_gib", "allocator_and_context_gib"}
    assert set(stats["breakdown"]) == {"compute_s", "tensor_parallel_comm_s", "pipeline_comm_s",
                                       "data_parallel_comm_s", "optimizer_s", "bubble_s"}
    table = CliRunner().invoke(main, ["simulate", *args])
    assert table.exit_code == 0 and "tflops_per_gpu" in table.output and "memory_gib_per_gpu" in table.output
    out = tmp_path / "plan"
    compiled = CliRunner().invoke(main, ["compile", *args, "-o", str(out)])
    assert compiled.exit_code == 0, compiled.output
    plan = load_plan(out / "plan.json")
    assert plan.meta["stats"]["iteration_s"] == stats["iteration_s"]
    assert plan.meta["cluster"]["tp"] == 8 and plan.meta["costs"]["F"][0] < 1.0  # seconds
    drawn = CliRunner().invoke(main, ["render", *args, "--comms", "-o", str(tmp_path / "step.dot")])
    assert drawn.exit_code == 0, drawn.output


def test_the_layouts_switches_show_in_the_summary_and_the_report(tmp_path):
    """`simulate --cluster` names the switches that are on and the exchange the distributed optimizer
    makes; the HTML report of the same compile shows them too (it showed t, p, d, b only)."""
    args = ["1f1b", "-D", "p=2", "--model", str(MODELS / "gpt-1.7b.toml"), "--cluster", "dgx-a100-80gb", "--tp", "2",
            "--dp", "2", "--global-batch", "16", "--distributed-optimizer", "--blocking-p2p"]
    text = CliRunner().invoke(main, ["simulate", *args]).output
    assert "global batch 16, recompute full, blocking sends, distributed optimizer\n" in text
    assert "gradient reduce-scatter + all-gather " in text and "gradient all-reduce" not in text
    report = tmp_path / "r.html"
    assert CliRunner().invoke(main, ["render", *args, "-o", str(report)]).exit_code == 0
    html = report.read_text()
    assert "<span>blocking sends</span><span>distributed optimizer</span>" in html
    assert "sequence parallel" not in html
