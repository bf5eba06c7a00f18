"""The paths one command reads and writes, checked before any work starts: an output must not land on an
input of the same command or on another output, and must be a regular file (or a name not yet used) in
a place that can be written. The compiler's verbs and the runtime's launch ask the same two functions;
they read the disk and import nothing of schedc.

    clash([("FILE", "my.sched")], [("-o", "my.sched")])
    -> "-o my.sched is FILE: the command would overwrite what it reads"
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable

STDOUT = "-"


def _key(path: str) -> tuple:
    """What identifies the file a path names: its device and inode when it exists, else its resolved
    absolute path (a name not yet made)."""
    try:
        info = os.stat(path)
        return ("inode", info.st_dev, info.st_ino)
    except OSError:
        return ("path", os.path.realpath(path))


def clash(inputs: Iterable[tuple[str, str | None]], outputs: Iterable[tuple[str, str | None]]) -> str | None:
    """The first output (option, path) that names an input's file or an earlier output's, in words
    naming both options; None when they all differ. Absent paths (None) and `-` are left out."""
    seen: dict[tuple, tuple[str, str, bool]] = {}
    for option, path in inputs:
        if path and path != STDOUT:
            seen.setdefault(_key(path), (option, path, True))
    for option, path in outputs:
        if not path or path == STDOUT:
            continue
        key = _key(path)
        if key in seen:
            other, other_path, read = seen[key]
            if read:
                return f"{option} {path} is {other} {other_path}: the command would overwrite what it reads"
            return f"{option} {path} and {other} {other_path} name one file: one would replace the other"
        seen[key] = (option, path, False)
    return None


def unwritable(path: str, directory: bool = False) -> str | None:
    """Why `path` cannot be written as a regular file (or, with `directory`, made as a folder of files):
    a folder where a file is wanted, a FIFO, device or socket, a file in the way of its parents, a place
    without write permission; None when it can."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None:
        if directory and not stat.S_ISDIR(mode):
            return f"{path} exists and is not a directory"
        if not directory and stat.S_ISDIR(mode):
            return f"{path} is a directory"
        if not directory and not stat.S_ISREG(mode):
            return f"{path} is not a regular file (a FIFO, a device or a socket)"
        if not os.access(path, os.W_OK):
            return f"no permission to write {path}"
        return None
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"no permission to write in {parent}"
    return None
