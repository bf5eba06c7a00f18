"""Writing what the user asked for: every output path of the command line goes through here.

Parent directories are made; a file is written to a temporary name beside it and renamed over it, so
a failed write (a full disk, a path that cannot be made) leaves no partial file and removes the
temporary. A symlink is written through: the file it points at is the one replaced (made if missing),
the link stays. A device, pipe or socket (a FIFO, `/dev/null`), and anything reached through /proc
(`/dev/stdout` is a link to /proc/self/fd/1), is written in place, never replaced. `-`, or any name
of the standard output, is written to the standard output's stream. Failures are usage errors (exit 2) that say why: "not a directory", "no space left
on the device", ...

    write_output("out/x/plan.svg", data)      # out/x made, out/x/plan.svg replaced at once
    write_output("-", text)                   # printed
"""
from __future__ import annotations

import errno
import io
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from .diagnostics import USAGE, SchedError, Source, error

STDOUT = "-"
_MAX_LINKS = 40  # as the kernel's own limit on a chain of symlinks


def output_error(path: str | Path, why: str) -> SchedError:
    return SchedError(error(f"cannot write {path}: {why}"), Source(str(path), ""), kind=USAGE)


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


def destination(path: str | Path) -> tuple[Path, bool]:
    """The file a write to `path` lands in, its symlinks followed, and whether it is written in place
    (a device, pipe or socket, or a /proc link such as /dev/stdout) rather than replaced."""
    place = os.path.abspath(path)
    for _ in range(_MAX_LINKS):
        place = os.path.join(os.path.realpath(os.path.dirname(place)), os.path.basename(place))
        if place.startswith("/proc/"):
            return Path(place), True
        if not os.path.islink(place):
            try:
                mode = os.stat(place).st_mode
            except OSError:
                return Path(place), False  # not there yet: made by the rename
            return Path(place), not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))
        place = os.path.join(os.path.dirname(place), os.readlink(place))
    raise output_error(path, "too many levels of symbolic links")


@contextmanager
def open_output(path: str | Path) -> Iterator[BinaryIO]:
    """A binary stream whose bytes become `path` when the block ends without an error (see the
    module's docstring); an OSError on the way is a usage error naming the path."""
    target, in_place = (None, True) if is_stdout(path) else destination(path)
    if target is not None and target.is_dir():
        raise output_error(path, "it is a directory")
    try:
        if target is None:
            yield sys.stdout.buffer
            sys.stdout.buffer.flush()
            return
        if in_place:
            with open(path, "wb") as stream:
                yield stream
            return
        prepare_directory(target.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as stream:
                yield stream
            os.chmod(tmp, _mode(target))
            os.replace(tmp, target)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        raise output_error(path, reason(exc)) from None


def is_stdout(path: str | Path) -> bool:
    """Whether a write to `path` goes to this process's standard output: `-`, or a name of the same
    file (`/dev/stdout`, `/dev/fd/1`), which is then written through the one stream so that what
    else is printed follows it rather than overwriting it."""
    if str(path) == STDOUT:
        return True
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


def write_output(path: str | Path, data: bytes | str) -> Path:
    """Write `data` to `path` at once (see the module's docstring); the path named."""
    with open_output(path) as stream:
        stream.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def _mode(target: Path) -> int:
    """The permissions of the file replaced, or a new file's (0o666 less the umask)."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
