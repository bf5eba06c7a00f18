"""hardening, round three: a test per defect the fuzz run (benchmarks/fuzz_cli.py, docs/hardening.md)
found, each refused before any process starts or bounded."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedc.cli import main

RUN = ["--steps", "1", "--layers", "4", "--hidden", "8", "--heads", "1", "--seq", "8", "--mb-size", "1",
       "--vocab", "256", "--threads", "1", "--quiet"]


def _plan(tmp_path: Path) -> str:
    out = tmp_path / "plan"
    result = CliRunner().invoke(main, ["compile", "1f1b", "-D", "p=2", "-D", "m=2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return str(out / "plan.json")


@pytest.mark.parametrize("reference", [False, True])
def test_device_cuda_on_a_machine_without_cuda_is_refused_before_launch(tmp_path, reference):
    """--device cuda where this machine has no CUDA: each rank refused it after torchrun started."""
    import torch
    from schedc.runtime.process.launch import LaunchError, check_launch
    plan = _plan(tmp_path)
    options = [*RUN, "--device", "cuda", *(["--reference"] if reference else [])]
    if torch.cuda.is_available():  # a GPU machine: the same options pass the check
        check_launch(plan, None, options, [])
        return
    with pytest.raises(LaunchError, match="--device cuda, but CUDA is not available on this machine"):
        check_launch(plan, None, options, [])
    if not reference:  # on several machines (torchrun's own rendezvous) the ranks' machines decide
        check_launch(plan, 1, options, ["--nnodes", "2", "--rdzv-endpoint", "h:1"])


def test_tune_of_a_schedule_compiled_whole_is_held_to_a_budget():
    """`tune --schedules offload_1f1b` for GPT-3 175B on 1,024 GPUs compiled 6,360 candidates whole (132 s
    of CPU): refused at once, naming the limit and how to narrow the search; narrowed, it is searched."""
    import time
    from schedc.budget import TUNE_WHOLE, TUNE_WHOLE_UNITS
    from schedc.cli.tune import refuse_whole
    from schedc.diagnostics import SchedError
    from schedc.search.space import Candidate
    args = ["tune", "--model", "gpt-175b", "--cluster", "dgx-a100-80gb", "--gpus", "1024", "--global-batch", "1536",
            "--schedules", "offload_1f1b"]
    started = time.process_time()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and time.process_time() - started < 5
    assert "offload_1f1b: the search would compile whole 6,360 candidates, past the limit of 600" in result.output
    assert "--tp, --pp" in result.output
    one = Candidate("offload_1f1b", 1, 2, 4, None, 1, 8, "none", 1, 0, 1)  # 16 stage-microbatches
    refuse_whole([one] * TUNE_WHOLE.limit, ["offload_1f1b"])  # at both limits: searched
    with pytest.raises(SchedError, match="601 candidates, past the limit of 600"):
        refuse_whole([one] * (TUNE_WHOLE.limit + 1), ["offload_1f1b"])
    big = Candidate("offload_1f1b", 8, 16, 8, None, 1, TUNE_WHOLE_UNITS.limit // 16 + 1, "none", 1, 0, 1)
    with pytest.raises(SchedError, match="stage-microbatches, past the limit of 60,000"):
        refuse_whole([big], ["offload_1f1b"])
    refuse_whole([big], ["1f1b"])  # a schedule not compiled whole is not counted


@pytest.mark.parametrize("seed", ["99999999999999999999999", str(2 ** 63), str(-2 ** 63 - 1)])
def test_a_seed_past_64_bits_is_refused_before_launch(tmp_path, seed):
    """--seed 99999999999999999999999: rank 0 failed after torchrun started (ValueError: Overflow when
    unpacking long long); torch's generators take 64 bits."""
    from schedc.runtime.process.launch import LaunchError, check_launch
    plan = _plan(tmp_path)
    with pytest.raises(LaunchError, match="--seed must fit in 64 bits"):
        check_launch(plan, None, [*RUN, "--seed", seed], [])
    check_launch(plan, None, [*RUN, "--seed", str(2 ** 63 - 1)], [])


def test_metrics_out_in_a_missing_folder_makes_it(tmp_path):
    """--metrics-out missing/x.json passed the check (a missing folder is made, as for every output)
    and rank 0 failed writing it after training (FileNotFoundError)."""
    from types import SimpleNamespace
    from schedc.runtime.model.readings import log_step
    path = tmp_path / "missing" / "deeper" / "x.json"
    opts = SimpleNamespace(quiet=True, metrics_out=str(path), first_step=0)
    log_step(opts, 0, 2.5, 0.5, 100)
    log_step(opts, 1, 2.0, 0.5, 100)
    lines = path.read_text().splitlines()
    assert [line.split(",")[0] for line in lines] == ['{"step": 0', '{"step": 1']


@pytest.mark.parametrize("key, value", [("model_type", []), ("model_type", {"a": 1}), ("torch_dtype", []),
                                        ("torch_dtype", 16)])
def test_a_config_json_key_of_the_wrong_type_is_a_located_error(tmp_path, key, value):
    """A config.json whose model_type is a list was a traceback (unhashable type: 'list'), as was a
    torch_dtype that is no string: located errors, exit 2, in every reader."""
    import json
    from schedc.runtime.process.options import OptionError, parse_options
    root = Path(__file__).parent / "data" / "hf" / "tiny-llama" / "config.json"
    config = {**json.loads(root.read_text()), key: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=1))
    result = CliRunner().invoke(main, ["check", "1f1b", "--model", str(path), "--microbatch-size", "1", "--seq", "16"])
    assert result.exit_code == 2 and re.search(rf"{path}:\d+:\d+: error: .*{key}", result.output), result.output
    with pytest.raises(OptionError, match=key):
        parse_options([str(tmp_path / "plan.json"), "--model", str(path), "--seq", "16"])


@pytest.mark.parametrize("folder", ["--save", "--save-grads"])
@pytest.mark.parametrize("output", ["--profile-out", "--report-out", "--trace-out", "--metrics-out"])
def test_an_output_file_on_an_output_folders_path_is_refused_before_launch(tmp_path, folder, output):
    """--save missing/x.json --profile-out missing/x.json: the ranks made the folder and failed writing
    the file after training (`is a directory`)."""
    from schedc.runtime.process.launch import LaunchError, check_launch
    plan = _plan(tmp_path)
    path = str(tmp_path / "missing" / "x.json")
    with pytest.raises(LaunchError, match=f"{output} {path} and {folder} {path} name one path"):
        check_launch(plan, None, [*RUN, folder, path, output, path], [])
    check_launch(plan, None, [*RUN, folder, path, output, str(tmp_path / "y.json")], [])
