"""costmodel/sharding: ZeRO-2/3's collectives and memory, and context parallelism's attention, each held to
hand arithmetic: which ops gather under which order, the lane's times, the bytes per level, the causal
blocks a context-parallel GPU computes, and the bad inputs refused before anything runs."""
from __future__ import annotations

import itertools
from dataclasses import replace
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.costmodel import Setting
from schedc.costmodel.bytes import held_bytes, layer_activation_bytes
from schedc.costmodel.sharding import gathering
from schedc.costmodel.specs import load_cluster, load_model_spec
from schedc.costmodel.stages import attention_terms
from schedc.driver import compile_file
from schedc.layout import Layout, coordinates, rank_at
from schedc.passes.simulate import Lane, times

MODEL = """layers = 2
hidden = 64
heads = 4
seq = 32
vocab = 100
attention = "flash"
"""
PARAMS = 108544  # 2 layers of 4h^2 + 2hf + 3h + f + 6h (h = 64, f = 256) = 2 x 49,984; words 6,400,
# positions 2,048, the final norm 128: what one stage of t = 1 holds


def _model(tmp_path, text=MODEL):
    path = tmp_path / "model.toml"
    path.write_text(text)
    return str(path)


def test_the_rank_order_is_tensor_then_context_then_data_then_pipeline(tmp_path):
    t, cp, d, p = 2, 2, 3, 2
    ranks = [rank_at(pp, dd, tt, t, d, context=cc, cp=cp)
             for pp, dd, cc, tt in itertools.product(range(p), range(d), range(cp), range(t))]
    assert ranks == list(range(t * cp * d * p))
    back = [coordinates(r, t, d, cp) for r in ranks]
    assert [rank_at(c.pipeline, c.data, c.tensor, t, d, c.context, cp) for c in back] == ranks
    assert rank_at(3, 1, 1, tp=8, dp=4) == (3 * 4 + 1) * 8 + 1  # cp = 1: Megatron-LM's order as before


def _ops(text: str):
    """'F0 F1 B1 B0' -> ops of those kinds and stages."""
    return [SimpleNamespace(kind=w[0], stage=int(w[1:]), is_task=False) for w in text.split()]


@pytest.mark.parametrize("order, reshard, gathers", [
    # 1F1B's stage 0, p = 4, m = 6: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
    ("F0 F0 F0 F0 B0 F0 B0 F0 B0 B0 B0 B0", True, [0, 1, 2, 3, 4, 6, 8]),
    ("F0 F0 F0 F0 F0 F0 B0 B0 B0 B0 B0 B0", True, [0, 1, 2, 3, 4, 5, 6]),  # GPipe, m = 6
    ("F0 F1 B1 B0", True, [0, 1, 2, 3]),     # a V's two stages: each backward after its forward resharded
    ("F0 F1 B1 B0", False, [0, 1]),          # kept gathered: once per stage
    ("F0 I0 W0 F0 I0 W0", True, [0, 1, 4]),  # a split backward: I gathers, W finds its stage gathered
])
def test_a_stage_is_gathered_where_the_order_left_it_resharded(order, reshard, gathers):
    ops = _ops(order)
    assert [n for n, g in enumerate(gathering(ops, reshard)) if g] == gathers


@pytest.mark.parametrize("m", [4, 8, 12])
def test_more_microbatches_per_stage_repeat_the_resharding_gathers(m):
    """1F1B: every device gathers before each of its m forwards that follows a forward (or starts the
    step) and before each backward that follows a forward: m + 1 in all (hand-count: p - 1 - d warm-up
    forwards, then F B pairs whose forward follows a backward), and once without resharding."""
    orders = compile_file("1f1b", ["p=4", f"m={m}"]).schedule.orders
    for order in orders:
        assert sum(gathering(order, True)) == m + 1
        assert sum(gathering(order, False)) == 1


def test_the_lane_prefetches_under_the_previous_op_and_delays_the_step_by_its_reduce_scatter():
    cost, device, preds, firsts = [1.0, 1.0], [0, 0], [(), (0,)], [0]
    lane = Lane([0.5, 0.5], [0.0, 2.0], 1)
    start, end = times(cost, device, preds, firsts, 0.0, None, lane)
    assert (start, end) == ([0.5, 1.5], [1.5, 2.5])  # F0 waits for its gather; F1's ran 0.5..1.0 under F0
    assert lane.free == [4.5]                         # F1's reduce-scatter 2.5..4.5
    lane = Lane([3.0, 0.0], [0.0, 0.0], 1)
    assert times([1.0], [0], [()], [0], 0.0, None, lane) == ([3.0], [4.0])  # the first gather: all exposed


def _one_stage():
    return SimpleNamespace(stages=1, devices=1, pipelines=[SimpleNamespace(placement=(0,))])


LAYER = 49984  # one layer's parameters (4h^2 + 2hf + 3h + f + 6h at h = 64, f = 256)


