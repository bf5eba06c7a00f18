"""docs: docs/internals.md's layout names every module of the tree (its file name and each folder it
lies in) and no module that is gone; README.md stays a short guide that links every docs/ page, shows
only pictures that exist (each under 200 KB) and links only sections of docs/benchmarks.md that exist;
neither it nor the measurement record carries development history (commit hashes, "this session",
"the issue")."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def _layout_block() -> str:
    text = (ROOT / "docs" / "internals.md").read_text()
    section = text[text.index("## Layout"):]
    start = section.index("```") + 3
    return section[start:section.index("```", start)]


def _modules() -> list[Path]:
    return sorted(p.relative_to(ROOT / "schedc") for p in (ROOT / "schedc").rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts)


def test_internals_names_every_module_and_its_folders():
    block = _layout_block()
    names = set(re.findall(r"\b\w+\.py\b", block))
    folders = set(re.findall(r"\b(\w+)/", block))
    missing = [str(m) for m in _modules() if m.name not in names or not set(m.parts[:-1]) <= folders]
    assert missing == []


def test_internals_names_no_module_that_is_gone():
    block = _layout_block()
    present = {p.name for p in (ROOT / "schedc").rglob("*.py")}
    assert sorted(set(re.findall(r"\b\w+\.py\b", block)) - present) == []


README = ROOT / "README.md"
RECORDS = [README, ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "hardening.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a word of 7 to 40 hex digits with at least one digit and one letter: an abbreviated or full commit hash
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.IGNORECASE)
HISTORY = re.compile(r"\b(this session|the issue)\b", re.IGNORECASE)


def _links(path: Path) -> list[str]:
    return LINK.findall(path.read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_a_short_guide():
    assert len(README.read_text().splitlines()) <= 250


def test_readme_links_every_docs_page():
    linked = {link.split("#")[0] for link in _links(README)}
    pages = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
    assert pages and [page for page in pages if page not in linked] == []


def test_every_picture_of_the_docs_exists_and_is_small():
    pictures = [(doc.parent / link).resolve() for doc in [README, *(ROOT / "docs").glob("*.md")]
                for link in _links(doc) if link.endswith((".png", ".svg"))]
    assert any(p.parent == ROOT / "docs" / "images" for p in pictures)
    missing = [str(p) for p in pictures if not p.is_file()]
    large = [str(p) for p in pictures if p.is_file() and p.stat().st_size >= 200 * 1024]
    assert missing == [] and large == []


def test_readme_links_existing_sections_of_the_measurements():
    record = (ROOT / "docs" / "benchmarks.md").read_text()
    anchors = {_slug(line.lstrip("#")) for line in record.splitlines() if line.startswith("#")}
    wanted = [link.split("#", 1)[1] for link in _links(README) if link.startswith("docs/benchmarks.md#")]
    assert len(wanted) >= 5 and [anchor for anchor in wanted if anchor not in anchors] == []


def test_the_patterns_catch_history():
    assert COMMIT.search("on the tree of commit e4f4db1") and not COMMIT.search("1,725 tests, 65536 ops")
    assert not COMMIT.search("defaced") and HISTORY.search("as This session measured")


def test_readme_and_the_record_carry_no_development_history():
    found = [(path.name, match.group(0)) for path in RECORDS
             for match in [*COMMIT.finditer(path.read_text()), *HISTORY.finditer(path.read_text())]]
    assert found == []


# The public API and the docs' Python ------------------------------------------------------------------

def test_every_public_name_imports_from_outside_the_checkout(tmp_path):
    """A clean interpreter in another directory, the tree on its path only: `from schedc import NAME`
    for each name of schedc.__all__, each the object its defining module holds."""
    script = ("import importlib, schedc\n"
              "for name in schedc.__all__:\n"
              "    exec(f'from schedc import {name}')\n"
              "    home = importlib.import_module('schedc.' + schedc._HOMES[name])\n"
              "    assert getattr(schedc, name) is getattr(home, name), name\n"
              "print(len(schedc.__all__), schedc.__file__)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    count, where = done.stdout.split()
    assert int(count) >= 4 and Path(where) == ROOT / "schedc" / "__init__.py"


def _python_blocks() -> list[tuple[str, int, str]]:
    """Every ```python block of README.md and docs/*.md: (file, its first line, its text)."""
    blocks = []
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        lines = doc.read_text().splitlines()
        starts = [i for i, line in enumerate(lines) if line.strip() == "```python"]
        for start in starts:
            end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
            blocks.append((str(doc.relative_to(ROOT)), start + 1, "\n".join(lines[start + 1:end]) + "\n"))
    return blocks


