"""docs: docs/internals.md's layout names every module of the tree (its file name and each folder it
lies in) and no module that is gone."""
from __future__ import annotations

import re
from pathlib import Path

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
