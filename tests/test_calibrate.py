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
from schedc.costmodel.fit import fit_to_profile
from schedc.runtime.calibrate import cluster_toml, fit_gemm, fit_problems, fit_warnings

MODEL = "layers = 4\nhidden = 256\nheads = 8\nseq = 128\nvocab = 256\ndtype = \"fp32\"\n"


def test_the_gemm_fit_recovers_peak_and_half_dimension():
    rates = {n: 2e11 * n / (n + 48) for n in (64, 128, 256, 512)}
    peak, half = fit_gemm(rates)
    assert peak == pytest.approx(2e11) and half == pytest.approx(48)


def test_a_clean_fit_raises_no_problem():
    rates = {n: 2e11 * n / (n + 48) for n in (64, 128, 256, 512)}
    assert fit_problems(rates, *fit_gemm(rates)) == []


def test_rates_that_fall_with_size_are_named_with_their_numbers():
    # a loaded machine's measurement (84 GFLOP/s at n = 64, 16.6 at n = 512): the fit's half dimension
    # goes to the edge and the warning says so, with the remedy
    rates = {64: 84e9, 128: 60e9, 256: 31e9, 512: 16.6e9}
    peak, half = fit_gemm(rates)
    problems = fit_problems(rates, peak, half)
    assert half == 1.0  # no visible asymptote
    assert any("falls with size (84.0 GFLOP/s at n = 64, 16.6 at n = 512)" in p for p in problems)
    assert any("half dimension 1 is at the edge" in p for p in problems)
    assert all(w.startswith("warning: ") and "quiet machine" in w for w in fit_warnings(rates, peak, half))


def test_a_fit_that_misses_a_measured_rate_is_named():
    rates = {n: 2e11 * n / (n + 48) for n in (64, 128, 256, 512)}
    rates[128] *= 1.5  # one size measured while the machine was free, the others not
    problems = fit_problems(rates, *fit_gemm(rates))
    assert any(p.startswith("the fit misses a measured rate by") for p in problems)


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


@pytest.mark.slow
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
    from schedc.runtime.execution import trace
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
    from schedc.runtime.process.options import OptionError, build_parser, model_config
    path = tmp_path / "m.toml"
    path.write_text(MODEL.replace('dtype = "fp32"\n', "") + "microbatch_size = 2\n")
    assert model_config(build_parser().parse_args(["plan.json", "--model", str(path)])).mb_size == 2
    path.write_text(MODEL.replace('dtype = "fp32"\n', "") + "microbatch_size = 2\nmb_size = 3\n")
    with pytest.raises(OptionError, match="mb_size 3 and microbatch_size 2 differ"):
        model_config(build_parser().parse_args(["plan.json", "--model", str(path)]))


def _profiles_of(truth, model, layout, stages: int = 2) -> dict:
    """What a run on `truth` measures: the cost model's F, B, I and W per stage there, in ms."""
    costs = stage_costs(Setting(model, truth, layout), stages).costs()
    return {"unit": "ms", **{k: [1000 * v for v in costs[k]] for k in ("F", "B", "I", "W")}}


def test_fitting_profiles_at_two_sizes_recovers_both_rates_and_each_ops_overhead():
    """Profiles at two sizes of a machine whose GEMMs run 2x and memory-bound kernels 3x slower than the
    cluster says, with 400/150/900/700 us per layer of F, B, I and W beyond the kernels: the fit finds
    those rates and overheads, and the fitted cluster predicts a third size's ops as that machine runs them."""
    from dataclasses import replace
    from schedc.costmodel.fit import fit_to_profiles
    base = load_cluster("dgx-a100-80gb")
    overhead = (("F", 4e-4), ("B", 1.5e-4), ("I", 9e-4), ("W", 7e-4))
    truth = replace(base, peak_flops=base.peak_flops / 2, hbm_bandwidth=base.hbm_bandwidth / 3, overhead=overhead)
    layout = Layout(microbatch_size=4, recompute="none")
    small, large = ModelSpec(4, 128, 4, 64, 256, 512, "bf16"), ModelSpec(4, 1024, 16, 512, 256, 4096, "bf16")
    runs = [(m, layout, _profiles_of(truth, m, layout)) for m in (small, large)]
    fitted, slower, fit_overhead = fit_to_profiles(base, runs)
    assert slower == pytest.approx({"gemm": 2.0, "memory": 3.0}, rel=1e-6)
    assert fit_overhead == pytest.approx(dict(overhead), rel=1e-6, abs=1e-12)
    third = ModelSpec(8, 512, 8, 256, 256, 2048, "bf16")
    want, got = (stage_costs(Setting(third, c, layout), 4).costs() for c in (truth, fitted))
    for kind in ("F", "B", "I", "W"):
        assert got[kind] == pytest.approx(want[kind], rel=1e-6)


