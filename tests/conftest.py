"""Shared test helpers: the repository's paths and a compile helper over real .sched files."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ROOT / "schedc" / "schedules"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # reference_orders and friends


def pytest_addoption(parser):
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="Rewrite the golden files under tests/golden/ from the current output.")


@pytest.fixture
def regen_golden(request) -> bool:
    return request.config.getoption("--regen-golden")


def compile_library(name: str, **params):
    """Compile schedc/schedules/<name>.sched with params; returns schedc.compiled.Compiled."""
    from schedc.driver import compile_source, read_source
    from schedc.frontend.elaborate import Options
    options = Options({k: str(v) for k, v in params.items()})
    return compile_source(read_source(SCHEDULES / f"{name}.sched"), options)


def refusal(fixture: str):
    """The one diagnostic compiling tests/fixtures/<fixture> is refused with (a SchedError of one error)."""
    from schedc.diagnostics import SchedError
    from schedc.driver import compile_source, read_source
    with pytest.raises(SchedError) as caught:
        compile_source(read_source(FIXTURES / fixture))
    (diag,) = caught.value.diagnostics
    return diag
