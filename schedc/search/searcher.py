"""The configuration search of `schedc tune --model M --cluster C --gpus N --global-batch B` (the command
line and its report are schedc/cli/tune.py and schedc/cli/tune_report.py). It tries
tensor-parallel t (dividing the heads; within a node first), pipeline p (the schedule's stages must
divide the layers), context parallelism cp and the ZeRO level (unless the request fixes them),
d = N / (t cp p), chunks v (schedules with a param v), microbatch size b (dividing B / d),
recomputation and the schedules listed, and ranks them by the predicted iteration time of
each schedule's own compiled order simulated with the cluster's costs (schedc/costmodel/fit.py), never a
closed formula.

    candidates --bounds--> sorted by a lower bound --elaborate, memory, simulate--> top K
       |                        |                           |
    t p d v b m recompute   weights alone over the limit;  an order's structure (ops, predecessors,
                            an iteration no faster than     activation peaks) once per (schedule, p, v, m);
                            the K-th best found so far:    a simulation once per (schedule, p, v, m,
                            pruned, never simulated         cost vector, links)

The bound (schedc/search/bounds.py; its pieces cached in schedc/search/pieces.py): every device runs
all its ops one at a time, none before the forwards of the stages before its first one have run and
their messages arrived, and (without a split backward) its last op, a backward, still has the
backwards of the stages before it to wait for; then the end-of-step tail of the predict model. It
never exceeds the simulated iteration, so pruning by it keeps the top K exact (`--exhaustive`
simulates every candidate that fits, as the reference). Before an order is compiled whole, the memory
its devices hold until their first backward (frontend/prefix.py: the programs run that far; with a
split backward, then until their first W) refuses the candidates it already puts over the limit
(start_bound): no order holds less at its peak. A mixed
backward (B or I + W per microbatch) is bounded with each backward at the lesser and, where its
programs place overlapped pairs (DualPipe's `F & B`), each F less what its pair can save
(bounds.mixed_costs); V-Half's and V-Min's programs place none, so their forwards count whole.
Schedules whose order depends on the costs (greedy), that declare tasks, fill bubbles or memory
beyond activations are compiled whole for every candidate (driver.cluster.compile_for), without the
bound. ZeRO 2/3 candidates take the cached order too, timed with their collectives on each device's
lane as simulate times them (a simulate.Lane of sharding.Sharded.per_op: the same figures as the whole
compile, tested field for field), bounded first by the larger of the compute bound and their busiest
lane (bounds.lane_bound); --exhaustive compiles them whole, the reference the walk is held to.
"""
from __future__ import annotations

import heapq
import math
import shlex
import time
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from .bounds import Shape, state_bound
from ..costmodel.specs import MAX_GPUS
from ..diagnostics import usage
from ..costmodel import Prediction, Setting, device_memory, predict
from ..costmodel.sharding import Sharded
from ..diagnostics import SchedError
from ..text import plural
from .pieces import Pieces
from .space import Candidate, Request, candidates
from .results import BOUND_SLACK, Family, Kept, Outcome, Ranked, Refusal, Stop, Structure, family_lines, op_costs

# the walk's work per op (Request.walk_ops), about what each costs against a simulation's 1: an order's
# or a start's op made by the programs 2, and 6 where a squeeze then passes over it four times
_BUILT = {False: 2, True: 6}
SLACK = BOUND_SLACK               # relative: a bound this close to the threshold is simulated anyway
MAX_GLOBAL_BATCH = 2**24    # sequences per step