def test_one_size_gives_no_overhead_to_fit():
    from schedc.diagnostics import SchedError
    from schedc.costmodel.fit import fit_to_profiles
    base = load_cluster("dgx-a100-80gb")
    layout, model = Layout(microbatch_size=4, recompute="none"), ModelSpec(4, 256, 8, 128, 256, 1024, "bf16")
    profile = _profiles_of(base, model, layout)
    with pytest.raises(SchedError, match="give profiles of two model"):
        fit_to_profiles(base, [(model, layout, profile), (model, layout, profile)])


def test_a_clusters_overhead_is_added_per_layer_of_each_op(tmp_path):
    """[overhead] f_us, i_us, w_us: each stage's F, I and W cost its layers x that more; B, without
    b_us, its I's and W's; with b_us, its own. The file reads back and round-trips."""
    path = tmp_path / "box.toml"
    path.write_text(cluster_toml("box", 1.5e11, 20.0, 1.2e10, 16 * 2**30, 2, 5e-5, 2e9, 1e9)
                    + "\n[overhead]\nf_us = 100\ni_us = 300\nw_us = 200\n")
    box = load_cluster(str(path))
    assert dict(box.overhead) == pytest.approx({"F": 1e-4, "I": 3e-4, "W": 2e-4})
    from dataclasses import replace
    bare = replace(box, overhead=())
    model, layout = ModelSpec(6, 128, 4, 64, 256, 512, "fp32"), Layout(microbatch_size=2, recompute="none")
    plain, over = (stage_costs(Setting(model, c, layout), 3).costs() for c in (bare, box))
    for kind, extra in (("F", 1e-4), ("I", 3e-4), ("W", 2e-4), ("B", 5e-4)):
        assert [o - p for o, p in zip(over[kind], plain[kind])] == pytest.approx([2 * extra] * 3)
    again = tmp_path / "again.toml"
    again.write_text(dump_cluster(replace(box, overhead=box.overhead + (("B", 1e-4),))))
    back = load_cluster(str(again))
    assert dict(back.overhead) == pytest.approx({"F": 1e-4, "I": 3e-4, "W": 2e-4, "B": 1e-4})
    b_given = stage_costs(Setting(model, back, layout), 3).costs()
    assert [o - p for o, p in zip(b_given["B"], plain["B"])] == pytest.approx([2e-4] * 3)
    path.write_text(path.read_text() + "x_us = 1\n")
    from schedc.diagnostics import SchedError
    with pytest.raises(SchedError, match="unknown key 'overhead.x_us'"):
        load_cluster(str(path))
    path.write_text(cluster_toml("box", 1.5e11, 20.0, 1.2e10, 16 * 2**30, 2, 5e-5, 2e9, 1e9)
                    + "\n[host]\nbandwidth_gbps = -1\n")  # the optional tables' errors are not lost
    with pytest.raises(SchedError, match="'host.bandwidth_gbps' must be a number"):
        load_cluster(str(path))


