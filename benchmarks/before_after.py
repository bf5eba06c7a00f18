"""The three commands a restructuring must not slow down, timed on two revisions in one run.

    python benchmarks/before_after.py --before c20bf5b --runs 5

Each revision is checked out (git worktree, detached, in a temporary folder) and run as a whole process
with its own tree first on PYTHONPATH; the runs alternate between the two revisions so a change of load
hits both alike. Printed per command: CPU seconds (user + system of the process) min / median / max of
each revision and the ratio of the medians, after / before. The commands:

- compile of interleaved_1f1b at p=32, v=4, m=256 (the plan written),
- tune of Megatron-LM's 1T row (benchmarks/tune_megatron.py's row: 3,072 GPUs, batch 3,072),
- simulate of the 1T row with --cluster (1f1b at p=64, t=8, the row's batch).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "gpt-1008b.toml"  # Megatron-LM's 1T row, in the tree's model library (schedc/models or benchmarks/models)
CLUSTER = "dgx-a100-80gb"
COMMANDS = {
    "compile interleaved_1f1b p=32 v=4 m=256": ["compile", "interleaved_1f1b", "-D", "p=32", "-D", "v=4",
                                                "-D", "m=256", "-o", "{out}"],
    "tune, 1T row": ["tune", "--model", "{model}", "--cluster", CLUSTER, "--gpus", "3072", "--global-batch", "3072",
                     "--top", "5", "--json"],
    "simulate --cluster, 1T row": ["simulate", "1f1b", "-D", "p=64", "--model", "{model}", "--cluster", CLUSTER,
                                   "--tp", "8", "--dp", "6", "--microbatch-size", "1", "--global-batch", "3072",
                                   "--json"],
}
MAIN = "import sys; from schedc.cli import main; sys.exit(main())"


def model_file(tree: Path) -> Path:
    """The 1T row's model description where the tree keeps its model library."""
    return next(p for p in (tree / "schedc" / "models" / MODEL, tree / "benchmarks" / "models" / MODEL) if p.exists())


def cpu_seconds(tree: Path, argv: list[str], out: Path) -> float:
    """User + system CPU seconds of one whole `schedc` process run from `tree`'s sources."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", MAIN, *(a.format(out=out, model=model_file(tree)) for a in argv)],
                   cwd=tree, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the revision to compare with (a commit or a ref)")
    parser.add_argument("--after", default=None, help="the revision measured (default: the working tree; name a "
                                                      "commit to keep edits during the run out of it)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for label, rev in (("before", args.before), ("after", args.after)):
            if rev is None:
                trees[label] = REPO
                continue
            trees[label] = Path(tmp) / label
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(trees[label]), rev], cwd=REPO, check=True)
        try:
            print(f"load average {os.getloadavg()[0]:.1f}; before = {args.before}, after = {args.after or 'working tree'}")
            for name, argv in COMMANDS.items():
                seconds = {label: [] for label in trees}
                for run in range(args.runs):
                    for label, tree in trees.items():
                        seconds[label].append(cpu_seconds(tree, argv, Path(tmp) / f"{label}{run}"))
                medians = {label: statistics.median(s) for label, s in seconds.items()}
                print(f"{name}: " + "; ".join(f"{label} CPU s min {min(s):.3f} median {medians[label]:.3f} max "
                                               f"{max(s):.3f}" for label, s in seconds.items())
                      + f"; after/before {medians['after'] / medians['before']:.3f}")
        finally:
            for label, tree in trees.items():
                if tree != REPO:
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


if __name__ == "__main__":
    main()
