"""The search: `schedc tune`'s configuration search (space: the request and its candidates; bounds: the
lower bound that prunes; searcher: the walk, its caches and its predictions; report: what tune prints)
and the synthesis of a per-device order under a memory limit (synthesis, synthesis_options)."""
from __future__ import annotations

from .results import Outcome, Ranked, Refusal
from .searcher import Searcher, search
from .space import GROUPS, Candidate, Request, candidates, distinct_figures, layouts

__all__ = ["GROUPS", "Candidate", "Outcome", "Ranked", "Refusal", "Request", "Searcher", "candidates",
           "distinct_figures", "layouts", "search"]
