# scripts/gpu_check.sh --dry-run: on a machine without a GPU it exits 0, lists every step of the first
# GPU checks (exactness in fp32 and bf16 for each plan, the stream-race checks, tokens/s with and
# without --report-out, the 1.7B first step and memory) and parses each run's runtime options.
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANS = ("1f1b", "zb_h1", "dualpipev", "offload_1f1b", "interleaved_1f1b_recompute")


def test_the_dry_run_lists_every_step_and_parses_their_options(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    steps = re.findall(r"^\[\d+\] (\w+) \(at most \d+s\): ", run.stdout, re.MULTILINE)
    want = [*(f"compile_{p}" for p in PLANS), *(f"exact_{d}_{p}" for p in PLANS for d in ("fp32", "bf16", "bf16main")),
            *(f"{k}_{p}" for p in ("dualpipev", "offload_1f1b")
              for k in ("sanitizer", "grads_async", "grads_blocking", "bitwise")),
            "tokens_plain", "tokens_report", "tokens_main", "tokens_compare", "large_first_step", "large_memory"]
    assert steps == want
    assert "TORCH_CUDA_SANITIZER=1" in run.stdout and "CUDA_LAUNCH_BLOCKING=1" in run.stdout
    assert "the runtime's options of 21 runs parse" in run.stdout
    assert not (tmp_path / "out").exists()  # nothing run, nothing written
