"""demo: the README's main job compiles, renders and runs a library schedule on two CPU ranks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "schedc.cli", "demo", "-o", str(out), "--steps", "2",
                             "--layers", "2", "--hidden", "32", "--seq", "16", "--timeout", "60"],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bubble 0.2500" in result.stdout and "step     1  loss" in result.stdout
    for name in ("plan.json", "rank0.txt", "rank1.txt", "report.html", "simulated.json", "measured.json",
                 "measured-report.json"):
        assert (out / name).stat().st_size > 0, name
    ET.parse(out / "timeline.svg")
    ET.parse(out / "comparison.svg")
    trace = json.loads((out / "measured.json").read_text())
    ranks = {event["pid"] for event in trace["traceEvents"] if event.get("ph") == "X"}
    assert ranks == {0, 1}


def test_demo_refuses_zero_steps_before_it_compiles(tmp_path):
    from click.testing import CliRunner
    from schedc.cli import main
    result = CliRunner().invoke(main, ["demo", "--steps", "0", "-o", str(tmp_path / "demo")])
    assert result.exit_code == 2 and "'--steps': 0 is not in the range x>=1" in result.output
    assert not (tmp_path / "demo").exists()
