"""The search: `schedc tune`'s configuration search (space: the request and its candidates; bounds: the
lower bound that prunes; searcher: the walk, its caches and its predictions; results: what it hands on). What tune prints is
schedc/cli/tune_report.py; the synthesis of an order under a memory limit is schedc/synthesize/.

Its names are loaded when first read (PEP 562): the command line reads GROUPS for every command's
options, and only tune needs the walk and the cost model behind it."""
from __future__ import annotations

from importlib import import_module

_WHERE = {"Outcome": "results", "Ranked": "results", "Refusal": "results", "Searcher": "searcher",
          "search": "searcher", "GROUPS": "space", "Candidate": "space", "Request": "space",
          "candidates": "space", "distinct_figures": "space", "layouts": "space"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
