"""The driver: the only way into the compiler. `inputs` chooses what a FILE is (a .sched schedule, a
torch CSV order, a plan.json) and compiles it; `passes` holds PASSES, their named subsets and the one
function that runs them; `replay` re-simulates a plan's orders; `cluster` compiles for a model on a
cluster (--cluster, tune's whole compiles). The command line, the renderer, the demo, the search and
the tests all call these."""
from __future__ import annotations

from .inputs import (PLAN, SCHEDULE, TORCH_CSV, build_schedule, compile_file, compile_source, kind_of,
                     load_declaration, load_input, parse_defines)
from .passes import PASSES, Checks, Unit, analyse, analysis, collector_paused, compile_schedule, replay, run_passes, untimed
from ..passes.compiled import Compiled
from ..frontend.elaborate import Options
from ..frontend.parse import read_source

__all__ = ["PLAN", "SCHEDULE", "TORCH_CSV", "PASSES", "Checks", "Compiled", "Options", "Unit", "analyse", "analysis",
           "build_schedule", "collector_paused", "compile_file", "compile_schedule", "compile_source", "kind_of",
           "load_declaration", "load_input", "parse_defines", "read_source", "replay", "run_passes", "untimed"]
