"""hardening, round three: a test per defect the fuzz run (benchmarks/fuzz_cli.py, docs/hardening.md)
found, each refused before any process starts or bounded."""
from __future__ import annotations

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
