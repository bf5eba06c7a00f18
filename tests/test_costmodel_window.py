"""costmodel with a sliding window (a config.json's sliding_window: Mistral 7B v0.1's 4096): the pairs
each query attends to summed by hand, the model FLOPs of a small windowed decoder written out, the flash
kernel's attention products scaled by that share and a standard kernel's not, the saved activation bytes
unchanged, --cp refused at the window's key; the keys of a config.json (sliding_window, Qwen2's
use_sliding_window, rope_scaling) read or refused where they stand."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.costmodel import Setting, layer_activation_bytes, model_flops
from schedc.costmodel.specs import ModelSpec, load_cluster
from schedc.costmodel.stages import attention_terms
from schedc.descriptions import DescriptionError, read_hf_config
from schedc.descriptions.facts import attended_pairs, window_share
from schedc.layout import Layout

REPO = Path(__file__).resolve().parents[1]
MISTRAL = REPO / "tests/data/hf/mistral-7b-v0.1/config.json"
TINY = (REPO / "tests/data/hf/tiny-llama/config.json").read_text()
H100 = replace(load_cluster("dgx-h100-80gb"), attention=None)  # its attention as GEMMs (no kernel table)
# a small decoder: h 64, 4 heads over 2 key/value heads (head 16, K and V 32 wide), SwiGLU 176, seq 8
SMALL = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, seq=8, vocab=256, ffn=176, mlp="swiglu", norm="rmsnorm",
                  positions="rope", tied_embeddings=False, bias="none", attention="flash")


def test_the_pairs_a_window_leaves_summed_by_hand():
    """s = 8, w = 3: positions 1..8 attend to 1, 2, 3, 3, 3, 3, 3, 3 keys = 21 of causal attention's
    1 + 2 + ... + 8 = 36; a window of 8 or more is the whole causal triangle."""
    assert attended_pairs(8, 3) == 1 + 2 + 3 + 3 * 5 == 21
    assert attended_pairs(8, None) == attended_pairs(8, 8) == attended_pairs(8, 100) == 36
    assert window_share(8, 3) == 21 / 36 and window_share(8, None) == window_share(8, 9) == 1.0
    assert attended_pairs(32768, 4096) == 4096 * 4097 // 2 + (32768 - 4096) * 4096  # Mistral 7B at 32k


def test_model_flops_of_a_windowed_decoder_written_out():
    """One layer's forward: 2s(2h² + 2h·kv + 3hf) = 16 (8,192 + 4,096 + 33,792) = 737,280 and the
    attention products 4s²h = 16,384, of which a window of 3 leaves 21/36; the logits 2shV = 262,144.
    A step of one microbatch without recomputation: 3 passes of 2 layers and 3 of the logits."""
    layer = 16 * (8192 + 4096 + 33792) + 16384 * 21 / 36
    want = 3 * 2 * layer + 3 * 262144
    layout = Layout(recompute="none")
    assert model_flops(replace(SMALL, window=3), layout, 1) == pytest.approx(want, rel=1e-12)
    assert model_flops(SMALL, layout, 1) == 3 * 2 * (16 * 46080 + 16384) + 3 * 262144  # no window: as before
    assert model_flops(replace(SMALL, window=8), layout, 1) == model_flops(SMALL, layout, 1)


@pytest.mark.parametrize("kernel,share", [("flash", 21 / 36), ("standard", 1.0)])
def test_a_flash_kernel_computes_the_band_and_a_standard_one_masks_the_square(kernel, share):
    """The attention products (QK^T, the product with V) and their backward: a flash kernel's scaled by
    the window's share (it skips the blocks outside the band), a standard kernel's not (a dense GEMM,
    then the mask); the s x s scores through HBM (standard) unchanged."""
    layout = Layout(recompute="none")
    full = attention_terms(Setting(replace(SMALL, attention=kernel), H100, layout))
    banded = attention_terms(Setting(replace(SMALL, attention=kernel, window=3), H100, layout))
    assert banded[0] == pytest.approx(full[0] * share, rel=1e-12) and banded[2] == pytest.approx(full[2] * share)
    assert banded[1] == full[1]


@pytest.mark.parametrize("kernel", ["flash", "standard"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_saved_activations_do_not_change_with_a_window(kernel, recompute):
    """Flash keeps Q, K, V, its output and a log-sum-exp per token whatever the window; a standard
    kernel's softmax output is s x s (the band masked in it)."""
    layout = Layout(recompute=recompute, microbatch_size=2)
    model = replace(SMALL, attention=kernel)
    assert layer_activation_bytes(replace(model, window=3), layout) == layer_activation_bytes(model, layout)


