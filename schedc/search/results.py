"""What the search hands on: a ranked configuration, a refusal and why, the walk's outcome, and the cached
structure of an order (its ops, predecessors and activation peaks) and of a family."""
from __future__ import annotations

import math
from itertools import takewhile
from dataclasses import dataclass, field
from typing import Any

from ..costmodel import Prediction, tp_in_node
from ..text import GIB, ordinal
from .space import Candidate, Request, distinct_figures


def op_costs(structure, table) -> list[float]:
    """The cost of each of a structure's ops, table[op.kind][op.stage], its overlapped pairs fused as
    simulate fuses them; read through the ops' (kind, stage) kept with them (Structure.units)."""
    from ..passes.simulate import fuse_costs
    flat = {(kind, s): value for kind, row in table.items() for s, value in enumerate(row)}
    cost = list(map(flat.__getitem__, structure.units))
    fuse_costs(structure.pairs, cost, table)
    return cost


@dataclass(frozen=True)
class Ranked:
    """A simulated candidate and its prediction (the bubble from the message-free simulation)."""

    candidate: Candidate
    prediction: Prediction
    same: tuple[Candidate, ...] = ()  # other schedules with this layout and the same order: one row

    @property
    def iteration_s(self) -> float:
        return self.prediction.iteration_s

    @property
    def bubble(self) -> float:
        """The bubble of the simulated step, idle over busy time (timing.bubble): what `schedc simulate`
        prints for the same configuration (float noise below 0 shows as 0)."""
        value = self.prediction.extra["bubble"]
        return 0.0 if -1e-9 < value < 0 else value

    def to_json(self) -> dict[str, Any]:
        c, p = self.candidate, self.prediction
        return {"schedule": c.schedule, "t": c.t, "p": c.p, "d": c.d, "v": c.v, "b": c.b, "m": c.m,
                "recompute": c.recompute, "tflops_per_gpu": round(p.tflops_per_gpu, 3), "mfu": p.extra["mfu"],
                "parameters": p.extra["parameters"],
                "iteration_s": round(p.iteration_s, 6), "memory_gib_per_gpu": round(p.memory_bytes / GIB, 3),
                "bubble": round(self.bubble, 4), "sequences_per_s": round(p.global_batch / p.iteration_s, 4),
                "critical_device": p.extra["critical_device"], "same_order": [o.schedule for o in self.same],
                "cp": c.cp, "zero": c.zero, **({"ep": c.ep} if c.ep != 1 else {})}

    def label(self) -> str:
        """The schedule, and those merged into this row: `zb_h1=zb_h2`."""
        return "=".join([self.candidate.schedule, *(o.schedule for o in self.same)])


@dataclass(frozen=True)
class Refusal:
    """Why a candidate was not ranked: a requirement or compile error, a deadlock, or its memory (the
    bytes of its largest device) over the limit."""

    message: str
    memory: float | None = None
    layers: bool = False   # the schedule's stages do not divide the layers: outside the space
    fault: bool = False    # the order itself cannot run (it deadlocks): at every size, in any memory
    bound: bool = False    # memory is a lower bound (the state alone), not the candidate's figure


@dataclass(frozen=True)
class Outcome:
    """The search's answer: the ranked candidates (best first; with --per, the K best of each group,
    best first all together), one line per
    family (schedule, t, p) none of whose candidates was simulated, and the counts."""

    request: Request
    ranked: tuple[Ranked, ...]
    pruned: tuple[str, ...]
    counts: dict[str, int]
    space: str
    seconds: float
    stopped: Stop | None = None  # where the walk stopped at its budget (None: it walked every candidate)


BOUND_SLACK = 1e-9  # relative: how far a bound may pass the simulated iteration by rounding (the sums' order)


@dataclass(frozen=True)
class Stop:
    """The walk stopped at its budget (Request.walk_ops: `limit`, after `work`), `left` candidates not
    walked, none faster than `bound` (the least of their lower bounds)."""

    limit: int
    work: int
    left: int
    bound: float

    def exact(self, ranked) -> int:
        """How many of the ranked rows (best first) are certain: those faster than every candidate left can
        be (a tie at the bound is not certain: the left one may rank first)."""
        below = self.bound * (1 - BOUND_SLACK)  # a bound may pass its own iteration by rounding
        return sum(1 for _ in takewhile(lambda item: item.prediction.iteration_s < below, ranked))


