"""The schedule library shipped with schedc (schedc/schedules/*.sched), found by file name or schedule name."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

LIBRARY_PACKAGE = "schedc.schedules"
ADDONS = "addons"  # the add-ons' folder, in the library and next to a schedule


def library_files() -> list[Path]:
    root = resources.files(LIBRARY_PACKAGE)
    return sorted(Path(str(entry)) for entry in root.iterdir() if entry.name.endswith(".sched"))


def library_addons() -> list[Path]:
    root = resources.files(LIBRARY_PACKAGE).joinpath(ADDONS)
    return sorted(Path(str(entry)) for entry in root.iterdir() if entry.name.endswith(".sched"))


def resolve(name: str) -> Path:
    """A path as given if it exists, else the library schedule of that name (`1f1b`, `chimera.sched`),
    else the library add-on (`kfac`: compiling it alone then says it needs a base)."""
    path = Path(name)
    if path.exists() or path.suffix not in ("", ".sched") or len(path.parts) > 1:
        return path
    for candidate in (*library_files(), *library_addons()):
        if candidate.stem == path.stem:
            return candidate
    return path