def test_simulate_reads_the_window_and_refuses_it_under_cp():
    """Mistral 7B v0.1's config.json at seq 16,384 on 32 H100 (t = 8, p = 4): the window of 4,096 makes
    the step shorter than the same model without it; --cp 2 refused at the sliding_window key."""
    base = ["simulate", "schedc/schedules/1f1b.sched", "-D", "p=4", "-D", "m=8", "--seq", "16384", "--cluster",
            "dgx-h800-80gb", "--tp", "8"]  # H100's compute without a kernel table (whose rates take no window)
    runner = CliRunner()
    windowed = runner.invoke(main, [*base, "--model", str(MISTRAL)])
    plain = runner.invoke(main, [*base, "--model", "mistral-7b"])  # the library's: no window stated
    assert windowed.exit_code == plain.exit_code == 0, windowed.output + plain.output
    times = [float(re.search(r"iteration_s ([0-9.]+)", r.output).group(1)) for r in (windowed, plain)]
    assert times[0] < 0.9 * times[1]
    refused = runner.invoke(main, [*base, "--model", str(MISTRAL), "--cp", "2"])
    assert refused.exit_code == 2 and f"{MISTRAL}:16:3: error: --cp 2 with a sliding window of 4,096" in refused.output


def _config(**changes) -> str:
    config = {**json.loads(TINY), **changes}
    return json.dumps(config, indent=2)


def test_the_keys_are_read():
    assert read_hf_config(MISTRAL.read_text(), 8192).window == 4096
    assert read_hf_config(_config(model_type="mistral", sliding_window=None), 16).window is None
    assert read_hf_config(_config(model_type="llama", sliding_window=8), 16).window is None  # not Llama's key
    qwen = dict(model_type="qwen2", use_sliding_window=True, sliding_window=8)
    assert read_hf_config(_config(**qwen, max_window_layers=0), 16).window == 8
    assert read_hf_config(_config(**qwen, max_window_layers=4), 16).window is None  # no layer from 4 on
    assert read_hf_config(_config(model_type="qwen2", sliding_window=8), 16).window is None  # not used
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # Llama 3.1's
    assert read_hf_config(_config(rope_scaling=scaling), 16).rope_scaling == (8.0, 1.0, 4.0, 8192)
    assert read_hf_config(_config(rope_scaling={"rope_type": "default"}), 16).rope_scaling is None


@pytest.mark.parametrize("changes,key,message", [
    ({"model_type": "mistral", "sliding_window": -4}, "sliding_window", "'sliding_window' must be a positive integer"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2},
     "max_window_layers", "'max_window_layers' 2: a sliding window on layers 2 to 3 only"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling",
     "rope_scaling of rope_type 'yarn': schedc applies \"llama3\""),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}, "rope_scaling",
     "rope_scaling's 'factor' must be a positive number, got 0"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                       "original_max_position_embeddings": 8192}}, "rope_scaling", "must exceed 'low_freq_factor'"),
    ({"rope_scaling": "llama3"}, "rope_scaling", "'rope_scaling' must be an object or null")])
def test_bad_values_are_refused_where_they_stand(changes, key, message):
    text = _config(**changes)
    with pytest.raises(DescriptionError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        read_hf_config(text, 16)
    line = next(n for n, row in enumerate(text.splitlines(), 1) if row.strip().startswith(f'"{key}"'))
    assert (caught.value.key, caught.value.line, caught.value.col) == (key, line, 3)


def test_under_a_kernel_table_the_window_scales_the_kernels_blocks():
    """dgx-h100-80gb's attention is its kernel table's (costmodel/attention.py): a window of 3 over 8
    tokens leaves the blocks 21/36 of their seconds, forward and backward; without the window, as before."""
    cluster = load_cluster("dgx-h100-80gb")
    assert cluster.attention is not None
    layout = Layout(recompute="none")
    full = attention_terms(Setting(SMALL, cluster, layout))
    banded = attention_terms(Setting(replace(SMALL, window=3), cluster, layout))
    assert banded[0] == pytest.approx(full[0] * 21 / 36, rel=1e-12)
    assert banded[2] == pytest.approx(full[2] * 21 / 36, rel=1e-12) and banded[1] == full[1] == 0.0
    assert attention_terms(Setting(replace(SMALL, window=8), cluster, layout)) == full
