"""Shared test helpers: the repository's paths, a compile helper over real .sched files, and the guard
that fails a test starting a launch (torchrun, a browser, pip) unless it is marked slow."""
from __future__ import annotations

import multiprocessing.util
import os
import shlex
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ROOT / "schedc" / "schedules"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # reference_orders and friends
# what a test must be marked slow for (pyproject.toml: the default run leaves those out): a command whose
# program or module is one of LAUNCHERS, or schedc with one of LAUNCHING_VERBS; mp.spawn's ranks too
LAUNCHERS = ("torchrun", "torch.distributed.run", "schedc.runtime", "schedc.runtime.process.launch", "pip",
             "chromium", "chromium-browser", "google-chrome")
LAUNCHING_VERBS = ("run", "demo", "calibrate")


def pytest_addoption(parser):
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="Rewrite the golden files under tests/golden/ from the current output.")


def launch_in(argv) -> str | None:
    """The launch a command line starts (its launcher, or `schedc VERB`), or None for a quick command."""
    words = shlex.split(argv) if isinstance(argv, str) else [os.fsdecode(word) for word in argv]
    names = [Path(word).name for word in words]
    for at, name in enumerate(names):
        if name in LAUNCHERS:
            return name
        if name in ("schedc", "schedc.cli") and names[at + 1:at + 2] and names[at + 1] in LAUNCHING_VERBS:
            return f"schedc {names[at + 1]}"
    return None


@contextmanager
def launches_refused(test: str):
    """While a test not marked slow runs (its fixtures too), a launch fails it, naming the command."""
    popen, spawn = subprocess.Popen.__init__, multiprocessing.util.spawnv_passfds

    def refuse(what: str):
        pytest.fail(f"{test} starts {what} but is not marked slow: mark it @pytest.mark.slow", pytrace=False)

    def guarded_popen(self, args, *rest, **kwargs):
        launch = launch_in(args)
        if launch:
            refuse(launch)
        popen(self, args, *rest, **kwargs)

    def guarded_spawn(path, args, passfds):
        refuse(f"a multiprocessing process ({path})")

    subprocess.Popen.__init__, multiprocessing.util.spawnv_passfds = guarded_popen, guarded_spawn
    try:
        yield
    finally:
        subprocess.Popen.__init__, multiprocessing.util.spawnv_passfds = popen, spawn


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    if item.get_closest_marker("slow"):
        yield
        return
    with launches_refused(item.nodeid):
        yield


@pytest.fixture
def regen_golden(request) -> bool:
    return request.config.getoption("--regen-golden")


def compile_library(name: str, **params):
    """Compile schedc/schedules/<name>.sched with params; returns schedc.passes.compiled.Compiled."""
    from schedc.driver import compile_source, read_source
    from schedc.frontend.elaborate import Options
    options = Options({k: str(v) for k, v in params.items()})
    return compile_source(read_source(SCHEDULES / f"{name}.sched"), options)


def assert_bad_cluster_file(tmp_path, text: str, message: str, where: str) -> None:
    """A cluster file of this text is a located usage error (exit 2) at `where` (":LINE:COL:") with the
    message, both when loaded and when `schedc simulate --cluster` reads it (no traceback)."""
    from click.testing import CliRunner
    from schedc.cli import main
    from schedc.costmodel.specs import load_cluster
    from schedc.diagnostics import SchedError
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SchedError) as caught:
        load_cluster(str(path))
    assert caught.value.exit_code == 2
    assert message in caught.value.render() and f"bad.toml{where}" in caught.value.render()
    model = tmp_path / "model.toml"
    model.write_text("layers = 8\nhidden = 1024\nheads = 16\nseq = 512\nvocab = 1024\n")
    result = CliRunner().invoke(main, ["simulate", "1f1b", "--model", str(model), "--cluster", str(path)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def compile_exchanging(name: str, replicas: bool = False, **params):
    """compile_library with every F, B, I and R issuing two ALL_TO_ALLs (an MoE layer's dispatch and
    combine: what costmodel.experts declares under --ep) in the plan, each over the op's rank (its
    lane), or with `replicas` over its stage's replica ranks (ir.Issued)."""
    import dataclasses
    from schedc.driver import build_schedule, compile_schedule, read_source
    from schedc.frontend.elaborate import Options
    from schedc.ir import Issued
    schedule = build_schedule(read_source(SCHEDULES / f"{name}.sched"), Options({k: str(v) for k, v in params.items()}))
    issued = tuple(Issued(kind, "ALL_TO_ALL", replicas=replicas) for kind in ("F", "B", "I", "R")
                   for _ in ("dispatch", "combine"))
    return compile_schedule(dataclasses.replace(schedule, collectives=issued))


def refusal(fixture: str):
    """The one diagnostic compiling tests/fixtures/<fixture> is refused with (a SchedError of one error)."""
    from schedc.diagnostics import SchedError
    from schedc.driver import compile_source, read_source
    with pytest.raises(SchedError) as caught:
        compile_source(read_source(FIXTURES / fixture))
    (diag,) = caught.value.diagnostics
    return diag
