"""Running Graphviz: DOT text in, SVG/PNG/PDF bytes out, through the `dot` program (found lazily).

Timelines are laid out by us and drawn with `dot -Kneato -n2` (positions taken as given, in points);
dependency graphs with plain `dot`. A missing `dot` is a usage error naming the package to install.
"""
from __future__ import annotations

import shutil
import subprocess

from ..diagnostics import USAGE, SchedError, Source, error

FORMATS = ("svg", "png", "pdf")
PNG_DPI = 144  # sharper PNGs than Graphviz's 96; SVG and PDF are vector anyway


def missing_dot(target: str) -> SchedError:
    return SchedError(error("Graphviz's `dot` program was not found on PATH; install Graphviz "
                            "(Debian/Ubuntu: `apt-get install graphviz`, the package `graphviz`), "
                            "or write DOT text instead with `-o FILE.dot`"), Source(target, ""), kind=USAGE)


def run_dot(source: str, fmt: str, target: str, fixed_positions: bool = False) -> bytes:
    """Render DOT `source` to `fmt` (svg, png, pdf); `fixed_positions` keeps every node's pos."""
    program = shutil.which("dot")
    if program is None:
        raise missing_dot(target)
    command = [program, "-q", f"-T{fmt}"]
    if fixed_positions:
        command += ["-Kneato", "-n2"]
    if fmt == "png":
        command.append(f"-Gdpi={PNG_DPI}")
    try:
        done = subprocess.run(command, input=source.encode(), capture_output=True, check=False)
    except OSError as exc:
        raise SchedError(error(f"cannot run Graphviz's dot: {exc}"), Source(target, ""), kind=USAGE) from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise SchedError(error("Graphviz's dot failed: " + (message[-1] if message else f"exit {done.returncode}")),
                         Source(target, ""), kind=USAGE)
    return done.stdout