class Searcher(Pieces):
    """The search over one request; its caches live as long as it does (the layout's pieces and the
    bound: schedc/search/pieces.py)."""

    def __init__(self, request: Request, progress: Callable[[int], None] | None = None):
        for name, value, most in (("--gpus", request.gpus, MAX_GPUS),
                                  ("--global-batch", request.global_batch, MAX_GLOBAL_BATCH)):
            if value > most:
                raise usage(f"{name} {value:,} is more than the {most:,} the search takes")
        super().__init__(request)
        self.progress = progress or (lambda n: None)
        self.structures: dict[tuple, Structure] = {}
        self.starts: dict[tuple, Shape | None] = {}  # ((schedule, p, v, m), until) -> its starts, if known
        self.simulated: dict[tuple, float | None] = {}   # (schedule, p, v, m, costs, links) -> makespan
        self.whole: dict[tuple[Candidate, bool], Prediction | Refusal] = {}  # compiled whole: (c, free) -> answer
        self.orders: dict[tuple, int] = {}  # an order's identity -> its number (order_id)
        self.lanes: dict[tuple, tuple[list[float], list[float]]] = {}  # (schedule, p, v, m, Sharded) -> per_op
        self.counts = {"candidates": 0, "simulated": 0, "cache_hits": 0, "structures": 0, "bounded": 0,
                       "over_memory": 0, "refused": 0, "layers": 0, "deadlocked": 0, "compiled_whole": 0, "merged": 0,
                       "started": 0}
        self.work = 0  # the walk's budget (Request.walk_ops): ops built and simulated, weighted by _BUILT

    # the order's pieces, cached -------------------------------------------------------------------

    def structure(self, c: Candidate) -> Structure:
        key = c.structure_key()
        if key not in self.structures:
            self.structures[key] = self._structure(c)
            self.counts["structures"] += 1
            built = self.structures[key].schedule
            self.work += 0 if built is None else _BUILT[self.entries[c.schedule].squeezed] * sum(
                map(len, built.orders))
        return self.structures[key]

    def start_bound(self, c: Candidate) -> Refusal | None:
        """The refusal of a candidate whose orders' starts (frontend/prefix.py: each device's order until
        its first backward) with its weights and state already hold more than the limit: no order that
        starts so fits (bounds.state_bound), and the whole order is never elaborated. With a split
        backward (not mixed) a start that fits is taken on to each device's first W, holding the W's
        deferred until then (ZB-H1's device d defers d of them). None where it fits or no start is
        known (--exhaustive, a schedule compiled whole or ordered otherwise)."""
        from ..frontend.prefix import BACKWARDS, WEIGHTS
        entry = self.entries[c.schedule]
        if self.request.exhaustive or entry.plain:  # ZeRO 2/3 too: its held bytes are the order's
            return None
        for until in (BACKWARDS, WEIGHTS) if entry.split and not entry.mixed else (BACKWARDS,):
            key = (c.structure_key(), until)
            if key not in self.starts:
                self.starts[key] = self._start(c, until)
            start = self.starts[key]
            if start is None:
                return None
            st = self.setting(c)  # not cached: the start is the key's
            memory, device = state_bound(st, start, self.held(st, c, start))
            if memory > self.limit:
                what = "backward" if until is BACKWARDS else "weight gradient"
                return self.over(memory, device, " (weights, optimizer state and what its order holds before its "
                                 f"first {what} alone)", bound=True)
        return None

    def _start(self, c: Candidate, until: frozenset[str] | None = None) -> Shape | None:
        from dataclasses import replace
        from ..frontend.prefix import BACKWARDS, order_starts
        entry = self.entries[c.schedule]
        orders = order_starts(entry.decl, entry.source, c.params(), until or BACKWARDS)
        self.counts["started"] += 1
        self.work += 0 if orders is None else _BUILT[False] * sum(map(len, orders))
        shape = self.shape(c)
        if orders is None or isinstance(shape, Refusal):
            return None
        return replace(shape, orders=orders, split_backward=entry.split, mixed_backward=entry.mixed)

    def _structure(self, c: Candidate) -> Structure:
        """The order and its activation peaks; its checks and predecessors wait for prepare()."""
        from ..driver import collector_paused
        from ..frontend.elaborate import Options, elaborate
        from ..passes.memory import peak_memory
        entry = self.entries[c.schedule]
        with collector_paused():
            try:
                schedule = elaborate(entry.decl, entry.source, Options(c.params()))
            except SchedError as exc:
                return Structure(error=exc.diagnostics[0].message)
        return Structure(schedule, peaks=peak_memory(schedule))

    @staticmethod
    def prepare(structure: Structure) -> Structure:
        """Run the driver's untimed passes on the order (its structure checks: one F and one B of every
        stage and microbatch, on its device; and any pass added to PASSES), then index its ops'
        predecessors for simulate's timing; once per order that fits in memory."""
        from ..diagnostics import has_errors
        from ..driver import collector_paused, run_passes, untimed
        from ..passes.simulate import DEVICE, fuse_pairs, predecessors
        if structure.ops or structure.error is not None:
            return structure
        with collector_paused():
            found = run_passes(structure.schedule, passes=untimed()).diagnostics
            if has_errors(found):
                structure.error = next(d for d in found if d.severity.value == "error").message
                return structure
            structure.ops, structure.preds, structure.firsts = predecessors(structure.schedule)
            structure.pairs = fuse_pairs(structure.schedule, structure.ops, structure.preds)
            structure.device = list(map(DEVICE, structure.ops))
            structure.units = list(map(attrgetter("kind", "stage"), structure.ops))
        return structure

    def makespan(self, c: Candidate, structure: Structure, table, cost: list[float], links,
                 sharded: Sharded | None = None) -> float | None:
        """The simulated makespan with messages on their links (simulate's own timing of the order under
        `cost`, its ops' costs from `table`), None when the order deadlocks; with `sharded`, ZeRO 2/3's
        collectives on each device's lane as simulate times them (a fresh simulate.Lane of the order's
        sharding.Sharded.per_op); cached per (schedule, p, v, m, cost vector, links, collectives)."""
        from ..passes.simulate import Lane, order_makespan
        key = (c.structure_key(), tuple(sorted(table.items())), tuple(map(tuple, links)), sharded)
        if key in self.simulated and not self.request.exhaustive:
            self.counts["cache_hits"] += 1
            return self.simulated[key]
        lane = None
        if sharded is not None:  # per op, its gather and reduce-scatter: once per order and collectives
            if (key[0], sharded) not in self.lanes:
                self.lanes[key[0], sharded] = sharded.per_op(structure.schedule, structure.ops)
            lane = Lane(*self.lanes[key[0], sharded], structure.schedule.devices)
        messages = links if any(map(any, links)) else None  # none at all (the breakdown's): each arrival + 0.0 unread
        result = order_makespan(cost, structure.device, structure.preds, structure.firsts, messages, lane)
        self.counts["simulated"] += 1
        self.work += len(structure.ops)
        self.simulated[key] = result
        return result

    def twin_key(self, c: Candidate) -> tuple | None:
        """The candidate's layout and order: candidates with equal keys (the same order under other
        schedule names, as every schedule of one order at p = 1) predict alike, so the walk evaluates one
        and names the others in its row. None where nothing is merged (--exhaustive, --per, a schedule
        compiled whole, an order that cannot be built)."""
        r = self.request
        if r.exhaustive or r.per is not None or self.compiled_whole(c) or isinstance(self.shape(c), Refusal):
            return None
        structure = self.structure(c)
        if structure.error is not None:
            return None
        if structure.order is None:
            structure.order = self.orders.setdefault(order_identity(structure.schedule), len(self.orders))
        return (c.t, c.p, c.d, c.b, c.m, c.recompute, c.cp, c.zero, structure.order, c.ep)

    # evaluation -----------------------------------------------------------------------------------

    def evaluate(self, c: Candidate, free: bool = False) -> Prediction | Refusal:
        """The candidate's prediction, or why it is refused (a compile error, a deadlock, its memory
        over the limit). free: also the message-free simulation (the bubble of the breakdown)."""
        shape = self.shape(c)
        if isinstance(shape, Refusal):
            return shape
        if self.compiled_whole(c):
            return self._evaluate_plain(c, free)
        from ..passes.simulate import busy_times
        from ..passes.timing import Span
        st = self.setting(c)
        structure = self.structure(c)
        if structure.error is not None:
            return Refusal(structure.error)
        schedule = structure.schedule
        limit = schedule.memory_limit
        if limit is not None and any(peak > lim + 1e-9 for peak, lim in zip(structure.peaks, limit)):
            return Refusal("exceeds the schedule's own memory limit (in activations)")
        over = self._order_over_memory(st, c, structure)
        if over is not None:
            return over
        if self.prepare(structure).error is not None:
            return Refusal(structure.error)
        table = self.cost_table(st, c, shape)[0]
        cost = op_costs(structure, table)  # simulated with messages, without them, and the busy times
        sharded = self.sharded(st, c, shape)
        makespan = self.makespan(c, structure, table, cost, self.link_times(st, c, schedule.devices), sharded)
        if makespan is None:
            return Refusal(f"the order deadlocks (schedc check {shlex.quote(c.schedule)} {_defines(c)} shows where)",
                           fault=True)
        free_span, gathers = makespan, 0.0
        if free:  # as compile_for: the lanes' share of the message-free makespan is data-parallel time
            still = [[0.0] * schedule.devices] * schedule.devices
            free_span = self.makespan(c, structure, table, cost, still, sharded)
            if sharded is not None:
                gathers = free_span - self.makespan(c, structure, table, cost, still)
        busy = busy_times(cost, structure.device, schedule.devices)
        return predict(st, schedule, Span(makespan, busy, structure.peaks), free_span,
                       self.stage_costs(st, c, shape), self.request.global_batch, gathers)

    def _order_over_memory(self, st: Setting, c: Candidate, structure: Structure) -> Refusal | None:
        """The refusal of a candidate whose busiest device, by its order's activation peaks and held
        bytes (device_memory), passes the limit; None where it fits."""
        memory, _ = device_memory(st, structure.schedule, structure.peaks, self.held(st, c, structure.schedule))
        top = max(range(len(memory)), key=lambda k: (memory[k], -k))
        return self.over(memory[top], top) if memory[top] > self.limit else None

    def _evaluate_plain(self, c: Candidate, free: bool) -> Prediction | Refusal:
        """The whole compile of driver.cluster.compile_for (no shortcut): its prediction or its first error,
        once per candidate, and once more with the message-free simulation for those ranked (free)."""
        if (c, True) in self.whole:
            return self.whole[c, True]
        if (c, free) not in self.whole:
            self.counts["compiled_whole"] += (c, False) not in self.whole  # candidates, not compiles
            self.whole[c, free] = self._compile_whole(c, free)
        return self.whole[c, free]

    def _compile_whole(self, c: Candidate, free: bool) -> Prediction | Refusal:
        from ..driver.cluster import compile_for
        try:
            on = compile_for(c.schedule, c.params(), self.setting(c), lower=False, free=free)
        except SchedError as exc:
            return Refusal(exc.diagnostics[0].message)
        pred = on.prediction
        errors = [d for d in on.compiled.diagnostics if d.severity.value == "error" and d is not on.over_memory]
        if not on.compiled.timing.complete:  # a deadlock: its memory figure is of a partial run
            return Refusal(errors[0].message if errors else "the order deadlocks", fault=True)
        if pred.memory_bytes > self.limit:
            return self.over(pred.memory_bytes, pred.extra["largest_memory_device"])
        return Refusal(errors[0].message) if errors else pred

    # the walk -----------------------------------------------------------------------------------

    def run(self, space: list[Candidate] | None = None) -> Outcome:
        """The walk over `space` (the request's candidates, computed here unless the caller has them)."""
        start = time.perf_counter()
        r = self.request
        if space is None:
            space = candidates(self.model, list(self.entries.values()), r)
        self.counts["candidates"] = len(space)
        families: dict[tuple, Family] = {}
        bounded = self._bounded(space, families)
        best: dict[Any, list[Kept]] = {}   # group -> heap, worst on top: the K best so far
        rows: dict[tuple, Candidate] = {}  # twin_key -> the candidate evaluated for it
        same: dict[Candidate, list[Candidate]] = {}
        left = self._walk(bounded, families, best, (rows, same))
        stopped = self._stop(left, families) if left is not None else None  # the budget spent
        kept_all = sorted((kept for group in best.values() for kept in group), key=lambda k: k.key)
        ranked = [Ranked(kept.key[1], self.evaluate(kept.key[1], free=True), tuple(same.get(kept.key[1], ())))
                  for kept in kept_all]  # best first
        pruned = tuple(family_lines(families, r, self.counts, self.cluster.gpus_per_node))
        return Outcome(r, tuple(ranked), pruned, dict(self.counts), self.describe_space(space),
                       time.perf_counter() - start, stopped)

    def _walk(self, bounded: list[tuple[float, Candidate]], families: dict[tuple, Family],
              best: dict[Any, list[Kept]], merged: tuple[dict, dict]) -> list[tuple[float, Candidate]] | None:
        """The walk over `bounded` (by increasing bound), keeping the K best of each group in `best`
        and merging twins (`merged`: twin key -> the candidate evaluated for it, and each such
        candidate's twins); what is left of `bounded` where the budget is spent, else None."""
        r = self.request
        rows, same = merged
        for n, (bound, c) in enumerate(bounded):
            heap = best.setdefault(c.group(r.per), [])
            threshold = heap[0].key[0] if len(heap) >= r.top else math.inf
            if bound > threshold * (1 + SLACK):
                rest = bounded[n + 1:] if r.per is None else []  # sorted: every later one is bounded too
                for later_bound, later in [(bound, c)] + rest:
                    families[(later.schedule, later.t, later.p)].note_bound(later_bound, threshold)
                self.counts["bounded"] += 1 + len(rest)
                self.progress(1 + len(rest))
                if rest:
                    break
                continue
            if r.walk_ops and self.work >= r.walk_ops:
                return bounded[n:]
            fam = families[(c.schedule, c.t, c.p)]
            refused = self.start_bound(c)
            if refused is not None:
                self._refuse(fam, c, refused)
                self.progress(1)
                continue
            twin = self.twin_key(c)  # its structure is the one evaluate's memory check reads: none built for it alone
            if twin in rows:  # an order already timed under this layout: its row names this schedule too
                same.setdefault(rows[twin], []).append(c)
                self.counts["merged"] += 1
                fam.simulated += 1
                self.progress(1)
                continue
            result = self.evaluate(c)
            self.progress(1)
            if isinstance(result, Refusal):
                self._refuse(fam, c, result)
                continue
            if twin is not None:
                rows[twin] = c
            fam.simulated += 1
            kept = Kept((result.iteration_s, c))
            if len(heap) < r.top:
                heapq.heappush(heap, kept)
            elif kept.key < heap[0].key:
                heapq.heapreplace(heap, kept)
        return None

    def _stop(self, left: list[tuple[float, Candidate]], families: dict[tuple, Family]) -> Stop:
        """The walk's budget spent: the candidates `left` (by increasing bound) noted in their families
        as not walked; none of them is faster than the first one's bound."""
        for bound, c in left:
            families[(c.schedule, c.t, c.p)].note_left(bound)
        self.counts["left"] = len(left)
        self.progress(len(left))
        return Stop(self.request.walk_ops, self.work, len(left), left[0][0])

    def _bounded(self, space: list[Candidate], families: dict[tuple, Family]) -> list[tuple[float, Candidate]]:
        """(bound, candidate) of those not refused by their bound, by increasing bound; each family noted."""
        bounded = []
        for c in space:
            fam = families.setdefault((c.schedule, c.t, c.p), Family())
            bound = self.bound(c)
            if isinstance(bound, Refusal):
                self._refuse(fam, c, bound)
            else:
                bounded.append((bound, c))
        self.progress(len(space) - len(bounded))
        return sorted(bounded)

    def rank(self, target: Candidate, space: list[Candidate]) -> tuple[int, int]:
        """Where a candidate that runs ranks in `space` by (iteration time, candidate), as the walk
        ranks: (overall, among its schedule's), exactly, every candidate whose bound is below its time
        simulated."""
        result = self.evaluate(target)
        assert not isinstance(result, Refusal), result
        key = (result.iteration_s, target)
        overall = family = 1
        for c in space:
            self.progress(1)
            bound = self.bound(c) if c != target else math.inf
            if isinstance(bound, Refusal) or bound > key[0] * (1 + SLACK):
                continue
            other = self.evaluate(c)
            if not isinstance(other, Refusal) and (other.iteration_s, c) < key:
                overall += 1
                family += c.schedule == target.schedule
        return overall, family

    def _refuse(self, fam: Family, c: Candidate, refusal: Refusal) -> None:
        if refusal.layers:
            self.counts["layers"] += 1
            fam.layers = refusal.message
            return
        if refusal.fault:
            fam.fault = fam.fault or refusal.message
            self.counts["refused"] += 1
            self.counts["deadlocked"] += 1
            return
        if refusal.memory is None:
            fam.refused = fam.refused or refusal.message
            self.counts["refused"] += 1
            return
        self.counts["over_memory"] += 1
        key = (refusal.bound, refusal.memory)  # a candidate's own figure before any lower bound
        if fam.over is None or key < fam.over[0]:
            v = f", v={c.v}" if c.v is not None else ""
            least = "the least lower bound of the family" if refusal.bound else "the least of the family"
            fam.over = (key, f"{refusal.message}; {least}, at b={c.b}{v}, recompute {c.recompute}")

    def describe_space(self, space: list[Candidate]) -> str:
        def values(name):
            found = sorted({getattr(c, name) for c in space if getattr(c, name) is not None})
            return "{" + ", ".join(map(str, found)) + "}"
        v = f"v in {values('v')}, " if any(c.v is not None for c in space) else ""
        cp = f"cp in {values('cp')}, " if any(c.cp > 1 for c in space) else ""
        zero = f", zero in {values('zero')}" if self.request.zero == () else ""
        ep = f", ep in {values('ep')}" if any(c.ep != 1 for c in space) else ""
        return (f"{plural(len(space), 'candidate')} over {', '.join(self.entries)}: t in {values('t')}, {cp}p in {values('p')}, "
                f"{v}b in {values('b')}, recompute {', '.join(self.request.recompute)}{zero}{ep}")


def search(request: Request, progress: Callable[[int], None] | None = None) -> Outcome:
    """The ranked configurations for a request (SchedError on bad input: exit 2, or 1 when nothing fits)."""
    return Searcher(request, progress).run()


def order_identity(schedule) -> tuple:
    """What makes two elaborated schedules the same to the prediction: devices, pipelines (stages,
    placement, microbatches), replicas, every device's order, and what the memory model reads."""
    pipes = tuple((p.stages, p.placement, p.microbatches) for p in schedule.pipelines)
    return (schedule.devices, pipes, schedule.replicas, schedule.orders, schedule.activation, schedule.memory_limit,
            schedule.split_backward, tuple(sorted(schedule.memory.items())), schedule.split_of, schedule.fused)


def _defines(c: Candidate) -> str:
    return " ".join(f"-D {k}={v}" for k, v in c.params().items())


