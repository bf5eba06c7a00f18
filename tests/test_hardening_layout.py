"""hardening, round four: a test per defect the fuzz run of the layout's newest options, config.json
descriptions and cluster tables (tests/fuzz_layout.py, docs/hardening.md) found: each refused with a
usage error naming why (exit 2), or answered as simulate answers it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedc.cli import main

ROOT = Path(__file__).resolve().parent.parent
MIXTRAL = str(ROOT / "tests" / "data" / "hf" / "tiny-mixtral" / "config.json")
TUNE = ["tune", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "64", "--schedules", "1f1b"]


def _invoke(argv: list[str]):
    result = CliRunner().invoke(main, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize("argv, message", [
    (["--model", MIXTRAL, "--seq", "16", "--recompute", "selective-ops"], "not with experts"),
    (["--model", "llama3.1-8b", "--recompute", "selective-ops", "--tp", "2"], "not with --tp 2 without --sequence"),
    (["--model", "llama3.1-8b", "--recompute", "selective-ops", "--fp8", "--eager"], "not with --fp8 with --eager"),
    (["--model", "gpt-1.7b", "--eager"], "--eager is torchtitan's Llama block"),
    (["--model", "mixtral-8x7b", "--ep", "3"], "--ep 3 does not divide the model's 8 experts"),
    (["--model", "mixtral-8x7b", "--etp", "0"], "--etp must be a positive integer, got 0"),
    (["--model", "mixtral-8x7b", "--etp", "3", "--gpus", "8"], "--etp 3 x --ep 1 = 3 does not divide t x cp x d"),
    (["--model", "gpt-1.7b", "--etp", "2"], "--etp 2: the model has no experts to split"),
    (["--model", "gpt-1.7b", "--ep", "2"], "--ep 2: the model has no experts to place"),
    (["--model", "gpt-1.7b", "--moe-dispatcher", "flex"], "--moe-dispatcher flex: the model has no experts"),
])
def test_tune_refuses_a_form_simulate_refuses_at_every_layout(argv, message):
    """tune of an MoE model under --recompute selective-ops raised KeyError: 'selective-ops' (the experts'
    parts have no such form); over a dense model at t = 2 without sequence parallelism, or with --eager over
    GPT or at t = 2, it ranked and printed commands simulate refuses. --etp of 0 raised ZeroDivisionError; --ep and --etp
    that no layout takes (an ep not dividing the experts, etp x ep not dividing t x cp x d, a dense model)
    were ranked and printed as simulate commands that simulate refuses."""
    result = _invoke([*TUNE, *argv])
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize("argv", [["--model", "llama3.1-8b", "--recompute", "selective-ops,full", "--tp", "1,2"],
                                  ["--model", "llama3.1-8b", "--eager", "--tp", "1,2"],
                                  ["--model", "llama3.1-8b", "--eager"], ["--model", "mixtral-8x7b", "--ep", "1,2,3"],
                                  ["--model", "mixtral-8x7b", "--etp", "2", "--tp", "2"],
                                  ["--model", "mixtral-8x7b", "--moe-dispatcher", "flex"]])
def test_tune_searches_a_value_only_where_simulate_takes_it(argv):
    """selective-ops is modelled at t = 1 or with sequence parallelism, --eager at t = 1, an ep must divide
    the experts and d x cp (with --etp, etp x ep divides t x cp x d): tune's candidates elsewhere leave the
    value out, and every command it prints, simulate runs (exit 0)."""
    result = _invoke([*TUNE, *argv])
    assert result.exit_code == 0, result.output
    printed = re.findall(r"^  schedc (simulate .*)$", result.output, re.M)
    assert printed
    for line in printed:
        if "--eager" in line or ("selective-ops" in line and "--sequence-parallel" not in line):
            assert "--tp 1 " in line, line
        simulated = _invoke(line.split())
        assert simulated.exit_code == 0, (line, simulated.output)


def test_simulate_refuses_a_token_dispatcher_without_experts():
    """--moe-dispatcher over a dense model was taken and ignored (the same prediction as without it), as
    --ep and --etp there are not."""
    result = _invoke(["simulate", "1f1b", "--cluster", "dgx-h100-80gb", "--model", "gpt-1.7b", "--global-batch",
                      "64", "-D", "p=4", "--moe-dispatcher", "alltoall"])
    assert result.exit_code == 2 and "--moe-dispatcher alltoall: the model has no experts" in result.output, result.output


@pytest.mark.parametrize("edit, key", [("forward_tflops = [5000, 574, 617, 609, 600, 595]", "forward_tflops"),
                                       ("backward_tflops = [305, 408, 465, 499, 518, 990]", "backward_tflops"),
                                       ("measured_peak_tflops = 600", "forward_tflops")])
def test_an_attention_rate_past_the_gpus_peak_is_a_located_error(tmp_path, edit, key):
    """A flash kernel's rate above the 16-bit peak of the GPU measured (measured_peak_tflops, else [gpu]
    peak_tflops) was taken: a forward of 5,000 TFLOP/s on a GPU of 989 made the causal backward (the
    unmasked one scaled by causal over unmasked) slower and the iteration 1.7 times longer."""
    text = (ROOT / "schedc" / "clusters" / "dgx-h100-80gb.toml").read_text()
    name = edit.split(" =")[0]
    lines = [edit if line.startswith(name + " ") else line for line in text.splitlines()]
    (tmp_path / "c.toml").write_text("\n".join(lines) + "\n")
    line = next(n for n, text in enumerate(lines, 1) if text.startswith(key + " "))
    result = _invoke(["simulate", "1f1b", "--cluster", str(tmp_path / "c.toml"), "--model", "llama3.1-8b",
                      "--global-batch", "64", "-D", "p=4"])
    assert result.exit_code == 2, result.output
    assert f"c.toml:{line}:1: error: 'attention.{key}' reaches" in result.output, result.output


def _reading(command: str, tmp_path, model: str) -> list[str]:
    """The command line by which `simulate --cluster` or `run --reference` (on a compiled 1F1B plan) reads
    the model description."""
    if command == "simulate":
        return ["simulate", "1f1b", "--cluster", "dgx-h100-80gb", "--model", model, "--seq", "16", "--global-batch",
                "16", "-D", "p=2"]
    plan = _invoke(["compile", "1f1b", "-D", "p=2", "-D", "m=2", "-o", str(tmp_path / "plan")])
    assert plan.exit_code == 0, plan.output
    return ["run", str(tmp_path / "plan" / "plan.json"), "--model", model, "--seq", "16", "--steps", "1", "--reference"]


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_a_config_whose_mlp_is_not_swiglu_is_refused_at_hidden_act(tmp_path, command):
    """A llama-family config.json with hidden_act "gelu" (or 3) was read as SwiGLU, predicted and trained as
    one: the description said otherwise. Refused at the key by every reader, before any process starts."""
    config = json.loads((ROOT / "tests" / "data" / "hf" / "tiny-llama" / "config.json").read_text())
    config["hidden_act"] = "gelu"
    text = json.dumps(config, indent=1)
    (tmp_path / "config.json").write_text(text)
    line = text.splitlines().index(' "hidden_act": "gelu",') + 1
    result = _invoke(_reading(command, tmp_path, str(tmp_path / "config.json")))
    assert result.exit_code == 2, result.output
    assert f"config.json:{line}:2: error: 'hidden_act' 'gelu'" in result.output, result.output


@pytest.mark.parametrize("config, key, value", [("hf/tiny-mixtral", "sliding_window", 4096),
                                                ("hf_moe/qwen3-30b-a3b", "use_sliding_window", True),
                                                ("hf_moe/qwen1.5-moe-a2.7b", "use_sliding_window", True)])
def test_a_sliding_window_of_a_mixture_is_refused_at_its_key(tmp_path, config, key, value):
    """Mixtral's sliding_window and Qwen2-MoE's and Qwen3-MoE's use_sliding_window (windowed attention in
    their transformers code) were ignored: the model predicted and trained with attention over the whole
    sequence. Refused at the key; null and false (every shipped config) read as before."""
    obj = json.loads((ROOT / "tests" / "data" / config / "config.json").read_text())
    obj[key] = value
    text = json.dumps(obj, indent=1)
    (tmp_path / "config.json").write_text(text)
    line = next(n for n, row in enumerate(text.splitlines(), 1) if row.startswith(f' "{key}"'))
    argv = ["check", "1f1b", "--model", str(tmp_path / "config.json"), "--seq", "64", "--microbatch-size", "1"]
    result = _invoke(argv)
    assert result.exit_code == 2, result.output
    assert f"config.json:{line}:2: error: '{key}' {json.dumps(value)}: schedc models" in result.output, result.output
    obj[key] = None if key == "sliding_window" else False
    (tmp_path / "config.json").write_text(json.dumps(obj, indent=1))
    assert "config.json" not in _invoke(argv).output


@pytest.mark.parametrize("value", ["1" + "0" * 400, "1e400"])
@pytest.mark.parametrize("command", ["simulate", "run"])
def test_a_norm_or_rope_number_past_its_bound_is_a_located_error(tmp_path, value, command):
    """A config.json's rope_theta of 400 digits raised OverflowError in the runtime's reader (`run
    --reference`), and one of 1e400 (infinity) was taken by every reader: held to 2^40 at its key."""
    config = json.loads((ROOT / "tests" / "data" / "hf" / "tiny-llama" / "config.json").read_text())
    config["rope_theta"] = "@"
    text = json.dumps(config, indent=1).replace('"@"', value)
    (tmp_path / "config.json").write_text(text)
    line = next(n for n, row in enumerate(text.splitlines(), 1) if row.startswith(' "rope_theta"'))
    result = _invoke(_reading(command, tmp_path, str(tmp_path / "config.json")))
    assert result.exit_code == 2, result.output
    assert f"config.json:{line}:" in result.output and "'rope_theta'" in result.output, result.output


def _iteration(schedule: str, *extra: str) -> float:
    result = _invoke(["simulate", schedule, "--cluster", "dgx-h100-80gb", "--model", "llama3.1-8b", "--global-batch",
                      "16", "--microbatch-size", "1", "-D", "p=4", "--dp", "2", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["iteration_s"]


def test_post_validation_repeats_overlapped_pairs():
    """--post-validation of combined_1f1b (F&B pairs overlapped) raised KeyError in the simulator: the
    repeated step's pairs named ops the repeated orders did not hold. Each pair is now the orders' own
    ops, and the steady step is no longer than one step alone."""
    import schedc
    from schedc.driver.post_validation import repeat_steps
    from schedc.frontend.library import resolve
    schedule = schedc.compile_file(str(resolve("combined_1f1b")), ["p=4", "m=8"]).schedule
    assert schedule.fused
    twice = repeat_steps(schedule)
    placed = {id(op) for order in twice.orders for op in order}
    assert len(twice.fused) == 2 * len(schedule.fused)
    assert all(id(f) in placed and id(b) in placed for f, b in twice.fused)
    assert 0 < _iteration("combined_1f1b", "--post-validation") <= _iteration("combined_1f1b")
