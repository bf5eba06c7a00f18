"""docs: docs/internals.md's layout names every module of the tree (its file name and each folder it
lies in, the name inside its own folder's lines) and no module that is gone; README.md stays a short guide that links every docs/ page, shows
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


def _section(lines: list[str], folder: str) -> list[str] | None:
    """The lines of `lines` under the one whose first word is `folder/` (or `schedc/folder/`): that line
    and those after it, until the next line indented no deeper."""
    for n, line in enumerate(lines):
        words = line.split()
        if words and words[0].removeprefix("schedc/") == folder + "/" and words[0] != "schedc/":
            indent = len(line) - len(line.lstrip())
            end = next((k for k in range(n + 1, len(lines)) if lines[k].strip()
                        and len(lines[k]) - len(lines[k].lstrip()) <= indent), len(lines))
            return lines[n:end]
    return None


def _own(section: list[str]) -> str:
    """A folder's section without its subfolders' sections: the text that names its own modules."""
    kept, inside = [section[0]], None
    for line in section[1:]:
        indent = len(line) - len(line.lstrip())
        if inside is not None and (not line.strip() or indent > inside):
            continue
        words = line.split()
        inside = indent if words and words[0].endswith("/") else None
        if inside is None:
            kept.append(line)
    return re.sub(r"[\w/]+/\w+\.py", "", "\n".join(kept))  # a path names another folder's module


def misplaced(block: str, modules: list[Path]) -> list[str]:
    """The modules the layout block does not name inside their own folder's section (folder in folder)."""
    lines = block.splitlines()
    root = next(n for n, line in enumerate(lines) if line.split()[:1] == ["schedc/"])
    top = lines[root:next(k for k in range(root + 1, len(lines)) if lines[k][:1].strip())]
    out = []
    for module in modules:
        section = top if module.parent == Path(".") else lines
        for folder in module.parts[:-1]:
            section = _section(section, folder) if section else None
        if not section or not re.search(rf"\b{re.escape(module.name)}\b", _own(section)):
            out.append(str(module))
    return out


def test_internals_places_every_module_in_its_folder():
    assert misplaced(_layout_block(), _modules()) == []


def test_the_placement_check_finds_a_module_in_another_folder():
    block = "schedc/\n  ops.py   kinds (not runtime/errors.py)\n  passes/   the passes\n    lower.py  x\n  plan/\n    trace.py  y\n" \
            "schedc/runtime/   z\n  execution/\n    trace.py   w\n"
    modules = [Path("ops.py"), Path("passes/lower.py"), Path("plan/trace.py"), Path("runtime/execution/trace.py")]
    assert misplaced(block, modules) == []
    wrong = ["plan/lower.py", "lower.py", "runtime/trace.py", "runtime/plan/trace.py", "errors.py"]
    assert misplaced(block, list(map(Path, wrong))) == wrong


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


# Words that narrate what changed rather than say what is: the docs are a reference.
NARRATION = re.compile(r"\b(now|used to|no longer|at first|the revision before)\b", re.IGNORECASE)


def test_the_docs_say_what_is_not_what_changed():
    assert NARRATION.search("refused now") and not NARRATION.search("known, nowhere, snow")
    found = [(doc.name, m.group(0)) for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]
             for m in NARRATION.finditer(doc.read_text())]
    assert found == []


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


# Runnable command blocks: a fenced block opened with ```sh run (or ```sh run slow for one that takes
# more than a few seconds) is a shell script a reader can paste into an empty directory. Each runs
# here with bash -e in a temporary directory, `schedc` the tree's own command line, under a timeout.
RUN_FENCE = re.compile(r"^```sh run( slow)?$")


def _run_blocks() -> list[tuple[str, int, str, bool]]:
    """Every runnable block of README.md and docs/*.md: (file, its first line, its text, slow)."""
    blocks = []
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        lines = doc.read_text().splitlines()
        for start, line in enumerate(lines):
            fence = RUN_FENCE.match(line.strip())
            if fence:
                end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
                blocks.append((str(doc.relative_to(ROOT)), start + 1, "\n".join(lines[start + 1:end]) + "\n",
                               bool(fence.group(1))))
    return blocks


RUN_BLOCKS = _run_blocks()
RUN_PARAMS = [pytest.param(doc, line, code, id=f"{doc}:{line}", marks=[pytest.mark.slow] if slow else [])
              for doc, line, code, slow in RUN_BLOCKS]


def test_the_docs_mark_runnable_blocks_of_both_speeds():
    assert any(doc == "README.md" for doc, *_ in RUN_BLOCKS)
    assert {slow for *_, slow in RUN_BLOCKS} == {True, False}


def _run_block(code: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    prelude = f'set -e\nschedc() {{ "{sys.executable}" -m schedc.cli "$@"; }}\n'
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", "-c", prelude + code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("doc, line, code", RUN_PARAMS)
def test_a_runnable_block_of_the_docs_runs(doc, line, code, tmp_path):
    done = _run_block(code, tmp_path, timeout=300)
    assert done.returncode == 0, f"{doc}:{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def test_a_failing_command_fails_its_block(tmp_path):
    assert _run_block("schedc simulate no-such-schedule\necho after\n", tmp_path, timeout=60).returncode == 2
