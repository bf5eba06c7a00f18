"""check_memory: activation units against `limit memory`, bytes against --memory-limit with --model."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, ROOT
from schedc.checks.memory import parse_bytes
from schedc.cli import main
from schedc.diagnostics import SchedError

MODEL = """layers = 32
hidden = 4096
heads = 32
seq = 2048
microbatch_size = 1
dtype = "bf16"
vocab = 51200
"""


def check(*args):
    return CliRunner().invoke(main, ["check", *map(str, args)])


def test_units_limit_names_device_time_and_alive_ops():
    result = check(FIXTURES / "broken" / "memory.sched")
    assert result.exit_code == 1
    assert "device 1: 3 activation units alive at time 3 when F(1,2) runs" in result.output
    assert "alive: F(1,0), F(1,1), F(1,2)" in result.output
    assert "memory.sched:8" in result.output  # the limit's line, in a note


def test_bytes_formula(tmp_path):
    """1F1B, p = 2, m = 2 of a 4-layer model (h = 64, a = 4, s = 32, V = 128, b = 2) at 16 bits: device 0
    holds stage 0 (2 layers of 4h^2 + 2h*4h + 3h + 4h + 6h = 12h^2 + 13h parameters, the word and position
    embeddings V*h + s*h) at 16 bytes a parameter, and 2 forwards' activations, s*b*h*(34 + 5*a*s/h)
    bytes per layer (Korthikanti et al. 2022, no recomputation); device 1 holds stage 1 (2 layers, the
    final layer norm 2h and the tied embedding's copy V*h) and 1 forward's, plus the fp32 logits 4*s*b*V;
    when the optimizer step's fp32 gradients (4 bytes a parameter) are more, they count instead."""
    h, a, s, vocab, b = 64, 4, 32, 128, 2
    model = tmp_path / "m.toml"
    model.write_text(f"layers = 4\nhidden = {h}\nheads = {a}\nseq = {s}\nvocab = {vocab}\n")
    layer = 12 * h * h + 13 * h
    act = s * b * h * (34 + 5 * a * s / h)
    params0, params1 = 2 * layer + vocab * h + s * h, 2 * layer + 2 * h + vocab * h
    device0 = 16 * params0 + max(2 * 2 * act, 4 * params0)
    device1 = 16 * params1 + max(1 * 2 * act + 4 * s * b * vocab, 4 * params1)
    result = check("1f1b", "-D", "p=2", "-D", "m=2", "--model", model, "--microbatch-size", b,
                   "--memory-limit", f"{int(device0) - 1}B")
    assert result.exit_code == 1, result.output
    assert f"device 0: {device0 / 2**30:.2f} GiB at its peak exceeds the limit" in result.output
    fits = check("1f1b", "-D", "p=2", "-D", "m=2", "--model", model, "--microbatch-size", b)
    assert fits.exit_code == 0, fits.output
    assert f"device 0 {device0 / 2**30:.2f} GiB, device 1 {device1 / 2**30:.2f} GiB" in fits.output


@pytest.mark.parametrize("layout", [["-D", "p=4"], ["-D", "p=2", "-D", "m=8"]])
def test_check_counts_the_bytes_simulate_on_a_cluster_does(layout, tmp_path):
    """One rule for memory in bytes: `check --model` of a library model file (no microbatch_size in it:
    --microbatch-size gives b) reports per device what `simulate --cluster --recompute none` does for the
    same layout (t = 1) on a cluster without a memory allowance: GPT 39.1B was 229.52 GiB in check
    against 236.02 on the cluster, its embedding left out of check's count; the A100's allowance (the
    allocator's fragmentation and the CUDA context) comes on top on the cluster only."""
    model = ROOT / "schedc" / "models" / "gpt-1.7b.toml"
    text = (ROOT / "schedc" / "clusters" / "dgx-a100-80gb.toml").read_text()
    cluster = tmp_path / "no-allowance.toml"  # without [memory]: no allocator share, the tensors only
    cluster.write_text(text[:text.index("[memory]")])
    simulated = CliRunner().invoke(main, ["simulate", "1f1b", *layout, "--model", str(model), "--cluster",
                                          str(cluster), "--microbatch-size", "2", "--recompute", "none", "--json"])
    assert simulated.exit_code == 0, simulated.output
    per_device = json.loads(simulated.output)["memory_gib_per_device"]
    checked = check("1f1b", *layout, "--model", model, "--microbatch-size", "2")
    assert checked.exit_code == 0, checked.output
    shown = ", ".join(f"device {d} {gib:.2f} GiB" for d, gib in enumerate(per_device))
    assert f"peak memory per device: {shown}" in checked.output
    big = check("1f1b", "--model", ROOT / "schedc" / "models" / "gpt-39.1b.toml", "--microbatch-size", "1",
                "--memory-limit", "80GiB")
    assert big.exit_code == 1 and "device 0: 236.02 GiB at its peak exceeds the limit 80.00 GiB: weights, " \
        "gradients and optimizer state 150.52 GiB (stage 0) and activations 85.50 GiB" in big.output


def test_the_bytes_check_needs_a_microbatch_size_and_layers_that_divide(tmp_path):
    model = tmp_path / "model.toml"
    model.write_text(MODEL.replace("microbatch_size = 1\n", ""))
    result = check("1f1b", "--model", model)
    assert result.exit_code == 2 and "the bytes check needs the microbatch size: give --microbatch-size" \
        in result.output
    model.write_text(MODEL.replace("layers = 32", "layers = 30"))
    result = check("1f1b", "--model", model)
    assert result.exit_code == 2
    assert f"{model}:1:1: error: 'layers' (30) must be a multiple of the schedule's 4 stages" in result.output


def test_bytes_limit(tmp_path):
    model = tmp_path / "model.toml"
    model.write_text(MODEL)
    fits = check("1f1b", "--model", model, "--memory-limit", "80GiB")
    assert fits.exit_code == 0, fits.output
    assert "peak memory per device" in fits.output
    over = check("gpipe", "-D", "m=64", "--model", model, "--memory-limit", "40GiB")
    assert over.exit_code == 1
    assert "device 0:" in over.output and "exceeds the limit 40.00 GiB" in over.output
    assert "64 microbatch-stages alive" in over.output


@pytest.mark.parametrize("text,where", [("layers = 32\nhidden = [\n", "model.toml:2:"),
                                        (MODEL + "hiden = 3\n", "model.toml:8:1"),
                                        (MODEL.replace("32\n", "-1\n", 1), "model.toml:1:1")])
def test_bad_model_is_a_located_usage_error(tmp_path, text, where):
    model = tmp_path / "model.toml"
    model.write_text(text)
    result = check("1f1b", "--model", model)
    assert result.exit_code == 2 and where in result.output, result.output


def test_limits_parse():
    assert parse_bytes("80GiB") == 80 * 2 ** 30 and parse_bytes("1e9") == 1e9 and parse_bytes("512 MB") == 512e6
    with pytest.raises(SchedError) as info:
        parse_bytes("lots")
    assert info.value.exit_code == 2
    assert check("1f1b", "--memory-limit", "80GiB").exit_code == 2  # a byte limit needs --model
