"""cluster: model and cluster descriptions, the library of clusters, and the located errors of bad input
(exit 2, naming the field) on the command line."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import ROOT, assert_bad_cluster_file
from schedc.cli import main
from schedc.layout import Layout
from schedc.costmodel.specs import library_clusters, load_cluster, load_model_spec, locate
from schedc.diagnostics import SchedError, Source

A100 = ROOT / "schedc" / "clusters" / "dgx-a100-80gb.toml"
MODEL = "layers = 8\nhidden = 1024\nheads = 16\nseq = 512\nvocab = 1024\n"


def _model(tmp_path, text: str = MODEL, name: str = "model.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _simulate(*args: str):
    return CliRunner().invoke(main, ["simulate", *args])


def test_the_library_has_an_a100_and_an_h100_node():
    names = [p.stem for p in library_clusters()]
    assert {"dgx-a100-80gb", "dgx-h100-80gb"} <= set(names)
    a100, h100 = load_cluster("dgx-a100-80gb"), load_cluster("dgx-h100-80gb")
    assert a100.peak_flops == 312e12 and a100.memory_bytes == 80 * 2**30 and a100.gpus_per_node == 8
    assert a100.hbm_bandwidth == 2039e9 and a100.inter_bandwidth == 25e9 and a100.intra_bandwidth == 300e9
    assert h100.peak_flops == 989e12 and h100.inter_bandwidth == 50e9
    assert 0 < a100.gemm_efficiency <= 1 and a100.intra_latency == pytest.approx(5e-6)


def test_the_zero_bubble_papers_machine_is_dgx_a100s_gpu_and_node_on_roce_and_h800_is_h100s_compute():
    """a100-80gb-roce differs from dgx-a100-80gb only between nodes (the one constant set: the same
    GPU, NVLink, efficiencies and memory allowance); dgx-h800-80gb is H100's compute with NVLink at
    400 GB/s per GPU, 200 each way."""
    a100, roce = load_cluster("dgx-a100-80gb"), load_cluster("a100-80gb-roce")
    h100, h800 = load_cluster("dgx-h100-80gb"), load_cluster("dgx-h800-80gb")
    same = ("peak_flops", "memory_bytes", "hbm_bandwidth", "gpus_per_node", "intra_bandwidth", "intra_latency",
            "gemm_efficiency", "gemm_half_dim", "hbm_efficiency", "intra_efficiency", "inter_efficiency",
            "memory_reserved", "fragmentation", "dtype")
    assert all(getattr(roce, k) == getattr(a100, k) for k in same)
    assert roce.inter_latency > a100.inter_latency
    assert (h800.peak_flops, h800.hbm_bandwidth, h800.memory_bytes) == (h100.peak_flops, h100.hbm_bandwidth,
                                                                        h100.memory_bytes)
    assert h800.intra_bandwidth == 200e9 < h100.intra_bandwidth and h800.inter_bandwidth == 50e9


def test_the_memory_allowance_is_optional_and_grows_what_the_tensors_need(tmp_path):
    """[memory]: the allocator's pool is allocated / (1 - fragmentation), plus reserved_gib outside it;
    a cluster file without the table has no allowance."""
    a100 = load_cluster("dgx-a100-80gb")
    assert a100.memory_reserved == 2**30 and a100.fragmentation == 0.15
    assert a100.reserved_bytes(17 * 2**30) == pytest.approx(20 * 2**30 + 2**30)
    text = A100.read_text()
    path = tmp_path / "bare.toml"
    path.write_text(text[:text.index("[memory]")])
    bare = load_cluster(str(path))
    assert (bare.memory_reserved, bare.fragmentation) == (0.0, 0.0) and bare.reserved_bytes(5.0) == 5.0


def test_a_model_takes_the_flat_keys_and_defaults_ffn_to_four_hidden(tmp_path):
    model = load_model_spec(_model(tmp_path))
    assert (model.layers, model.hidden, model.heads, model.seq, model.vocab, model.ffn) == (8, 1024, 16, 512, 1024, 4096)
    assert model.width == 2


def test_the_bytes_check_reads_the_same_model_file(tmp_path):
    path = _model(tmp_path, MODEL + "microbatch_size = 2\n")
    result = CliRunner().invoke(main, ["check", "1f1b", "--model", path])
    assert result.exit_code == 0, result.output
    assert "peak memory per device" in result.output


def test_locate_finds_keys_in_their_table_and_a_missing_key_at_the_header():
    source = Source("c.toml", 'name = "x"\n[gpu]\n  peak_tflops = 1 # [node]\n[node]\ngpus = 8\n"peak_tflops" = 2\n')
    assert str(locate(source, "peak_tflops", "gpu")) == "3:3"
    assert str(locate(source, "peak_tflops", "node")) == "6:1"
    assert str(locate(source, "memory_gib", "gpu")) == "2:1"
    assert str(locate(source, "name")) == "1:1"


@pytest.mark.parametrize("edit,message,where", [
    (lambda t: t.replace("hbm_gbps = 2039", ""), "missing field 'gpu.hbm_gbps'", ":5:1:"),
    (lambda t: t.replace("gpus = 8", "gpus = 8.5"), "'node.gpus' must be a positive integer", ":11:1:"),
    (lambda t: t.replace("gemm = 0.85", "gemm = 1.5"), "'efficiency.gemm' must be a number in [1e-06, 1]", ":22:1:"),
    (lambda t: t.replace("gemm = 0.85 ", "gemm = 0.85\ngemm_fp8 = 1.2 "), "'efficiency.gemm_fp8' must be a number in "
     "[1e-06, 1]", ":23:1:"),
    (lambda t: t.replace("latency_us = 10", "latency_us = -1"), "'inter.latency_us' must be a number from 1e-06 to 1e+15",
     ":19:1:"),
    (lambda t: t.replace("[node]", "[node]\nnics = 8"), "unknown key 'node.nics'", ":11:1:"),
    (lambda t: t.replace("peak_tflops = 312", "peak_tflops = 312 312"), "not valid TOML", ":6:"),
    (lambda t: t.replace("fragmentation = 0.15", "fragmentation = 1"), "'memory.fragmentation' must be a number in "
     "[0, 1)", ":31:1:"),
    (lambda t: t.replace("reserved_gib = 1.0", "reserved_gib = -1"), "'memory.reserved_gib' must be a number in [0, 1e+15)",
     ":29:1:"),
    (lambda t: t.replace("fragmentation = 0.15", ""), "missing field 'memory.fragmentation'", ":28:1:"),
    (lambda t: t.replace("peak_tflops = 312", "peak_tflops = 312\nfp8_tn_only = 1"), "'gpu.fp8_tn_only' must be true "
     "or false, got 1", ":7:1:"),
    (lambda t: t.replace("latency_us = 10", "latency_us = 1" + "0" * 400), "'latency_us' is an integer of 401 digits "
     "(at most 40)", ":19:14:"),  # refused by schedc.inputs where it is written, before int() (an OverflowError once)
])
def test_a_bad_cluster_file_is_a_located_error_naming_the_field(tmp_path, edit, message, where):
    assert_bad_cluster_file(tmp_path, edit(A100.read_text()), message, where)


def test_the_hopper_files_say_their_fp8_gemms_take_only_tn_and_a_dump_keeps_it(tmp_path):
    """sm_90 takes FP8 GEMMs in the TN layout only, sm_100 (B200) in any (Transformer Engine's
    nvte_is_non_tn_fp8_gemm_supported); a file without the key says false."""
    from schedc.costmodel.specs import dump_cluster
    tn_only = {name: load_cluster(name).fp8_tn_only for name in ("dgx-h100-80gb", "dgx-h200-141gb", "dgx-h800-80gb",
                                                                 "dgx-b200-180gb", "dgx-a100-80gb")}
    assert tn_only == {"dgx-h100-80gb": True, "dgx-h200-141gb": True, "dgx-h800-80gb": True,
                       "dgx-b200-180gb": False, "dgx-a100-80gb": False}
    path = tmp_path / "again.toml"
    path.write_text(dump_cluster(load_cluster("dgx-h100-80gb")))
    assert load_cluster(str(path)).fp8_tn_only


def test_every_bad_cluster_field_is_reported_at_once(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(A100.read_text().replace("hbm_gbps = 2039", "").replace("gpus = 8", "gpus = 0"))
    result = _simulate("1f1b", "--model", _model(tmp_path), "--cluster", str(path))
    assert result.exit_code == 2
    assert "missing field 'gpu.hbm_gbps'" in result.output and "'node.gpus' must be" in result.output


def test_an_unknown_cluster_name_lists_the_library(tmp_path):
    result = _simulate("1f1b", "--model", _model(tmp_path), "--cluster", "dgx-b200")
    assert result.exit_code == 2 and "dgx-a100-80gb" in result.output


def test_layers_that_do_not_divide_over_the_stages_are_located_at_layers(tmp_path):
    path = _model(tmp_path, MODEL.replace("layers = 8", "layers = 6"))
    result = _simulate("interleaved_1f1b", "-D", "p=2", "-D", "v=2", "-D", "m=4", "--model", path,
                       "--cluster", "dgx-a100-80gb")
    assert result.exit_code == 2, result.output
    assert f"{path}:1:1: error: 'layers' (6) must be a multiple of the schedule's 4 stages" in result.output


def test_t_that_does_not_divide_the_heads_is_located_at_heads(tmp_path):
    path = _model(tmp_path, MODEL.replace("heads = 16", "heads = 4").replace("hidden = 1024", "hidden = 1032"))
    result = _simulate("1f1b", "-D", "p=2", "--model", path, "--cluster", "dgx-a100-80gb", "--tp", "8")
    assert result.exit_code == 2, result.output
    assert f"{path}:3:1: error: --tp 8 does not divide 'heads' (4)" in result.output


def test_heads_must_divide_hidden(tmp_path):
    path = _model(tmp_path, MODEL.replace("heads = 16", "heads = 24"))
    result = _simulate("1f1b", "--model", path, "--cluster", "dgx-a100-80gb")
    assert result.exit_code == 2 and f"{path}:3:1: error: 'heads' (24) must divide 'hidden'" in result.output


def test_a_batch_that_b_times_d_does_not_divide_is_refused(tmp_path):
    result = _simulate("1f1b", "--model", _model(tmp_path), "--cluster", "dgx-a100-80gb", "--dp", "8",
                       "--microbatch-size", "4", "--global-batch", "100")
    assert result.exit_code == 2
    assert "--global-batch 100 is not a multiple of --microbatch-size x --dp = 4 x 8 = 32" in result.output


@pytest.mark.parametrize("command", ["simulate", "compile"])
@pytest.mark.parametrize("option,value", [("--tp", "0"), ("--dp", "0"), ("--microbatch-size", "0"), ("--tp", "-1"),
                                          ("--dp", "-3"), ("--microbatch-size", "-2"), ("--global-batch", "0"),
                                          ("--global-batch", "-64")])
def test_zero_or_negative_sizes_are_refused_never_taken_as_one(tmp_path, command, option, value):
    out = ["-o", str(tmp_path / "out")] if command == "compile" else []
    result = CliRunner().invoke(main, [command, "1f1b", "-D", "p=2", "--model", _model(tmp_path), "--cluster",
                                       "dgx-a100-80gb", option, value, *out])
    assert result.exit_code == 2, result.output
    assert f"schedc: error: {option} must be a positive integer, got {value}" in result.output
    assert not (tmp_path / "out").exists()


def test_a_bad_model_file_names_every_bad_field(tmp_path):
    path = _model(tmp_path, "layers = 0\nhidden = 1024\nheads = 16\nseq = 'long'\nwidth = 3\n")
    result = _simulate("1f1b", "--model", path, "--cluster", "dgx-a100-80gb")
    assert result.exit_code == 2
    for expected in (f"{path}:5:1: error: unknown key 'width'", f"{path}:1:1: error: 'layers' must be a positive",
                     f"{path}:4:1: error: 'seq' must be a positive", "missing key 'vocab'"):
        assert expected in result.output


def test_a_model_size_past_the_bound_is_a_located_error(tmp_path):
    """A size of 10^400 (the fuzzer's) made a float overflow in the search: sizes are held to MAX_SIZE."""
    path = _model(tmp_path, "layers = 24\nhidden = 2304\nheads = 24\nseq = 1" + "0" * 400 + "\nvocab = 51200\n")
    result = CliRunner().invoke(main, ["tune", "--model", path, "--cluster", "dgx-a100-80gb", "--gpus", "4",
                                       "--global-batch", "16", "--schedules", "1f1b"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{path}:4:7: error: model description: 'seq' is an integer of 401 digits (at most 40)" in result.output


@pytest.mark.parametrize("args,message", [
    (["--tp", "2"], "--tp needs --cluster"),
    (["--cluster", "dgx-a100-80gb"], "--cluster needs a model description"),
    (["--cluster", "dgx-a100-80gb", "--model", "m.toml", "--costs", "c.json"], "without --costs or --profile"),
    (["--cluster", "dgx-a100-80gb", "--model", "m.toml", "-D", "m=8", "--global-batch", "32"],
     "-D m=8 disagrees with --global-batch 32"),
    (["--cluster", "dgx-a100-80gb", "--model", "m.toml", "--latency", "1"],  # was taken and dropped
     "--cluster derives each message's time from the cluster's links: give it without --latency"),
    (["--cluster", "dgx-a100-80gb", "--model", "m.toml", "--microbatch-size", "99999999999999999999"],
     "--microbatch-size 99,999,999,999,999,999,999 of sequence 512 (the model's seq or --seq) with this model: "
     "one F would take"),  # not a "measured F"
    (["--cluster", "dgx-a100-80gb", "--model", "m.toml", "--dp", "99999999999"],
     "t x p x d = 1 x 4 x 99,999,999,999 = 399,999,999,996 GPUs, more than the 1,048,576 a prediction takes"),
])
def test_cluster_options_that_do_not_fit_together_are_refused(tmp_path, monkeypatch, args, message):
    (tmp_path / "m.toml").write_text(MODEL)
    monkeypatch.chdir(tmp_path)  # the cases name the model file m.toml, relative to here
    result = _simulate("1f1b", *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_sequence_too_long_to_time_is_named_with_the_microbatch():
    result = _simulate("1f1b", "-D", "p=4", "-D", "m=8", "--model", "llama3.1-8b", "--seq", "99999999999999",
                       "--cluster", "dgx-h100-80gb")
    assert result.exit_code == 2, result.output
    assert "--microbatch-size 1 of sequence 99,999,999,999,999 (the model's seq or --seq)" in result.output


def test_m_follows_from_the_global_batch(tmp_path):
    result = _simulate("1f1b", "-D", "p=2", "--model", _model(tmp_path), "--cluster", "dgx-a100-80gb",
                       "--dp", "4", "--microbatch-size", "2", "--global-batch", "64", "--json")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["microbatches"] == 8 and stats["global_batch"] == 64 and stats["gpus"] == 8


def test_layout_microbatches():
    assert Layout(dp=4, microbatch_size=2, global_batch=64).microbatches() == 8
    assert Layout().microbatches() is None


def test_a_task_costs_its_declared_cost_in_forwards_of_its_stage(tmp_path):
    """task_in_forwards.sched declares `task t(s) = 5`: under --cluster each instance costs five of its
    stage's forwards in seconds (not 5 s), and the K-FAC add-on's `cost piece = 0.08` is 0.08 forwards."""
    from conftest import FIXTURES
    from schedc.driver.cluster import compile_on_cluster
    from schedc.layout import ClusterRequest
    request = ClusterRequest(_model(tmp_path), "dgx-a100-80gb", Layout())
    on = compile_on_cluster(str(FIXTURES / "compose" / "task_in_forwards.sched"), {}, request, lower=False)
    schedule = on.compiled.schedule
    forward = schedule.costs["F"]
    tasks = [op for step in schedule.steps for order in step for op in order if op.kind == "t"]
    assert len(tasks) == 2 and 0 < forward[0] < 0.1
    for op in tasks:
        assert op.cost == pytest.approx(5 * forward[op.stage], rel=1e-12)
    bare = compile_on_cluster("1f1b", {"p": "2", "m": "4"}, request, lower=False)
    assert on.prediction.iteration_s < bare.prediction.iteration_s + 10 * max(forward)
    kfac = compile_on_cluster("1f1b", {"p": "2"}, request, lower=False, addons=("kfac",)).compiled.schedule
    assert kfac.costs["piece"] == pytest.approx(tuple(0.08 * f for f in kfac.costs["F"]), rel=1e-12)



@pytest.mark.parametrize("edit,message", [
    (("hbm_gbps = 2039 ", "hbm_gbps = 1e-320 "), "'gpu.hbm_gbps' must be a number from 1e-06 to 1e+15, got 1e-320"),
    (("peak_tflops = 312 ", "peak_tflops = 5e-324 "), "'gpu.peak_tflops' must be a number from 1e-06 to 1e+15"),
    (("gemm = 0.85 ", "gemm = 1e-300 "), "'efficiency.gemm' must be a number in [1e-06, 1]"),
    (("reserved_gib = 1.0 ", "reserved_gib = 100 "),
     "'memory.reserved_gib' (100) must be less than the GPU's memory (80 GiB)"),
    (('name = "DGX A100 80GB, HDR InfiniBand"', "name = 5"), "'name' must be a string, got 5"),
])
def test_cluster_figures_that_would_make_every_time_infinite_are_refused(tmp_path, edit, message):
    """A figure of 1e-320 GB/s passed the positivity check and the search then ranked infinite
    iterations (and wrote NaN into its JSON): refused at its key, exit 2."""
    text = (ROOT / "schedc" / "clusters" / "dgx-a100-80gb.toml").read_text()
    assert edit[0] in text
    path = tmp_path / "c.toml"
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(SchedError) as caught:
        load_cluster(str(path))
    assert caught.value.exit_code == 2 and message in caught.value.render(), caught.value.render()


def test_a_cluster_prediction_refuses_a_model_of_another_dtype_than_the_peak(tmp_path):
    """dtype fp32 on the A100 file, whose peak is its bf16 one, was predicted at that peak with 32-bit
    messages (110 TFLOP/s per GPU; the A100's fp32 peak is 19.5): refused at the key for --cluster and
    tune. A cluster file whose [gpu] dtype is fp32 (a CPU calibration's) takes it."""
    path = tmp_path / "m.toml"
    path.write_text((ROOT / "schedc" / "models" / "gpt-1.7b.toml").read_text() + 'dtype = "fp32"\n')
    for args in (["simulate", "1f1b", "-D", "p=1", "--model", str(path), "--cluster", "dgx-a100-80gb"],
                 ["tune", "--model", str(path), "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "16"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and f"{path}:7:1: error: dtype 'fp32', but DGX A100 80GB, HDR InfiniBand's " \
            "peak_tflops is its bf16 peak" in result.output, result.output
    fp32 = tmp_path / "fp32.toml"
    fp32.write_text((ROOT / "schedc" / "clusters" / "dgx-a100-80gb.toml").read_text().replace("[gpu]", '[gpu]\ndtype = "fp32"'))
    assert load_cluster(str(fp32)).dtype == "fp32"
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=1", "--model", str(path), "--cluster", str(fp32)])
    assert result.exit_code == 0, result.output


def test_an_unknown_table_is_located_at_its_header(tmp_path):
    """A misspelt [memory] table was reported at 1:1 on a blank line; a top-level key is called a key."""
    text = (ROOT / "schedc" / "clusters" / "dgx-a100-80gb.toml").read_text()
    line = text.splitlines().index(next(x for x in text.splitlines() if x.startswith("[memory]"))) + 1
    path = tmp_path / "c.toml"
    path.write_text(text.replace("[memory]", "[memroy]"))
    with pytest.raises(SchedError) as caught:
        load_cluster(str(path))
    assert f"c.toml:{line}:1: error: unknown table 'memroy'" in caught.value.render()
    path.write_text("extra = 1\n" + text)
    with pytest.raises(SchedError) as caught:
        load_cluster(str(path))
    assert "c.toml:1:1: error: unknown key 'extra'" in caught.value.render()


def test_model_descriptions_are_a_library_found_by_name(tmp_path):
    """`--model gpt-175b` reads the shipped description, as `--cluster dgx-a100-80gb` does; a path is read
    as given; an unknown name's error lists the library."""
    from schedc.costmodel.specs import load_model_spec
    from schedc.descriptions import library_models
    assert {"gpt-175b", "gpt-1008b", "gpt-1.7b"} <= {p.stem for p in library_models()}
    assert load_model_spec("gpt-175b") == load_model_spec(str(ROOT / "schedc" / "models" / "gpt-175b.toml"))
    assert load_model_spec("gpt-1.7b.toml").layers == 24
    result = CliRunner().invoke(main, ["simulate", "1f1b", "--model", "gpt-nosuch", "--cluster", "dgx-a100-80gb"])
    assert result.exit_code == 2 and "(the library's: " in result.output and " gpt-1.7b," in result.output
