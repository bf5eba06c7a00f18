"""Packaging: the wheel carries the grammar, the schedule library and the runtime; it installs and runs."""
from __future__ import annotations

import subprocess
import sys
import venv
import zipfile

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(out), str(ROOT)], check=True)
    return next(out.glob("schedc-*.whl"))


@pytest.mark.slow
def test_wheel_holds_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "schedc/grammars/sched.lark" in names
    for schedule in ("gpipe", "1f1b", "interleaved_1f1b", "chimera", "addons/kfac"):
        assert f"schedc/schedules/{schedule}.sched" in names
    assert "schedc/runtime/__init__.py" in names and "schedc/runtime/__main__.py" in names
    assert {"schedc/render/templates/report.html.j2", "schedc/render/templates/memory.svg.j2"} <= names
    assert {"schedc/clusters/dgx-a100-80gb.toml", "schedc/clusters/dgx-h100-80gb.toml"} <= names


@pytest.mark.slow
def test_installed_wheel_compiles_a_library_schedule(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # a non-editable install of exactly the wheel's files
    code = ("import schedc.frontend.parse, schedc.frontend.library as l; print(schedc.frontend.parse.__file__); "
            "print(len(l.library_files()))")
    out = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.split()
    assert out[0].startswith(site)
    assert int(out[1]) >= 4
    result = subprocess.run([str(python), "-I", "-m", "schedc.cli", "compile", "chimera", "-o",
                             str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "plan.json").exists()
    composed = subprocess.run([str(python), "-I", "-m", "schedc.cli", "compile", "1f1b", "--with", "kfac", "-o",
                               str(tmp_path / "kfac")], capture_output=True, text=True, cwd=tmp_path)
    assert composed.returncode == 0, composed.stderr  # the add-on ships in the wheel


def test_extras_name_what_the_runtime_and_the_benchmarks_import():
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert "torch" in extras["runtime"] and "scikit-learn" in extras["benchmarks"]
    assert "torch" not in " ".join(project["dependencies"])  # the compiler never needs it
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    # torch==2.13.0 (the CPU build) is installed where torch is missing, before the extras that name it
    assert setup.index("torch==2.13.0") < setup.index('.[runtime,test,benchmarks]')
    benchmarks = " ".join(p.read_text() for p in (ROOT / "benchmarks").glob("*.py"))
    assert ("sklearn" in benchmarks) == ("scikit-learn" in extras["benchmarks"])