def _benchmark():
    import importlib.util
    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("calibration_cpu", ROOT / "benchmarks" / "calibration_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cpu_benchmark_compares_each_cell_with_its_launches_median_and_spread():
    """benchmarks/calibration_cpu.py's comparison on a made-up measurement (no timing): the median of
    the launches, their min and max, the prediction's error against the median, and the table."""
    bench = _benchmark()
    rows = bench.compare({"1f1b small": 110.0, "zb_h1 large": 500.0},
                         {"1f1b small": [120.0, 100.0, 90.0, 140.0], "zb_h1 large": [400.0, 520.0, 450.0]})
    small, large = rows
    assert (small["median_ms"], small["min_ms"], small["max_ms"], small["launches"]) == (110.0, 90.0, 140.0, 4)
    assert small["error"] == pytest.approx(0.0)
    assert (large["median_ms"], large["launches"]) == (450.0, 3) and large["error"] == pytest.approx(500 / 450 - 1)
    text = bench.table(rows, {"1f1b small": 50.0, "zb_h1 large": 200.0})
    assert "| 1f1b small | 110.0 ms | 110.0 ms | 90.0-140.0 ms | 4 | +0.0 % | 50.0 ms |" in text
    assert "| zb_h1 large | 500.0 ms | 450.0 ms | 400.0-520.0 ms | 3 | +11.1 % | 200.0 ms |" in text
    assert text.endswith("largest error 11.1 % over 2 cells")
    assert set(bench.CALIBRATION).isdisjoint(bench.SIZES)  # the fit never sees a predicted size
    assert all(bench.CALIBRATION[c] != bench.SIZES[s] for c in bench.CALIBRATION for s in bench.SIZES)


def test_schedc_calibrate_fits_profiles_at_two_sizes_into_an_overhead_table(tmp_path):
    """`schedc calibrate --cluster C --costs a.json --model small.toml --costs b.json --model large.toml`
    writes the fitted rates and an [overhead] table that reads back; a --model count that is neither
    one nor one per --costs is refused."""
    from dataclasses import replace
    base = load_cluster("dgx-a100-80gb")
    truth = replace(base, peak_flops=base.peak_flops / 2, hbm_bandwidth=base.hbm_bandwidth / 3,
                    overhead=(("F", 4e-4), ("B", 1.5e-4), ("I", 9e-4), ("W", 7e-4)))
    layout = Layout(microbatch_size=4, recompute="none")
    args = ["calibrate", "-o", str(tmp_path / "fitted.toml"), "--cluster", "dgx-a100-80gb"]
    for name, spec in (("small", ModelSpec(4, 128, 4, 64, 256, 512, "bf16")),
                       ("large", ModelSpec(4, 1024, 16, 512, 256, 4096, "bf16"))):
        model, profile = tmp_path / f"{name}.toml", tmp_path / f"{name}.json"
        model.write_text(f"layers = 4\nhidden = {spec.hidden}\nheads = {spec.heads}\nseq = {spec.seq}\nvocab = 256\n")
        profile.write_text(json.dumps({**_profiles_of(truth, spec, layout), "microbatch_size": 4}))
        args += ["--costs", str(profile), "--model", str(model)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "GEMMs 2x, memory-bound kernels 3x the microbenchmarks' time; overhead per layer (us) F 400, B 150, " \
           "I 900, W 700" in result.output
    fitted = load_cluster(str(tmp_path / "fitted.toml"))
    assert dict(fitted.overhead) == pytest.approx(dict(truth.overhead), rel=1e-6)
    assert fitted.peak_flops == pytest.approx(truth.peak_flops, rel=1e-6)
    uneven = CliRunner().invoke(main, args + ["--costs", str(tmp_path / "small.json")])
    assert uneven.exit_code == 2 and "one --model for every --costs, or one per --costs" in uneven.output


def test_an_empty_profile_is_refused_as_one_with_no_stages(tmp_path):
    """A profile with empty F and B lists (no stage measured) is refused by name, by the one-size fit
    and by the two-size fit's check (both divided the model's layers by its 0 stages: a traceback)."""
    from schedc.diagnostics import SchedError
    from schedc.costmodel.fit import _check_profile
    model = tmp_path / "m.toml"
    model.write_text(MODEL)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"unit": "ms", "microbatch_size": 4, "F": [], "B": []}))
    result = CliRunner().invoke(main, ["calibrate", "-o", str(tmp_path / "fitted.toml"), "--cluster", "dgx-a100-80gb",
                                       "--model", str(model), "--costs", str(empty)])
    assert result.exit_code == 2, result.output
    assert "the profile has no stages (empty F and B lists)" in result.output
    assert not (tmp_path / "fitted.toml").exists()
    with pytest.raises(SchedError, match="the profile has no stages"):
        _check_profile(ModelSpec(4, 256, 8, 128, 256, 1024, "fp32"), {"F": [], "B": []})
