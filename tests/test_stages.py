"""--eager: a Llama block's elementwise work kernel by kernel (torchtitan without torch.compile), by hand from
its model code's ops; where it is refused."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.costmodel import Setting, layer_parts
from schedc.costmodel.specs import load_cluster, load_cluster_model
from schedc.costmodel.stages import eager_elementwise
from schedc.layout import Layout

H100 = load_cluster("dgx-h100-80gb")


def test_eager_elementwise_is_the_ops_traffic_of_torchtitans_block():
    """Llama 3.1 8B (h 4096, kv 1024, f 14336), a token: two fp32 RMSNorms 2 x 36 h, rotary 20 (h + kv),
    repeat_kv 4 (h + kv), the attention output's copy 4 h, SiLU and product 10 f, two residual adds 12 h."""
    h, kv, f = 4096, 1024, 14336
    per_token = 2 * 36 * h + 20 * (h + kv) + 4 * (h + kv) + 4 * h + 10 * f + 12 * h
    assert per_token == 626_688
    model = load_cluster_model("llama3.1-8b", H100, seq=8192)
    st = Setting(model, H100, Layout(microbatch_size=2, eager=True))
    hbm = H100.hbm_bandwidth * H100.hbm_efficiency
    assert eager_elementwise(st) == pytest.approx(per_token * 2 * 8192 / hbm, rel=1e-12)


def test_eager_replaces_the_fused_elementwise_in_forward_backward_and_recomputation():
    """The fused forms charge 11 h (norms, residuals) + 3 f (SwiGLU) + 8 h (transposes) + 2 (h + kv) (rotary)
    values of 2 bytes a token; eager charges the ops' bytes instead: F grows by the difference, I by twice
    it (the backward's elementwise work is twice the forward's), selective-ops' R by it once."""
    h, kv, f, tokens = 4096, 1024, 14336, 2 * 8192
    model = load_cluster_model("llama3.1-8b", H100, seq=8192)
    hbm = H100.hbm_bandwidth * H100.hbm_efficiency
    extra = (626_688 - 2 * (11 * h + 3 * f + 8 * h + 2 * (h + kv))) * tokens / hbm
    for recompute, in_r in (("none", 0), ("selective-ops", 1)):
        fused = layer_parts(Setting(model, H100, Layout(microbatch_size=2, recompute=recompute)))
        eager = layer_parts(Setting(model, H100, Layout(microbatch_size=2, recompute=recompute, eager=True)))
        assert eager["F"].compute - fused["F"].compute == pytest.approx(extra, rel=1e-9)
        assert eager["I"].compute - fused["I"].compute == pytest.approx(2 * extra, rel=1e-9)
        assert eager["W"] == fused["W"]
        assert eager["recompute"].compute - fused["recompute"].compute == pytest.approx(in_r * extra, abs=1e-12)


@pytest.mark.parametrize("model, extra", [("gpt-1.7b", []), ("llama3.1-8b", ["--tp", "2"])])
def test_eager_is_refused_for_another_block(model, extra):
    args = ["simulate", "1f1b", "-D", "p=2", "--model", model, "--cluster", "dgx-h100-80gb", "--microbatch-size", "1",
            "--global-batch", "8", "--eager", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "--eager is torchtitan's Llama block run without torch.compile" in result.output


def test_the_prediction_names_the_switch():
    args = ["simulate", "1f1b", "-D", "p=2", "--model", "llama3.1-8b", "--seq", "8192", "--cluster", "dgx-h100-80gb",
            "--microbatch-size", "1", "--global-batch", "8", "--dp", "4", "--zero", "3"]
    fused, eager = (CliRunner().invoke(main, args + flag) for flag in ([], ["--eager"]))
    assert fused.exit_code == eager.exit_code == 0, eager.output
    assert "eager elementwise" in eager.output and "eager elementwise" not in fused.output