BLOCKS = _python_blocks()
PLAIN = [b for b in BLOCKS if "torch.distributed" not in b[2]]
DISTRIBUTED = [b for b in BLOCKS if "torch.distributed" in b[2]]


def test_the_docs_have_python_of_both_kinds():
    assert any(doc == "README.md" for doc, _, _ in PLAIN) and [doc for doc, _, _ in DISTRIBUTED] == ["docs/torch.md"]


@pytest.mark.parametrize("doc, line, code", PLAIN, ids=[f"{d}:{n}" for d, n, _ in PLAIN])
def test_a_python_snippet_of_the_docs_runs(doc, line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{doc}:{line}", "exec"), {"__name__": "__snippet__"})


@pytest.mark.slow
@pytest.mark.parametrize("doc, line, code", DISTRIBUTED, ids=[f"{d}:{n}" for d, n, _ in DISTRIBUTED])
def test_a_distributed_snippet_of_the_docs_runs_on_two_ranks(doc, line, code, tmp_path):
    """The snippet after tests/fixtures/doc_torch_prelude.py (the names it takes as given), on two
    torchrun ranks; the rank holding the last stage reports a finite loss for each microbatch."""
    prelude = (ROOT / "tests" / "fixtures" / "doc_torch_prelude.py").read_text()
    report = "\nif losses:\n    print('losses', len(losses), all(bool(torch.isfinite(x)) for x in losses))\n" \
             "dist.destroy_process_group()\n"
    script = tmp_path / "snippet.py"
    script.write_text(prelude + code + report)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "losses 8 True" in done.stdout


# Every function, class and constant docs/internals.md names in code (`driver.passes.PASSES`,
# `simulate.order_makespan(...)`) exists: read from under schedc (or a package of it, where the text
# names a module by its own name: `queues.DeviceQueues`); the few names of other libraries and of
# local values in the text are listed here.
NOT_SCHEDC = {"dataclasses.replace", "pytest.mark.slow", "main.command", "opts.layout"}
FILE_NAME = re.compile(r"\.(py|md|txt|lark|sh|json|csv|toml)$")
PACKAGES = ("", "frontend.", "runtime.", "costmodel.", "search.", "driver.", "checks.", "plan.", "cli.", "passes.", "synthesize.",
            "runtime.process.", "runtime.execution.", "runtime.model.")


def _named_in_internals() -> list[str]:
    text = (ROOT / "docs" / "internals.md").read_text()
    names = {m.group(1) for code in re.findall(r"`([^`\n]+)`", text)
             for m in re.finditer(r"\b([a-z_]\w*(?:\.[A-Za-z_]\w*)+)", code)}
    return sorted(n for n in names if not FILE_NAME.search(n) and n not in NOT_SCHEDC)


def _resolves(name: str) -> bool:
    import importlib
    parts = name.removeprefix("schedc.").split(".")
    for package in PACKAGES:
        for cut in range(len(parts), 0, -1):
            try:
                found = importlib.import_module("schedc." + package + ".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                found = getattr(found, attr, None)
            if found is not None:
                return True
    return False


def test_every_name_internals_gives_exists():
    named = _named_in_internals()
    assert len(named) >= 40 and {"driver.passes.PASSES", "simulate.order_makespan", "layout.LAYOUT_OPTIONS"} <= set(named)
    assert [name for name in named if not _resolves(name)] == []


def test_the_name_check_finds_a_name_that_is_gone():
    assert not _resolves("simulate.time_order") and _resolves("simulate.times")
