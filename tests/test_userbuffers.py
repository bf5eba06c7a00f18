"""userbuffers: the SMs Transformer Engine's --tp-comm-overlap takes from the GEMMs beside it, read from a
cluster file's [gpu] sms and [userbuffers.*] tables, charged per GEMM and pass, and the located errors of
a bad table."""
from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import ROOT, assert_bad_cluster_file
from schedc.costmodel import Setting, layer_parts
from schedc.costmodel.specs import ModelSpec, dump_cluster, load_cluster
from schedc.costmodel.stages import linear_gemms
from schedc.costmodel.userbuffers import OverlapConfig, Userbuffers
from schedc.layout import Layout

A100 = ROOT / "schedc" / "clusters" / "dgx-a100-80gb.toml"
H100 = load_cluster("dgx-h100-80gb")
ON = Layout(tp=4, recompute="none", sequence_parallel=True, tp_comm_overlap=True, fp8=True)


def llama(hidden: int = 4096, seq: int = 2048) -> ModelSpec:
    """A Llama-shaped model: 32 heads over 8 key/value heads, SwiGLU of 14,336."""
    return ModelSpec(4, hidden, 32, seq, 1024, 14336, "bf16", attention="flash", kv_heads=8, mlp="swiglu",
                     norm="rmsnorm", positions="rope", tied_embeddings=False, bias="none", family="llama")


def test_an_overlapped_gemm_runs_at_the_share_of_the_sms_left_to_it():
    # by hand: the projection's forward GEMM at t = 4 is 2048 tokens x 4096 out x 1024 in, 2·2048·4096·1024 =
    # 17,179,869,184 FLOPs; on 2,000 TFLOP/s of FP8 at a 0.5 share and half-dimension 128 its smallest side,
    # 1024, runs at 0.5 · 1024 / 1152 = 0.4444: 19.327 µs. 24 of 132 SMs given to the reduce-scatter beside it
    # leave 108: 19.327 · 132 / 108 = 23.622 µs
    ub = Userbuffers(132, (OverlapConfig("hand", taken=(("proj_fprop", 24),)),))
    cluster = replace(H100, fp8_flops=2000e12, gemm_fp8_efficiency=0.5, gemm_half_dim=128, userbuffers=ub)
    st = Setting(llama(), cluster, ON)
    plain = 2 * 2048 * 4096 * 1024 / (2000e12 * 0.5 * 1024 / 1152)
    assert plain == pytest.approx(19.327e-6, rel=1e-4)
    assert linear_gemms(st)[1] == pytest.approx(plain * 132 / 108, rel=1e-12)
    assert linear_gemms(st)[1] == pytest.approx(23.622e-6, rel=1e-4)
    off = Setting(llama(), cluster, replace(ON, tp_comm_overlap=False))
    assert linear_gemms(off)[1] == pytest.approx(plain, rel=1e-12)
    assert linear_gemms(st, "dgrad") == linear_gemms(off, "dgrad")  # the table takes nothing there


def test_each_pass_of_a_layer_pays_its_own_gemms_margin():
    st = Setting(llama(8192, 8192), H100, ON)  # Llama 3.1 70B's width at t 4, cp 1, FP8: Bridge's table
    bare = Setting(llama(8192, 8192), replace(H100, userbuffers=None), ON)
    with_ub, without = layer_parts(st), layer_parts(bare)
    taken = {"fprop": (0, 1, 0, 1), "dgrad": (4, 0, 2, 0), "wgrad": (24, 0, 4, 0)}  # qkv, proj, fc1, fc2
    for kind, gemm_pass in (("F", "fprop"), ("I", "dgrad"), ("W", "wgrad")):
        extra = sum(g * n / (132 - n) for g, n in zip(linear_gemms(bare, gemm_pass), taken[gemm_pass]))
        assert with_ub[kind].compute - without[kind].compute == pytest.approx(extra, rel=1e-9)
        assert extra > 0


@pytest.mark.parametrize("fp8, hidden, tp, cp, name", [
    (True, 8192, 4, 1, "bridge_fp8_h8192_tp4"),
    (False, 8192, 4, 1, "bridge_bf16_h8192_tp4"),
    (True, 16384, 8, 2, "bridge_fp8_h16384_tp8_cp2"),
    (True, 8192, 4, 2, "nemo_launcher_h8192_tp4_cp2"),
    (True, 16384, 8, 1, "transformer_engine_default"),
    (False, 4096, 2, 1, "transformer_engine_default"),
])
def test_the_first_table_that_matches_the_run_is_taken(fp8, hidden, tp, cp, name):
    assert H100.userbuffers.sms == 132
    assert H100.userbuffers.config(fp8, hidden, tp, cp).name == name


def test_no_table_no_overlap_or_one_gpu_changes_nothing():
    model = llama()
    a100 = load_cluster("dgx-a100-80gb")
    assert a100.userbuffers is None
    for cluster, layout in ((H100, replace(ON, tp_comm_overlap=False)), (H100, replace(ON, tp=1)),
                            (replace(H100, userbuffers=None), ON)):
        st = Setting(model, cluster, layout)
        assert linear_gemms(st, "wgrad") == linear_gemms(Setting(model, replace(H100, userbuffers=None), layout))


def test_the_tables_are_written_back_as_they_were_read(tmp_path):
    path = tmp_path / "h100.toml"
    path.write_text(dump_cluster(H100))
    assert load_cluster(str(path)) == H100


TABLE = "\n[userbuffers.mine]\nfp8 = true\ntp = 2\nproj_fprop = 16\n"


@pytest.mark.parametrize("edit, message, where", [
    (lambda t: t + TABLE, "missing field 'gpu.sms'", ":5:1:"),
    (lambda t: t.replace("[gpu]", "[gpu]\nsms = 108") + TABLE.replace("16", "108"),
     "'userbuffers.mine.proj_fprop' must be an integer from 0 to 107", ":41:1:"),
    (lambda t: t.replace("[gpu]", "[gpu]\nsms = 108") + TABLE.replace("tp = 2", "tp = 2\nqkv_bprop = 1"),
     "unknown key 'userbuffers.mine.qkv_bprop'", ":41:1:"),
    (lambda t: t.replace("[gpu]", "[gpu]\nsms = 108") + TABLE.replace("fp8 = true", "fp8 = 1"),
     "'userbuffers.mine.fp8' must be true or false", ":39:1:"),
    (lambda t: t.replace("[gpu]", "[gpu]\nsms = 0"), "'gpu.sms' must be an integer from 1", ":6:1:"),
])
def test_a_bad_userbuffers_table_is_a_located_error(tmp_path, edit, message, where):
    assert_bad_cluster_file(tmp_path, edit(A100.read_text()), message, where)
