"""Running Graphviz: DOT text in, SVG/PNG/PDF bytes out, through the `dot` program (found lazily).

Timelines are laid out by us and drawn with `dot -Kneato -n2` (positions taken as given, in points);
dependency graphs with plain `dot`. A missing `dot` is a usage error naming the package to install.
"""
from __future__ import annotations

import re
import shutil
import subprocess

from ..budget import RENDER_PIXELS
from ..diagnostics import USAGE, SchedError, Source, error

FORMATS = ("svg", "png", "pdf")
PNG_DPI = 144  # sharper PNGs than Graphviz's 96; SVG and PDF are vector anyway
MIN_PNG_DPI = 24  # a huge timeline's PNG is drawn at a lower resolution, down to this
_POS = re.compile(r'pos="(-?[\d.]+),(-?[\d.]+)"')


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
        command.append(f"-Gdpi={png_dpi(source, target) if fixed_positions else PNG_DPI}")
    try:
        done = subprocess.run(command, input=source.encode(), capture_output=True, check=False)
    except OSError as exc:
        raise SchedError(error(f"cannot run Graphviz's dot: {exc}"), Source(target, ""), kind=USAGE) from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise SchedError(error("Graphviz's dot failed: " + (message[-1] if message else f"exit {done.returncode}")),
                         Source(target, ""), kind=USAGE)
    return done.stdout


def png_dpi(source: str, target: str) -> int:
    """The resolution of a timeline's PNG (nodes at fixed positions, in points): PNG_DPI, or lower so
    that the image keeps within RENDER_PIXELS; refused when even MIN_PNG_DPI would not."""
    xs, ys = [], []
    for found in _POS.finditer(source):
        xs.append(float(found.group(1)))
        ys.append(float(found.group(2)))
    if not xs:
        return PNG_DPI
    points = (max(xs) - min(xs) + 400) * (max(ys) - min(ys) + 100)  # with the labels, notes and title
    dpi = PNG_DPI
    while dpi > MIN_PNG_DPI and points * (dpi / 72) ** 2 > RENDER_PIXELS.limit:
        dpi = max(MIN_PNG_DPI, int(dpi * 0.8))
    refused = RENDER_PIXELS.refusal(int(points * (dpi / 72) ** 2), f"the PNG at {dpi} dpi would have")
    if refused:
        raise SchedError(error(refused), Source(target, ""), kind=USAGE)
    return dpi
