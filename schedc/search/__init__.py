"""The search: `schedc tune`'s configuration search (space: the request and its candidates; bounds: the
lower bound that prunes; searcher: the walk, its caches and its predictions; results: what it hands on). What tune prints is
schedc/cli/tune_report.py; the synthesis of an order under a memory limit is schedc/synthesize/."""
from __future__ import annotations

from .results import Outcome, Ranked, Refusal
from .searcher import Searcher, search
from .space import GROUPS, Candidate, Request, candidates, distinct_figures, layouts

__all__ = ["GROUPS", "Candidate", "Outcome", "Ranked", "Refusal", "Request", "Searcher", "candidates",
           "distinct_figures", "layouts", "search"]
