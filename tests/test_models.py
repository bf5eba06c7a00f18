"""models: the user-model contract of docs/models.md, held by its example (examples/mlp_model.py).
`schedc run --reference` trains it in one process; two ranks of a 2-stage plan with selective
recomputation of its declared core, and two tensor ranks of its declared parallel pieces, give the
reference's losses (the numerical contract: a schedule, a recomputation or a tensor split changes
no loss beyond float noise)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import ROOT
from schedc.cli import main

EXAMPLES = ROOT / "examples"
SIZES = ["--layers", "2", "--hidden", "32", "--seq", "16", "--mb-size", "2", "--steps", "2", "--quiet"]
CODE = ["--model-code", "mlp_model:build"]


def _plan(tmp_path, p: int) -> str:
    out = tmp_path / f"plan{p}"
    assert CliRunner().invoke(main, ["compile", "1f1b", "-D", f"p={p}", "-D", "m=4", "-o", str(out)]).exit_code == 0
    return str(out / "plan.json")


def _losses(path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


@pytest.fixture
def reference(tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLES)  # `schedc run` imports user code from the current directory
    monkeypatch.syspath_prepend(str(EXAMPLES))
    metrics = tmp_path / "reference.jsonl"
    result = CliRunner().invoke(main, ["run", _plan(tmp_path, 2), *CODE, *SIZES, "--reference",
                                       "--metrics-out", str(metrics)])
    assert result.exit_code == 0, result.output
    return _losses(metrics)


def _torchrun(plan: str, nproc: int, *options: str) -> subprocess.CompletedProcess:
    from schedc.runtime.process.launch import torchrun_command
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(EXAMPLES), str(ROOT), *sys.path])}
    return subprocess.run(torchrun_command(plan, nproc, [*CODE, *SIZES, "--timeout", "60", *options]),
                          capture_output=True, text=True, env=env, timeout=300, cwd=str(EXAMPLES))


def test_the_example_model_trains_under_the_reference(reference):
    import math
    assert len(reference) == 2 and all(math.isfinite(x) for x in reference)
    assert abs(reference[0] - math.log(256)) < 1.0  # a fresh model is near uniform over the 256 bytes


@pytest.mark.slow
@pytest.mark.parametrize("p,extra", [(2, ["--recompute", "selective"]), (1, ["--tp", "2"])], ids=["pipeline", "tensor"])
def test_the_example_model_matches_the_reference_split_over_ranks(reference, tmp_path, p, extra):
    metrics = tmp_path / "run.jsonl"
    run = _torchrun(_plan(tmp_path, p), 2, *extra, "--metrics-out", str(metrics))
    assert run.returncode == 0, run.stderr
    assert _losses(metrics) == pytest.approx(reference, rel=1e-5)