@pytest.mark.parametrize("layout, per_param, whole", [
    (Layout(), 16, 0),                                # replicas: 2 weight + 2 gradient + 4 master + 8 Adam
    (Layout(dp=4, distributed_optimizer=True), 4 + 12 / 4, 0),
    (Layout(dp=4, zero=2), 2 + 14 / 4, 2 * LAYER),   # + one layer's 16-bit gradient until reduce-scattered
    (Layout(dp=4, zero=3), 16 / 4, 2 * PARAMS + 2 * LAYER),  # + the gathered 16-bit weights: the root's and
    (Layout(dp=2, cp=2, zero=3), 16 / 4, 2 * PARAMS + 2 * LAYER),  # two layers (all there are), + that gradient
    (Layout(dp=2, cp=2, distributed_optimizer=True), 4 + 12 / 4, 0),
])
def test_memory_per_zero_level_is_the_hand_sum(tmp_path, layout, per_param, whole):
    model = load_model_spec(_model(tmp_path))
    (state, step, last), = held_bytes(model, layout, _one_stage())
    assert state == pytest.approx(PARAMS * per_param + whole, rel=1e-12)
    assert step == pytest.approx(4 * PARAMS / (layout.dp * layout.cp if layout.sharding else 1), rel=1e-12)


@pytest.mark.parametrize("reshard, gathered", [(True, 2 * LAYER), (False, 8 * LAYER)])
def test_without_a_pipeline_fsdp_gathers_two_layers_at_a_time_when_resharding(tmp_path, reshard, gathered):
    """8 layers on one stage: the root's weights (8,576 = words 6,400 + positions 2,048 + the final norm
    128) are gathered throughout; resharding keeps two layers gathered (computing, prefetched), not
    resharding all eight."""
    model = load_model_spec(_model(tmp_path, MODEL.replace("layers = 2", "layers = 8")))
    (state, _, _), = held_bytes(model, Layout(dp=4, zero=3, reshard_after_forward=reshard), _one_stage())
    params = 8 * LAYER + 8576
    assert state == pytest.approx(params * 16 / 4 + 2 * (8576 + gathered) + 2 * LAYER, rel=1e-12)


def test_under_a_pipeline_a_stage_stays_gathered_at_the_peak(tmp_path):
    """Two stages of one layer each on two devices (1F1B): each device holds its stage's whole 16-bit
    weights and gradient beside its 16/d shard, resharding or not."""
    model = load_model_spec(_model(tmp_path))
    two = SimpleNamespace(stages=2, devices=2, pipelines=[SimpleNamespace(placement=(0, 1))])
    first = LAYER + 8448   # the embedding (words 6,400, positions 2,048)
    last = LAYER + 128 + 6400  # the final norm and the tied words' copy
    for reshard in (True, False):
        held = held_bytes(model, Layout(dp=4, zero=3, reshard_after_forward=reshard), two)
        assert [h[0] for h in held] == pytest.approx([p * 16 / 4 + 2 * p + 2 * p for p in (first, last)], rel=1e-12)


def test_context_parallelism_divides_the_activations(tmp_path):
    model = load_model_spec(_model(tmp_path))
    whole = layer_activation_bytes(model, Layout(recompute="full"))
    assert whole == 2 * 32 * 64  # the layer's input, 2 bytes x s x b x h (b = 1), under full recomputation
    assert layer_activation_bytes(model, Layout(recompute="full", cp=4)) == whole / 4


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_attention_over_the_load_balanced_chunks(tmp_path, cp):
    """GPU i of cp holds chunks i and 2cp-1-i of 2cp. Counted in chunk blocks (c x c, c = s/2cp), the
    ring computes its own two chunks' 2 x 2 block whole (as the model charges any sequence's attention)
    and cp - 1 half blocks of 2 x 2 (the mask leaves half of each): 4 + 2(cp - 1); the whole sequence
    at cp = 1 is (2cp)^2 blocks. The exact causal work, chunk q seeing q whole blocks and half its own,
    is the same 2cp on every GPU: the balance the chunks are for."""
    exact = [sum(q + 0.5 for q in (i, 2 * cp - 1 - i)) for i in range(cp)]
    assert exact == [2 * cp] * cp
    ratio = (4 + 2 * (cp - 1)) / (2 * cp) ** 2
    model = load_model_spec(_model(tmp_path, MODEL.replace("seq = 32", "seq = 64")))
    cluster = replace(load_cluster("dgx-h100-80gb"), gemm_half_dim=0.0, attention=None)  # the GEMM form, its rate fixed
    one = attention_terms(Setting(model, cluster, Layout()))[0]
    split = attention_terms(Setting(model, cluster, Layout(cp=cp)))[0]
    assert split == pytest.approx(one * ratio, rel=1e-12)
    assert split >= one * 2 * cp / (2 * cp) ** 2  # never below the exact causal work


def _simulate(tmp_path, *args, model=MODEL):
    return CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=2", "-D", "m=4", "--model", _model(tmp_path, model),
                                     "--cluster", "dgx-h100-80gb", *args])


