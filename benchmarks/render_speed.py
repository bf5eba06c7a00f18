"""Render speed: the timeline of interleaved 1F1B at p=32, v=4, m=256 (65,536 ops) to SVG.

Times, best of --repeat runs in one process: compiling the schedule (not rendering, shown apart), then
rendering: building the DOT text and Graphviz's `dot -Kneato -n2 -Tsvg` drawing it. Also the whole
command, `schedc render interleaved_1f1b -D p=32 -D v=4 -D m=256 -o X.svg`, as a process.

The last line is `render X.XX s` (DOT text + dot, compile excluded).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", type=int, default=32)
    parser.add_argument("-v", type=int, default=4)
    parser.add_argument("-m", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from schedc.driver import compile_file
    from schedc.render import render
    from schedc.render.timeline import timeline_dot

    defines = (f"p={args.p}", f"v={args.v}", f"m={args.m}")
    start = time.perf_counter()
    compiled = compile_file("interleaved_1f1b", defines, None, 0.0)
    compile_s = time.perf_counter() - start
    text_s, total_s, size = [], [], 0
    for _ in range(args.repeat):
        start = time.perf_counter()
        timeline_dot(compiled)
        text_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        size = len(render(compiled, "svg", "bench.svg"))
        total_s.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "schedc.cli", "render", "interleaved_1f1b", *sum((["-D", d] for d in
                        defines), []), "-o", str(Path(tmp) / "t.svg")], check=True, capture_output=True)
        command_s = time.perf_counter() - start
    print(f"interleaved_1f1b p={args.p} v={args.v} m={args.m}: {compiled.stats['ops']} ops, "
          f"SVG {size / 1e6:.1f} MB")
    print(f"compile {compile_s:.2f} s (not counted below)")
    print(f"DOT text {min(text_s):.2f} s, Graphviz {min(total_s) - min(text_s):.2f} s")
    print(f"whole command (python start, compile, render, write) {command_s:.2f} s")
    print(f"render {min(total_s):.2f} s")


if __name__ == "__main__":
    main()
