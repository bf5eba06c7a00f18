"""calibrate (schedc/runtime/calibrate.py and `schedc calibrate`): the GEMM fit, the cluster file it writes, and
the fit of the compute rates to a measured profile."""
from __future__ import annotations

import json
from dataclasses import astuple

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.costmodel.specs import ModelSpec, dump_cluster, load_cluster
from schedc.layout import Layout
from schedc.costmodel import Setting, stage_costs
from schedc.predict import fit_to_profile
from schedc.runtime.calibrate import cluster_toml, fit_gemm

MODEL = "layers = 4\nhidden = 256\nheads = 8\nseq = 128\nvocab = 256\ndtype = \"fp32\"\n"


def test_the_gemm_fit_recovers_peak_and_half_dimension():
    rates = {n: 2e11 * n / (n + 48) for n in (64, 128, 256, 512)}
    peak, half = fit_gemm(rates)
    assert peak == pytest.approx(2e11) and half == pytest.approx(48)


def test_the_written_cluster_file_reads_back(tmp_path):
    text = cluster_toml("test box", 1.5e11, 20.0, 1.2e10, 16 * 2**30, 2, 5e-5, 2e9, 1e9)
    path = tmp_path / "box.toml"
    path.write_text(text)
    box = load_cluster(str(path))
    assert box.peak_flops == pytest.approx(1.5e11) and box.gemm_half_dim == pytest.approx(20)
    assert box.intra_efficiency == pytest.approx(0.5) and box.gpus_per_node == 2
    assert box.dtype == "fp32"  # its GEMMs were timed in fp32: an fp32 model is predicted at that rate
    again = tmp_path / "again.toml"
    again.write_text(dump_cluster(box, "round trip"))
    back = load_cluster(str(again))
    assert back.name == box.name
    numbers = [n for n, value in enumerate(astuple(box)) if isinstance(value, (int, float))]
    assert len(numbers) > 5 and [astuple(back)[n] for n in numbers] == pytest.approx(
        [astuple(box)[n] for n in numbers], rel=1e-12)  # pytest 9.2's approx refuses a str in a sequence
    assert [v for n, v in enumerate(astuple(back)) if n not in numbers] == \
        [v for n, v in enumerate(astuple(box)) if n not in numbers]


def test_fitting_to_a_profile_scales_compute_to_the_measured_sum():
    cluster = load_cluster("dgx-a100-80gb")
    model = ModelSpec(4, 256, 8, 128, 256, 1024, "fp32")
    layout = Layout(microbatch_size=8, recompute="none")
    costs = stage_costs(Setting(model, cluster, layout), 2).costs()
    profile = {"F": [3000 * f for f in costs["F"]], "B": [3000 * b for b in costs["B"]]}  # 3x slower, in ms
    fitted, factor = fit_to_profile(cluster, model, layout, profile)
    assert factor == pytest.approx(3.0)
    refit = stage_costs(Setting(model, fitted, layout), 2).costs()
    assert sum(refit["F"]) + sum(refit["B"]) == pytest.approx((sum(profile["F"]) + sum(profile["B"])) / 1000, rel=0.02)
    assert fitted.intra_bandwidth == cluster.intra_bandwidth


def test_schedc_calibrate_measures_and_fits(tmp_path):
    out, fitted = tmp_path / "cpu.toml", tmp_path / "fitted.toml"
    result = CliRunner().invoke(main, ["calibrate", "-o", str(out), "--quick"])
    assert result.exit_code == 0, result.output
    cpu = load_cluster(str(out))
    assert cpu.peak_flops > 1e9 and cpu.intra_bandwidth > 0 and cpu.gpus_per_node == 2
    model = tmp_path / "m.toml"
    model.write_text(MODEL)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"unit": "ms", "F": [50.0, 60.0], "B": [100.0, 120.0]}))
    result = CliRunner().invoke(main, ["calibrate", "-o", str(fitted), "--cluster", str(out), "--costs", str(profile),
                                       "--model", str(model), "--microbatch-size", "8"])
    assert result.exit_code == 0, result.output
    assert "measured / predicted compute" in result.output
    assert load_cluster(str(fitted)).intra_latency == pytest.approx(cpu.intra_latency)
    bad = CliRunner().invoke(main, ["calibrate", "-o", str(fitted), "--costs", str(profile)])
    assert bad.exit_code == 2 and "--costs and --model go together" in bad.output


def test_a_fit_is_at_the_microbatch_size_the_profile_was_measured_at(tmp_path):
    """The runtime's --profile-out records its --mb-size (default 4); calibrate fits at it, refuses a
    --microbatch-size that contradicts it, and asks for one when a profile does not say (calibrate's
    default was 1 against the runtime's 4: a fit without the option was silently 4x off)."""
    from schedc.runtime import trace
    assert trace.profile([], 2, 4) == {"unit": "ms", "microbatch_size": 4}
    model = tmp_path / "m.toml"
    model.write_text(MODEL)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"unit": "ms", "microbatch_size": 4, "F": [50.0, 60.0], "B": [100.0, 120.0]}))
    args = ["calibrate", "-o", str(tmp_path / "fitted.toml"), "--cluster", "dgx-a100-80gb", "--costs", str(profile),
            "--model", str(model)]
    fitted = CliRunner().invoke(main, args)
    assert fitted.exit_code == 0, fitted.output
    cluster = load_cluster("dgx-a100-80gb")
    spec = ModelSpec(4, 256, 8, 128, 256, 1024, "fp32")
    _, at_four = fit_to_profile(cluster, spec, Layout(microbatch_size=4, recompute="none"),
                                {"F": [50.0, 60.0], "B": [100.0, 120.0]})
    assert f"measured / predicted compute {at_four:.4g}" in fitted.output
    assert CliRunner().invoke(main, args + ["--microbatch-size", "4"]).exit_code == 0
    wrong = CliRunner().invoke(main, args + ["--microbatch-size", "1"])
    assert wrong.exit_code == 2
    assert f"--microbatch-size 1 disagrees with the profile {profile}, measured at microbatch size 4" in wrong.output
    profile.write_text(json.dumps({"unit": "ms", "F": [50.0, 60.0], "B": [100.0, 120.0]}))
    unsaid = CliRunner().invoke(main, args)
    assert unsaid.exit_code == 2 and "does not record its microbatch size: give --microbatch-size" in unsaid.output


def test_the_runtime_reads_a_schedc_model_file_microbatch_size_as_mb_size(tmp_path):
    from schedc.runtime.options import OptionError, build_parser, model_config
    path = tmp_path / "m.toml"
    path.write_text(MODEL.replace('dtype = "fp32"\n', "") + "microbatch_size = 2\n")
    assert model_config(build_parser().parse_args(["plan.json", "--model", str(path)])).mb_size == 2
    path.write_text(MODEL.replace('dtype = "fp32"\n', "") + "microbatch_size = 2\nmb_size = 3\n")
    with pytest.raises(OptionError, match="mb_size 3 and microbatch_size 2 differ"):
        model_config(build_parser().parse_args(["plan.json", "--model", str(path)]))
