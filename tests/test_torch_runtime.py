"""torch's own runtime runs schedc's exports exactly: one torchrun launch (2 ranks, gloo, p = 2) runs
every exportable library schedule through torch's _PipelineScheduleRuntime from `schedc export` CSVs
(both formats, scale_grads True and False, FSDP2 for four of them), through schedc.torch.schedule,
and torch's own class where torch ships one, against one process's gradients."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedc.cli import main
from test_torch_csv import TORCH_EXPORTABLE

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow  # the module is one torchrun launch


def test_torchs_runtime_gives_one_process_gradients_for_every_export(tmp_path):
    for name in TORCH_EXPORTABLE:
        for fmt, flag in (("compute_only", "torch-csv"), ("compute_comms", "torch-comms")):
            result = CliRunner().invoke(main, ["export", name, "-D", "p=2", "-D", "m=4", "--format", flag,
                                               "-o", str(tmp_path / f"{name}__{fmt}.csv")])
            assert result.exit_code == 0, result.output
    out = tmp_path / "errors.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(HERE / "torch_runtime_worker.py"), str(tmp_path), str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)})
    assert run.returncode == 0, run.stderr[-4000:]
    errors = json.loads(out.read_text())
    assert len(errors) == 11 * 4 + 4 * 4 + 11 * 2 + 7
    bad = {case: e for case, e in errors.items() if not e <= 1e-5}
    assert bad == {}


FSDP_EXPORTS = ("1f1b", "zbv", "dualpipev")


def test_torchs_runtime_runs_the_zero_3_exports_under_fsdp2_on_a_2_by_2_mesh(tmp_path):
    """One 4-rank launch, a pp x dp mesh of 2 x 2: 1F1B, ZBV (split I/W) and DualPipeV (overlapped
    pairs) exported with --reshard-after-forward and --no-reshard-after-forward run by torch's
    _PipelineScheduleRuntime with every stage under FSDP2 over its data-parallel pair, each replica on its
    own microbatches: the gradients are one process's over both replicas' (rel <= 1e-5)."""
    for name in FSDP_EXPORTS:
        for mode, flag in (("reshard", "--reshard-after-forward"), ("kept", "--no-reshard-after-forward")):
            result = CliRunner().invoke(main, ["export", name, "-D", "p=2", "-D", "m=4", "--format", "torch-comms",
                                               flag, "-o", str(tmp_path / f"{name}__{mode}.csv")])
            assert result.exit_code == 0, result.output
    out = tmp_path / "errors.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
               str(HERE / "torch_fsdp_worker.py"), str(tmp_path), str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)})
    assert run.returncode == 0, run.stderr[-4000:]
    errors = json.loads(out.read_text())
    assert sorted(errors) == sorted(f"{n}__{m}" for n in FSDP_EXPORTS for m in ("reshard", "kept"))
    bad = {case: e for case, e in errors.items() if not e <= 1e-5}
    assert bad == {}
