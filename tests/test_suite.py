"""The suite itself: the default run is quick because a test that starts a launch (torchrun, a rank, a
launching verb, a browser, pip, mp.spawn) is marked slow; tests/conftest.py fails one that is not, before
the process starts, naming the command."""
from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

from conftest import launch_in

TORCHRUN = [sys.executable, "-m", "schedc.runtime.process.launch", "--standalone", "--nproc-per-node", "2",
            "-m", "schedc.runtime", "plan.json", "--steps", "1"]


@pytest.mark.parametrize("argv,launch", [
    (TORCHRUN, "schedc.runtime.process.launch"),
    ([sys.executable, "-m", "schedc.runtime", "plan.json", "--reference"], "schedc.runtime"),
    (["/usr/bin/torchrun", "--nproc-per-node", "2", "train.py"], "torchrun"),
    ([sys.executable, "-m", "schedc.cli", "run", "plan.json", "--nproc", "2"], "schedc run"),
    (["schedc", "demo", "-o", "out"], "schedc demo"),
    ("schedc calibrate -o cpu.toml --quick", "schedc calibrate"),
    ([sys.executable, "-m", "pip", "wheel", "--no-deps", "."], "pip"),
    (["/usr/bin/chromium", "--headless", "--screenshot=shot.png", "file:///r.html"], "chromium"),
    ([sys.executable, "-m", "schedc.cli", "compile", "1f1b", "-o", "out"], None),
    ([sys.executable, "-m", "schedc.cli", "render", "run.sched", "-o", "run.svg"], None),
    (["dot", "-Tsvg", "plan.dot"], None),
    ([sys.executable, "-c", "import schedc.cli"], None),
])
def test_launches_are_told_from_quick_commands(argv, launch):
    assert launch_in(argv) == launch


def test_a_test_not_marked_slow_cannot_start_torchrun():
    with pytest.raises(pytest.fail.Exception) as caught:
        subprocess.run(TORCHRUN, capture_output=True)
    assert "starts schedc.runtime.process.launch but is not marked slow: mark it @pytest.mark.slow" in str(caught.value)
    assert "test_suite.py::test_a_test_not_marked_slow_cannot_start_torchrun" in str(caught.value)


def test_a_test_not_marked_slow_cannot_spawn_ranks():
    process = multiprocessing.get_context("spawn").Process(target=print)
    with pytest.raises(pytest.fail.Exception) as caught:
        process.start()
    assert "starts a multiprocessing process" in str(caught.value)


def test_a_quick_command_runs_as_it_would_without_the_guard():
    done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True, check=True)
    assert done.stdout == "42\n"