@dataclass
class Family:
    """What happened to the candidates of one (schedule, t, p): for the lines of pruned families."""

    simulated: int = 0
    over: tuple[float, str] | None = None         # least memory over the limit: bytes, the line
    bound: tuple[float, float] | None = None      # least bound of a pruned candidate, the threshold then
    bounded: int = 0
    refused: str | None = None                    # a requirement or compile error of the schedule
    fault: str | None = None                      # its order deadlocks: said before any memory figure
    layers: str | None = None                     # its stages do not divide the layers (outside the space)
    left: tuple[float, int] | None = None         # not walked (the walk's budget spent): least bound, count

    def note_left(self, bound: float) -> None:
        least, count = self.left or (bound, 0)
        self.left = (min(least, bound), count + 1)

    def note_bound(self, bound: float, threshold: float) -> None:
        self.bounded += 1
        self.bound = min(self.bound or (math.inf, 0.0), (bound, threshold))


@dataclass
class Structure:
    """An order compiled once per (schedule, p, v, m): the schedule (default costs), its ops with their
    predecessors (simulate.predecessors), devices, activation peaks; or why it cannot run."""

    schedule: Any = None
    ops: list = field(default_factory=list)
    preds: list = field(default_factory=list)
    firsts: list = field(default_factory=list)
    device: list = field(default_factory=list)
    pairs: list = field(default_factory=list)     # overlapped pairs: (index, forward's stage), simulate.fuse_pairs
    units: list = field(default_factory=list)     # per op, (kind, stage): where its cost is in a costs table
    peaks: tuple[float, ...] = ()
    error: str | None = None
    order: int | None = None  # which distinct order it is (Searcher.order_id): equal orders, equal numbers


class Kept:
    """A heap entry ordered worst first: (iteration_s, candidate), the larger key on top."""

    __slots__ = ("key",)

    def __init__(self, key: tuple):
        self.key = key

    def __lt__(self, other: Kept) -> bool:
        return self.key > other.key


def family_lines(families: dict[tuple, Family], request: Request, counts: dict[str, int], node: int) -> list[str]:
    """One line per (schedule, t, p) with nothing simulated: those whose order deadlocks first
    (whatever else was bounded or over memory: a fault of the schedule, not of its sizes), then the
    bounded ones (closest first), those over memory (least over first), then refusals."""
    lines = []
    which = f"the {ordinal(request.top)} best" if request.per is None else "its group's K-th best"
    faults = {}  # (schedule, p) -> (t, fault): an order is the same at every t, so is its deadlock
    for (name, t, p), fam in families.items():
        if fam.fault is not None:
            faults.setdefault((name, p), (t, fam.fault))
    for (name, t, p), fam in families.items():
        if fam.simulated:
            continue
        crosses = not tp_in_node(t, node)
        head = f"{name} t={t} p={p}: " + (f"t={t} crosses nodes ({node} GPUs per node); " if crosses else "")
        if fam.fault is not None:
            lines.append((0, 0.0, head + fam.fault))
        elif fam.bound is not None and (name, p) in faults:
            seen, fault = faults[name, p]
            lines.append((0, 0.0, head + f"{fault}, seen at t={seen} (the same order; {fam.bounded} "
                                         "bounded out here)"))
        elif fam.left is not None:
            lines.append((1, fam.left[0], head + f"at best {fam.left[0]:.4g} s per iteration (a lower bound), not walked: the "
                                                 f"walk's budget was spent (--walk-ops): {fam.left[1]} not simulated"))
        elif fam.bound is not None:
            bound, threshold = fam.bound
            a, b = distinct_figures(bound, threshold)
            lines.append((1, bound, head + f"at best {a} s per iteration (a lower bound; memory not checked), "
                                          f"slower than {which} ({b} s): {fam.bounded} not simulated"))
        elif fam.over is not None:
            lines.append((2, fam.over[0][1], head + fam.over[1]))  # least over first
        elif fam.refused is not None:
            lines.append((3, 0.0, head + fam.refused))
        elif fam.layers is not None and counts["layers"] == counts["candidates"] - counts["refused"]:
            lines.append((4, 0.0, head + fam.layers))  # shown only when nothing else ran
    return [text for _, _, text in sorted(lines)]