@pytest.mark.parametrize("args, model, said", [
    (["--cp", "3"], MODEL, "--cp 3 does not split the sequence of 32 tokens into 2·cp = 6 equal chunks"),
    (["--cp", "2"], MODEL.replace('attention = "flash"\n', ""), "--cp 2 needs a flash attention kernel"),
    (["--cp", "0"], MODEL, "--cp must be a positive integer"),
    (["--reshard-after-forward", "--dp", "2"], MODEL, "--reshard-after-forward needs --zero 3"),
    (["--no-reshard-after-forward", "--zero", "2", "--dp", "2"], MODEL, "--no-reshard-after-forward needs --zero 3"),
    (["--zero", "3", "--dp", "2", "--overlap-grad-reduce"], MODEL, "--zero 3 with --overlap-grad-reduce is not supported"),
    (["--zero", "2", "--distributed-optimizer", "--dp", "2"], MODEL, "--zero 2 with --distributed-optimizer"),
    (["--zero", "4"], MODEL, "--zero must be 0, 1, 2 or 3, got 4"),
])
def test_bad_sharding_input_is_refused_naming_the_option(tmp_path, args, model, said):
    result = _simulate(tmp_path, *args, model=model)
    assert result.exit_code == 2, result.output
    assert said in result.output


def test_zero_one_is_the_distributed_optimizer(tmp_path):
    one = _simulate(tmp_path, "--dp", "2", "--zero", "1")
    alias = _simulate(tmp_path, "--dp", "2", "--distributed-optimizer")
    assert one.exit_code == alias.exit_code == 0
    assert one.output == alias.output


def test_zero_three_gathers_cost_more_when_resharding(tmp_path):
    """On a model large enough for the gathers to outlast the ops they hide under, resharding after the
    forward repeats them (m + 1 a device, not 1) and the step takes longer; the memory is the same (at the
    activation peak the stage is gathered either way)."""
    big = MODEL.replace("hidden = 64", "hidden = 4096").replace("heads = 4", "heads = 32").replace("seq = 32", "seq = 256")
    on, off = (_simulate(tmp_path, "--dp", "8", "--zero", "3", flag, "--json", model=big)
               for flag in ("--reshard-after-forward", "--no-reshard-after-forward"))
    assert on.exit_code == off.exit_code == 0, on.output + off.output
    import json
    a, b = json.loads(on.output), json.loads(off.output)
    assert a["iteration_s"] > b["iteration_s"]
    assert a["memory_gib_per_gpu"] == b["memory_gib_per_gpu"]


TUNED = MODEL.replace("layers = 2", "layers = 4").replace("seq = 32", "seq = 256")


@pytest.mark.parametrize("args", [["--cp", "2"], ["--cp", "2", "--zero", "3"], ["--zero", "2"],
                                  ["--zero", "3", "--no-reshard-after-forward"]])
def test_tune_takes_cp_and_the_zero_level_and_its_winner_predicts_as_simulate_does(tmp_path, args):
    import json
    model = _model(tmp_path, TUNED)
    tuned = CliRunner().invoke(main, ["tune", "--model", model, "--cluster", "dgx-h100-80gb", "--gpus", "8",
                                      "--global-batch", "8", "--schedules", "1f1b", "--top", "1", "--json", *args])
    assert tuned.exit_code == 0, tuned.output
    best = json.loads(tuned.stdout)[0]
    cp = int(args[args.index("--cp") + 1]) if "--cp" in args else 1
    assert best["t"] * best["p"] * best["d"] * cp == 8  # --gpus is t x cp x p x d
    simulated = CliRunner().invoke(main, [
        "simulate", best["schedule"], "-D", f"p={best['p']}", "--model", model, "--cluster", "dgx-h100-80gb",
        "--tp", str(best["t"]), "--dp", str(best["d"]), "--microbatch-size", str(best["b"]), "--global-batch", "8",
        "--recompute", best["recompute"], "--json", *args, *([] if "--zero" in args else ["--zero", str(best["zero"])])])
    assert simulated.exit_code == 0, simulated.output
    assert json.loads(simulated.stdout)["iteration_s"] == best["iteration_s"]
    assert best["cp"] == cp and ("--zero" not in args or best["zero"] == int(args[args.index("--zero") + 1]))


@pytest.mark.parametrize("args, said", [
    (["--cp", "3"], "--cp 3 does not divide --gpus 8"),
    (["--cp", "8"], "--cp 8 does not split the sequence of 12 tokens"),
    (["--reshard-after-forward"], "--reshard-after-forward needs --zero 3"),
])
def test_tune_refuses_bad_sharding_naming_the_option(tmp_path, args, said):
    model = _model(tmp_path, MODEL.replace("seq = 32", "seq = 12"))
    result = CliRunner().invoke(main, ["tune", "--model", model, "--cluster", "dgx-h100-80gb", "--gpus", "8",
                                       "--global-batch", "8", "--schedules", "1f1b", *args])
    assert result.exit_code == 2, result.output
    assert said in result.output
