"""The synthesis problem (tune --synthesize): what to order, its costs and memory limit, the kinds' names and
ranks, the search's budgets, and the result."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..diagnostics import USAGE, SchedError, Source, error
from ..budget import SYNTHESIS_OPS
from ..frontend.elaborate import MAX_DEVICES  # the language's bound (docs/language.md)
from ..ops import DEFAULT_COSTS, OpKind, builtin_deps, builtin_kinds, cost_range, in_cost_range, release_kind

F, X, W = 0, 1, 2          # forward; the backward that feeds the previous stage (B, or I when split); W


KIND_NAMES = builtin_kinds(True)    # the names of F, X, W with a split backward


FULL_NAMES = builtin_kinds(False)   # and of F, X without


RANK = {X: 0, F: 1, W: 2}       # step 1's ranking: the backward first, then the forward, then W


ALTERNATE = {F: 0, X: 1, W: 2}  # right after a backward, with `alternate`: the forward first


EAGER, GUARDED = "eager", "guarded"  # when a weight gradient may run (see _ListState)


WEIGHTS = (EAGER, GUARDED)


TOLERANCE = 1e-9          # times this close are equal (sums of float costs)


MOVE_BACK = 4             # how far the local search moves a critical op earlier, at most


GREEDY_BUDGET = 1_000_000  # ops the variants of step 2 place, at most, in all (p=16, m=64: ~160 variants)


SEARCH_BUDGET = 1_500_000  # ops the local search times, at most, over all its starts (p=8, m=32: ~1,950 orders)


STARTS = 3                 # best greedy orders the local search starts from


OPTIONS = Source("schedc tune", "")  # where errors in the inputs are reported


def option_error(message: str, kind: str = USAGE) -> SchedError:
    return SchedError(error(message), OPTIONS, kind)


UNITS, BYTES = "activation units", "bytes"  # what `limit` and `memory` count


@dataclass(frozen=True, slots=True)
class Problem:
    """What to order: `costs[kind][stage]` for F, X (B or I) and, when `split`, W; `limit[device]`;
    `memory[kind][stage]`, what an op adds to (+) or frees from (-) its device's memory, in `unit`s,
    the one count of memory the synthesis uses: by default (unit_memory) F holds one activation unit
    until its W (B without a split), as the compiler counts units, or with `deferred` below 1 (the
    zero bubble scheduler's M_W / M_B, 32h / (34h + 5as)) a deferred W holds only that share of it
    from the end of its I, which frees the rest; in bytes (bytes_held), the cost model's, a deferred
    W's inputs included."""

    p: int
    m: int
    costs: tuple[tuple[float, ...], ...]
    split: bool
    latency: float
    limit: tuple[float, ...]
    deferred: float = 1.0
    memory: tuple[tuple[float, ...], ...] = ()
    unit: str = UNITS

    def __post_init__(self):
        if not self.memory:
            object.__setattr__(self, "memory", unit_memory(self.p, self.split, self.deferred))

    @property
    def kinds(self) -> int:
        return 3 if self.split else 2

    def deps(self) -> tuple[tuple[tuple[tuple[int, int, bool], ...], ...], ...]:
        """deps[kind][stage]: (kind, stage, on another device) of the ops it waits for, as schedc.ops
        says (the microbatch is the same)."""
        names = builtin_kinds(self.split)
        code = {name: k for k, name in enumerate(names)}
        return tuple(tuple(tuple((code[k], t, t != s) for k, t in builtin_deps(name, s, self.p, self.split))
                           for s in range(self.p)) for name in names)

    def name(self, kind: int) -> str:
        return (KIND_NAMES if self.split else FULL_NAMES)[kind]

    @property
    def release(self) -> int:
        """The kind that frees a forward's activation, as schedc.ops says (release_kind)."""
        return builtin_kinds(self.split).index(release_kind(self.split))

    def lower_bound(self) -> float:
        """No order beats this, the larger of two bounds per device d:
        - work: d's first forward waits for the forwards above it and their messages, then d runs all
          its own ops;
        - memory: an activation of d lives whole at least `life` (its forward, the forwards below, the
          backwards back up, its W unless I frees most of it (`deferred`, bytes), and the messages
          between), and with L = limit slots the k-th
          forward of d cannot start before the (k-L)-th one's activation is freed: t_k >= t_(k-L) + life,
          t_k >= t_(k-1) + F; the last one still has its own `life` to live."""
        return _lower_bound(self)


def unit_memory(p: int, split: bool, deferred: float = 1.0) -> tuple[tuple[float, ...], ...]:
    """memory[kind][stage] in activation units: F holds 1 until its release (release_kind: W with a
    split backward, else B), I holding nothing; with `deferred` below 1, I frees all but that share,
    which W frees."""
    names = builtin_kinds(split)
    row = {OpKind.F.value: 1.0, release_kind(split): -1.0}
    if split and deferred < 1:
        row = {OpKind.F.value: 1.0, OpKind.I.value: deferred - 1.0, OpKind.W.value: -deferred}
    return tuple(tuple(row.get(name, 0.0) for _ in range(p)) for name in names)


def bytes_held(model, layout, p: int, split: bool) -> tuple[tuple[float, ...], ...]:
    """memory[kind][stage] in bytes, the cost model's (costmodel.bytes.stage_backward_bytes, which the
    compile's memory asks too): F keeps its activations; the backward frees them, and with a split
    one I allocates what its deferred W reads (the layer inputs and output gradients of the weight
    GEMMs), which W frees.

        stage of 2 layers, F keeps 10 MB, a deferred W 3 MB  ->  F +10, I -10 + 3, W -3 (MB)
    """
    from ..costmodel.bytes import stage_backward_bytes
    held = stage_backward_bytes(model, layout, p)
    kept = tuple(k for k, _ in held)
    if not split:
        return kept, tuple(-k for k in kept)
    return kept, tuple(w - k for k, w in held), tuple(-w for _, w in held)


@lru_cache(maxsize=16)
def _lower_bound(pr: Problem) -> float:
    """Problem.lower_bound, in O(p m): prefix sums of the forwards above each device, suffix sums of
    the round trip below it."""
    p, lat = pr.p, pr.latency
    before = [0.0] * p  # the forwards above d and their messages
    for d in range(1, p):
        before[d] = before[d - 1] + pr.costs[F][d - 1] + lat
    trip = [0.0] * (p + 1)  # F + X of the stages from d down, and back
    for d in range(p - 1, -1, -1):
        trip[d] = trip[d + 1] + pr.costs[F][d] + pr.costs[X][d]
    best = 0.0
    for d in range(p):
        work = before[d] + sum(pr.costs[k][d] for k in range(pr.kinds)) * pr.m
        # a forward's memory lives until its W, or until X where X frees it (bytes: I frees F's but
        # for its W's inputs); at most `slots` forwards are alive there at once
        until_w = pr.split and pr.memory[X][d] >= 0
        life = trip[d] + 2 * (p - 1 - d) * lat + (pr.costs[W][d] if until_w else 0)
        slots = max(1, int(min(pr.limit[d] / pr.memory[F][d] + TOLERANCE, pr.m)))
        starts: list[float] = []
        for k in range(pr.m):
            t = before[d] if k == 0 else starts[-1] + pr.costs[F][d]
            if k >= slots:
                t = max(t, starts[k - slots] + life)
            starts.append(t)
        best = max(best, work, starts[-1] + life)
    return best


@dataclass(frozen=True, slots=True)
class Synthesis:
    """The best orders found: per device a tuple of (kind name, stage, microbatch)."""

    problem: Problem
    orders: tuple[tuple[tuple[str, int, int], ...], ...]
    makespan: float
    peak: tuple[int, ...]
    timed: int        # orders timed in all
    found_by: str     # the variant that gave the start of the winning order, and the search's share


def make_problem(p: int, m: int, costs: dict[str, tuple[float, ...]], latency: float,
                 limit: tuple[float, ...], where: dict[str, str] | None = None, deferred: float = 1.0,
                 bytes_of=None) -> Problem:
    """Check the inputs (SchedError, exit 2) and fix the op kinds: `costs` names F and B, or F, I and W,
    each with one value or one per stage; `limit` has one value or one per device; `deferred` in
    (0, 1], with I and W only (Problem). `where` names where a kind's costs came from, for the
    messages (`--cost F`, `--costs FILE, F`). `bytes_of` (model, layout): memory and limit in bytes,
    the cost model's (bytes_held: a deferred W's own bytes, so no `deferred`); else activation units."""
    if p < 1 or m < 1:
        raise option_error(f"p and m must be at least 1 (got p={p}, m={m})")
    if p > MAX_DEVICES:
        raise option_error(f"p={p:,} devices, more than the {MAX_DEVICES:,} a schedule may have")
    split = OpKind.I.value in costs or OpKind.W.value in costs
    if split and OpKind.B.value in costs:
        raise option_error("give the backward as B, or split as I and W, not both")
    names = builtin_kinds(split)
    refused = SYNTHESIS_OPS.refusal(len(names) * p * m, f"p={p}, m={m} ({p:,} stages x {m:,} microbatches x "
                                    f"{len(names)} op kinds) would make")
    if refused:
        raise option_error(refused)
    said = {name: (where or {}).get(name, f"cost {name}") for name in names}
    table = tuple(_per_stage(said[name], costs.get(name, (DEFAULT_COSTS[name],)), p, "stage") for name in names)
    for name, row in zip(names, table):
        bad = [s for s, c in enumerate(row) if not in_cost_range(c, positive=True)]
        if bad:
            at = f"stage {bad[0]}: {row[bad[0]]:g}" if len(set(row)) > 1 else f"got {row[0]:g}"
            raise option_error(f"{said[name]} must be {cost_range(positive=True)} ({at})")
    if not in_cost_range(latency):
        raise option_error(f"--latency must be {cost_range()} (got {latency:g})")
    limits = _per_stage("--activation-limit", limit, p, "device")
    if any(not math.isfinite(x) for x in limits):
        raise option_error("--activation-limit must be finite")
    if not 0 < deferred <= 1 or (deferred < 1 and not split) or (deferred < 1 and bytes_of is not None):
        raise option_error(f"a deferred W's share of an activation must be in (0, 1], with I and W given "
                           f"(got {deferred:g}{'' if split else ' without a split backward'})"
                           + ("; in bytes a deferred W holds its own (give no share)" if bytes_of is not None else ""))
    if bytes_of is None:
        return Problem(p, m, table, split, float(latency), limits, float(deferred))
    return Problem(p, m, table, split, float(latency), limits, 1.0, bytes_held(*bytes_of, p, split), BYTES)


def _per_stage(name: str, values: tuple[float, ...], p: int, what: str) -> tuple[float, ...]:
    if len(values) == 1:
        return tuple(float(values[0]) for _ in range(p))
    if len(values) != p:
        raise option_error(f"{name}: {len(values)} values; give one, or one per {what} ({p})")
    return tuple(float(v) for v in values)
