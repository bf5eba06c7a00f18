"""Test helper: run several plans in one torchrun launch, one after the other, in one process group.

    python -m schedc.runtime.process.launch --standalone --nproc-per-node N tests/launch_plans.py JOBS.json

JOBS.json is a list of [plan.json, [runtime options]]; each plan runs as `python -m schedc.runtime` would
run it (run_pipeline), keeping the process group for the next. A launch costs seconds on a small
machine; a plan run in a joined group costs a fraction of that.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from schedc.plan import load_plan
from schedc.runtime.process.options import parse_options
from schedc.runtime.model.train import run_pipeline
from schedc.runtime.process.world import stop


def main(jobs: str) -> int:
    try:
        for plan, options in json.loads(Path(jobs).read_text()):
            code = run_pipeline(load_plan(plan), parse_options([plan, *options]), keep_group=True)
            if code:
                return code
    finally:
        stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
