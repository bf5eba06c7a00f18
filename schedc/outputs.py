"""Writing what the user asked for: every output path of the command line goes through here.

Parent directories are made; a file is written to a temporary name beside it and renamed over it, so
a failed write (a full disk, a path that cannot be made) leaves no partial file and removes the
temporary; a device or pipe (`-o /dev/stdout`) is written in place, never replaced. Failures are usage
errors (exit 2) that say why: "not a directory", "no space left on the device", ...

    write_output("out/x/plan.svg", data)      # out/x made, out/x/plan.svg replaced at once
"""
from __future__ import annotations

import errno
from pathlib import Path

from .diagnostics import SchedError, Source, error


def output_error(path: str | Path, why: str) -> SchedError:
    return SchedError(error(f"cannot write {path}: {why}"), Source(str(path), ""), exit_code=2)


def reason(exc: OSError) -> str:
    """What went wrong, as a user would say it."""
    return "no space left on the device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)


def prepare_directory(directory: str | Path) -> Path:
    """Make `directory` and its parents; a file in the way, or a place that cannot be written, is a
    usage error naming it."""
    root = Path(directory)
    for place in (root, *root.parents):
        if place.exists():
            if not place.is_dir():
                raise output_error(directory, f"{place} is not a directory")
            break
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(directory, reason(exc)) from None
    return root


def write_output(path: str | Path, data: bytes | str) -> Path:
    """Write `data` to `path` at once (see the module's docstring); the path written."""
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    if target.is_dir():
        raise output_error(path, "it is a directory")
    if target.exists() and not target.is_file():
        try:
            with open(target, "wb") as stream:
                stream.write(payload)
        except OSError as exc:
            raise output_error(path, reason(exc)) from None
        return target
    prepare_directory(target.parent)
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_bytes(payload)
        tmp.replace(target)
    except OSError as exc:
        raise output_error(path, reason(exc)) from None
    finally:
        tmp.unlink(missing_ok=True)
    return target
