"""synthesize: find a per-device order under an activation-memory limit (`schedc tune --synthesize`)
and write it as a `.sched` file with explicit lists, which the compiler then checks like any schedule.

    p=4, m=8, F=I=W=1, latency 1, limit 4 activations per device
    -> makespan 39 (the zero-bubble repo's heuristic 41, ZB-H1 41, lower bound 33)

The problem: p stages on p devices (stage s on device s), m microbatches, per-stage costs of F and B
or of F, I and W (`backward split`), a latency per message between devices, and a limit on the
activations alive per device, counted as the compiler's memory model counts them (schedc/memory.py):
F holds one unit from its start until its B ends, or its W with a split backward (I frees nothing).

How, in three steps, all deterministic (ties go to the lower device, microbatch and variant):
1. list scheduling: whenever a device is free it runs, of the ops whose inputs have arrived, the
   input gradient (or B) first, then the forward — admitted only while the device holds fewer
   activations than its cap —, then the weight gradient (zero bubble's ranking I > F > W); each kind
   in microbatch order;
2. a grid of variants of that rule, as zero bubble's automatic scheduler varies its own: the cap on
   warm-up forwards (before a device's first backward) per device, whether a weight gradient may
   start when it would delay an input gradient or forward about to arrive, and whether a device
   alternates forward and backward (running a W first when memory keeps the forward out);
3. a bounded local search on the best orders: move an op of the critical path that waited for the op
   before it on its device up to MOVE_BACK places earlier, re-time in order, keep the move when the
   makespan (then the sum of all ops' end times) drops and memory stays within the limit.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from .diagnostics import SCHEDULE, USAGE, SchedError, Source, error
from .frontend.elaborate import MAX_DEVICES, MAX_OPS  # the language's bounds (docs/language.md)
from .ops import DEFAULT_COSTS, OpKind, builtin_deps, builtin_kinds, cost_range, in_cost_range

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


@dataclass(frozen=True, slots=True)
class Problem:
    """What to order: `costs[kind][stage]` for F, X (B or I) and, when `split`, W; `limit[device]`."""

    p: int
    m: int
    costs: tuple[tuple[float, ...], ...]
    split: bool
    latency: float
    limit: tuple[float, ...]

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

    def lower_bound(self) -> float:
        """No order beats this, the larger of two bounds per device d:
        - work: d's first forward waits for the forwards above it and their messages, then d runs all
          its own ops;
        - memory: an activation of d lives at least `life` (its forward, the forwards below, the
          backwards back up, its W, and the messages between), and with L = limit slots the k-th
          forward of d cannot start before the (k-L)-th one's activation is freed: t_k >= t_(k-L) + life,
          t_k >= t_(k-1) + F; the last one still has its own `life` to live."""
        return _lower_bound(self)


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
        life = trip[d] + 2 * (p - 1 - d) * lat + (pr.costs[W][d] if pr.split else 0)
        slots = max(1, int(min(pr.limit[d], pr.m)))
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
                 limit: tuple[float, ...], where: dict[str, str] | None = None) -> Problem:
    """Check the inputs (SchedError, exit 2) and fix the op kinds: `costs` names F and B, or F, I and W,
    each with one value or one per stage; `limit` has one value or one per device. `where` names
    where a kind's costs came from, for the messages (`--cost F`, `--costs FILE, F`)."""
    if p < 1 or m < 1:
        raise option_error(f"p and m must be at least 1 (got p={p}, m={m})")
    if p > MAX_DEVICES:
        raise option_error(f"p={p:,} devices, more than the {MAX_DEVICES:,} a schedule may have")
    split = OpKind.I.value in costs or OpKind.W.value in costs
    if split and OpKind.B.value in costs:
        raise option_error("give the backward as B, or split as I and W, not both")
    names = builtin_kinds(split)
    if len(names) * p * m > MAX_OPS:
        raise option_error(f"p={p}, m={m} would make {len(names) * p * m:,} ops ({p:,} stages x {m:,} microbatches x "
                           f"{len(names)} op kinds), more than the {MAX_OPS:,} a schedule may have")
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
    return Problem(p, m, table, split, float(latency), limits)


def _per_stage(name: str, values: tuple[float, ...], p: int, what: str) -> tuple[float, ...]:
    if len(values) == 1:
        return tuple(float(values[0]) for _ in range(p))
    if len(values) != p:
        raise option_error(f"{name}: {len(values)} values; give one, or one per {what} ({p})")
    return tuple(float(v) for v in values)


def synthesize(problem: Problem, progress: Callable[[int, int], None] | None = None) -> Synthesis:
    """The best deadlock-free orders within `problem.limit` found by the three steps of the module
    header; `progress(done, total)` is told after each greedy variant. SchedError (exit 1) when no
    order fits: a device's limit below one activation."""
    small = [d for d, x in enumerate(problem.limit) if x < 1]
    if small:
        raise option_error(f"no order fits: device {small[0]} has a memory limit of "
                            f"{problem.limit[small[0]]:g} activation units, and a forward holds 1", kind=SCHEDULE)
    timer = _Timer(problem)
    bound = problem.lower_bound()
    starts = _greedy_starts(problem, timer, bound, progress)
    (makespan, _), n, variant, orders, searched = _search(timer, starts, bound)
    caps, guard, alternate = variant
    shown = (f"{caps[0]} on every device" if len(set(caps)) == 1 else str(list(caps)) if len(caps) <= 8
             else f"[{caps[0]}, {caps[1]}, ..., {caps[-1]}] on devices 0 to {len(caps) - 1}")
    found = (f"greedy variant {n} (warm-up caps {shown}" + (f", {guard} W" if problem.split else "")
             + (", alternating)" if alternate else ")"))
    named = tuple(tuple((problem.name(k), s, i) for k, s, i in order) for order in orders)
    return Synthesis(problem, named, makespan, timer.peaks(orders), timer.count,
                     found + (" + local search" if searched else ""))


def _greedy_starts(problem: Problem, timer: "_Timer", bound: float,
                   progress: Callable[[int, int], None] | None) -> list[tuple]:
    """Steps 1 and 2: (score, variant number, variant, orders) of the variants run, best first; the
    grid stops at an order that reaches `bound`, or once GREEDY_BUDGET ops have been placed in all."""
    starts, placed = [], 0
    ops = problem.kinds * problem.p * problem.m
    variants = _variants(problem)
    for n, variant in enumerate(variants):
        if starts and placed + ops > GREEDY_BUDGET:
            break
        orders = _list_schedule(problem, *variant)
        placed += ops
        if progress is not None:
            progress(n + 1, len(variants))
        if orders is not None:
            starts.append((timer.score(orders), n, variant, orders))
            if starts[-1][0][0] <= bound + TOLERANCE:  # optimal: nothing can beat it
                break
    starts.sort(key=lambda item: (item[0], item[1]))
    return starts


def _search(timer: "_Timer", starts: list[tuple], bound: float) -> tuple:
    """Step 3 from the STARTS best: (score, variant number, variant, orders, improved) of the best."""
    best = None
    ops = sum(map(len, starts[0][3])) if starts else 1
    budget = timer.count + max(50, SEARCH_BUDGET // ops)
    for score, n, variant, orders in starts[:STARTS]:
        if best is not None and best[0][0] <= bound + TOLERANCE:
            break  # optimal already
        improved, improved_score = orders, score
        if score[0] > bound + TOLERANCE and timer.count < budget:
            improved, improved_score = _improve(timer, orders, score, bound, budget)
        candidate = (improved_score, n, variant, improved, improved_score < score)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    return best


# Step 1 and 2: list scheduling and its variants ---------------------------------------------------

def _variants(problem: Problem) -> list[tuple[tuple[int, ...], str, bool]]:
    """(warm-up cap per device, W policy, alternate) triples: caps a - slope*d for a up to the largest
    limit and slopes 0, 1, 2, each clipped to [1, limit], without repeats, in a fixed order; `alternate`
    ranks the forward first right after a backward (1F1B's rhythm) instead of always second."""
    p = problem.p
    limits = [min(int(x), problem.m) for x in problem.limit]  # a device never holds more than m forwards
    seen, out = set(), []
    for top in range(max(limits), 0, -1):
        for slope in (1, 2, 0):
            caps = tuple(max(1, min(limits[d], top - slope * d)) for d in range(p))
            if caps not in seen:
                seen.add(caps)
                out += [(caps, guard, alternate) for alternate in (False, True)
                        for guard in (WEIGHTS if problem.split else WEIGHTS[:1])]
    return out


def _list_schedule(problem: Problem, warm: tuple[int, ...], guard: str,
                   alternate: bool) -> list[list[tuple]] | None:
    """Step 1 with the caps and flags of one variant: the orders, or None if the devices would wait
    forever. A device's next decision changes only when it or a neighbour places an op."""
    state = _ListState(problem, warm, guard, alternate)
    p = problem.p
    heap: list[tuple[tuple[float, int, int], int]] = []  # (decision, its version): the least is next
    version = [0] * p

    def decide(d: int) -> None:
        version[d] += 1  # the device's earlier decision, still in the heap, is out of date
        decision = state.decide(d)
        if decision is not None:
            heapq.heappush(heap, (decision, version[d]))

    for d in range(p):
        decide(d)
    for _ in range(problem.kinds * p * problem.m):
        while heap and heap[0][1] != version[heap[0][0][1]]:
            heapq.heappop(heap)
        if not heap:
            return None
        pick = heapq.heappop(heap)[0]
        state.run(*pick)
        d = pick[1]
        for near in range(max(0, d - 1), min(p, d + 2)):  # the device and its neighbours
            decide(near)
    return state.orders


class _ListState:
    """The list scheduler's state: per device its free time, activations held, the kind it ran last
    and per kind the next microbatch; the end time of every op placed. A weight gradient runs when it
    is the best ready op (`eager`), or (`guarded`) not when an input gradient or forward arrives
    before it would end. With `alternate`, a forward is due after each backward, and when memory keeps
    it out a ready W runs first to free it (the 1F1B1W rhythm of ZB-H1 and ZB-H2)."""

    def __init__(self, problem: Problem, warm: tuple[int, ...], guard: str, alternate: bool):
        self.pr, self.warm, self.guard, self.alternate = problem, warm, guard, alternate
        self.deps = problem.deps()
        p = problem.p
        self.end: dict[tuple[int, int, int], float] = {}
        self.next = [[0] * problem.kinds for _ in range(p)]
        self.free = [0.0] * p
        self.alive = [0] * p
        self.last = [W] * p
        self.orders: list[list[tuple]] = [[] for _ in range(p)]

    def ready(self, d: int) -> list[tuple[float, int]]:
        """(earliest start, kind) of device d's next op of each kind whose inputs are placed: the
        device's free time or the inputs' arrival, whichever is later. Left out: kinds with no op left,
        or whose inputs are not placed yet, and a forward the memory cap does not admit."""
        pr, end, nxt, free = self.pr, self.end, self.next[d], self.free[d]
        lat, m, out = pr.latency, pr.m, []
        for kind in range(pr.kinds):
            i = nxt[kind]
            if i >= m or (kind == F and self.alive[d] >= self._cap(d)):
                continue
            start = free
            for k, s, remote in self.deps[kind][d]:
                got = end.get((k, s, i))
                if got is None:
                    break
                start = max(start, got + lat) if remote else max(start, got)
            else:
                out.append((start, kind))
        return out

    def decide(self, d: int) -> tuple[float, int, int] | None:
        """(start time, device, kind) of device d's next op under the ranking, or None if unknown."""
        known = self.ready(d)
        if not known:
            return None
        rank = ALTERNATE if self.alternate and self.last[d] == X else RANK
        start = min(t for t, _ in known)
        kind = min((k for t, k in known if t <= start), key=rank.__getitem__)
        if rank is ALTERNATE and kind == X and self._blocked(d) and (start, W) in known:
            kind = W  # the forward due after a backward waits for memory: free it first (1F1B1W)
        if kind == W and self.guard == GUARDED:
            cost = self.pr.costs[W][d]
            sooner = [t for t, k in known if k != W and t < start + cost]
            if sooner:  # an input gradient or forward arrives before the W would end: wait for it
                at = min(sooner)
                return at, d, min((k for t, k in known if k != W and t <= at), key=rank.__getitem__)
        return start, d, kind

    def _blocked(self, d: int) -> bool:
        """Whether device d has a forward left that its memory cap keeps out."""
        nxt = self.next[d]
        return nxt[F] < self.pr.m and self.alive[d] >= self._cap(d)

    def _cap(self, d: int) -> int:
        """Activations device d may hold before its next forward: the warm-up cap until its first
        backward, then the limit's whole units."""
        return self.warm[d] if self.next[d][X] == 0 else math.floor(self.pr.limit[d])

    def run(self, start: float, d: int, kind: int) -> None:
        pr = self.pr
        i = self.next[d][kind]
        self.next[d][kind] += 1
        self.end[(kind, d, i)] = self.free[d] = start + pr.costs[kind][d]
        if kind == F:
            self.alive[d] += 1
        elif kind == pr.kinds - 1:
            self.alive[d] -= 1
        if kind != W:
            self.last[d] = kind
        self.orders[d].append((kind, d, i))


# Step 3: timing in order and local search ----------------------------------------------------------

class _Timer:
    """Times orders as the compiler's simulator does (each op at the later of its device being free and
    its inputs' arrival), counts activations per device, and scores orders."""

    def __init__(self, problem: Problem):
        self.pr = problem
        self.deps = problem.deps()
        self.count = 0
        readers: list[set[int]] = [set() for _ in range(problem.p)]  # devices whose ops wait for stage t's
        for by_stage in self.deps:
            for s, inputs in enumerate(by_stage):
                for _, t, _ in inputs:
                    readers[t].add(s)
        self.readers = [sorted(r) for r in readers]

    def times(self, orders) -> dict[tuple, tuple[float, float]] | None:
        """(start, end) of every op, or None when the orders deadlock. A device is revisited only when
        a device it waits for has placed an op (device s runs stage s), so a chain costs its length,
        not its length times p; the times do not depend on the visiting order."""
        pr, p = self.pr, self.pr.p
        self.count += 1
        span: dict[tuple, tuple[float, float]] = {}
        pos, free = [0] * p, [0.0] * p
        left = sum(map(len, orders))
        queued = [True] * p
        todo = list(range(p - 1, -1, -1))  # a stack of devices to visit
        while todo:
            d = todo.pop()
            queued[d] = False
            order, placed = orders[d], False
            while pos[d] < len(order):
                op = order[pos[d]]
                start = self._start(op, span, free[d])
                if start is None:
                    break
                span[op] = (start, start + pr.costs[op[0]][d])
                free[d] = span[op][1]
                pos[d] += 1
                left -= 1
                placed = True
            if placed:
                for r in self.readers[d]:
                    if r != d and not queued[r]:
                        queued[r] = True
                        todo.append(r)
        return span if left == 0 else None

    def _start(self, op, span, free: float) -> float | None:
        kind, s, i = op
        lat, start = self.pr.latency, free
        for k, t, remote in self.deps[kind][s]:
            got = span.get((k, t, i))
            if got is None:
                return None
            start = max(start, got[1] + (lat if remote else 0.0))
        return start

    def peaks(self, orders) -> tuple[int, ...]:
        release = self.pr.kinds - 1
        out = []
        for order in orders:
            alive = peak = 0
            for kind, _, _ in order:
                alive += 1 if kind == F else -1 if kind == release else 0
                peak = max(peak, alive)
            out.append(peak)
        return tuple(out)

    def score(self, orders, span=None) -> tuple[float, float]:
        """(makespan, sum of every op's end time); infinite for orders that deadlock."""
        span = span if span is not None else self.times(orders)
        if span is None:
            return (math.inf, math.inf)
        ends = [span[order[-1]][1] for order in orders]
        return (max(ends), sum(end for _, end in span.values()))


def _improve(timer: _Timer, orders: list[list[tuple]], score: tuple[float, float], bound: float,
             budget: int):
    """Step 3 from `orders`, until no move helps, the makespan reaches `bound` or `budget` orders have
    been timed in all: the improved orders and their score."""
    orders = [list(order) for order in orders]
    span = timer.times(orders)
    improved = True
    while improved and timer.count < budget and score[0] > bound + TOLERANCE:
        improved = False
        for d, n, back in _critical_moves(timer.pr, orders, span):
            trial = list(orders)
            trial[d] = _moved(orders[d], n, back)
            if not _memory_ok(timer, trial, d):
                continue
            trial_span = timer.times(trial)
            trial_score = timer.score(trial, trial_span)
            if trial_score < score:
                orders, span, score, improved = trial, trial_span, trial_score, True
                break
            if timer.count >= budget:
                break
    return orders, score


def _moved(order: list[tuple], n: int, back: int) -> list[tuple]:
    """`order` with its op at n moved `back` places earlier."""
    out = list(order)
    out.insert(n - back, out.pop(n))
    return out


def _memory_ok(timer: _Timer, orders, d: int) -> bool:
    release = timer.pr.kinds - 1
    alive = 0
    for kind, _, _ in orders[d]:
        alive += 1 if kind == F else -1 if kind == release else 0
        if alive > timer.pr.limit[d]:
            return False
    return True


def _critical_moves(problem: Problem, orders, span) -> list[tuple[int, int, int]]:
    """(device, position, places back) of moves that start a critical op earlier: an op on a critical
    path that started when the op before it on its device ended, moved 1 to MOVE_BACK places earlier,
    past ops it does not depend on and not past one of its own kind (each kind stays in microbatch
    order); latest first. The path is walked back from the op that ends last."""
    position = {op: (d, n) for d, order in enumerate(orders) for n, op in enumerate(order)}
    op = max(span, key=lambda o: (span[o][1], -position[o][0]))
    out = []
    deps = problem.deps()
    while op is not None:
        d, n = position[op]
        start = span[op][0]
        prev = orders[d][n - 1] if n > 0 else None
        if prev is not None and abs(span[prev][1] - start) <= TOLERANCE:
            for back in range(1, min(MOVE_BACK, n) + 1):
                jumped = orders[d][n - back]
                if jumped[0] == op[0] or (jumped[2] == op[2] and op[0] > jumped[0]):
                    break
                out.append((d, n, back))
            op = prev
            continue
        here, op = op, None
        for k, t, remote in deps[here[0]][here[1]]:
            dep = (k, t, here[2])
            if abs(span[dep][1] + (problem.latency if remote else 0.0) - start) <= TOLERANCE:
                op = dep
                break
    return out


# Writing the .sched file -----------------------------------------------------------------------------

def number(x: float) -> str:
    """x as the .sched file writes it: short where that is exact (`1`, `0.5`, `1e+06`), else Python's
    shortest round-trip form, so that the file times exactly what was searched (2.011054 was written
    2.01105, and the file's makespan fell below the search's lower bound)."""
    short = f"{x:g}"
    return short if float(short) == float(x) else repr(float(x))


def listed(row: tuple[float, ...]) -> str:
    """One value, or the values per device comma-separated (as --memory-limit takes them)."""
    return number(row[0]) if len(set(row)) == 1 else ",".join(map(number, row))


def count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _per_stage_expr(row: tuple[float, ...], var: str = "s") -> str:
    """One value, or a chain over the runs of equal values: `1 if s < 2 else 2` for 1, 1, 2, 2."""
    runs: list[tuple[int, float]] = []  # (first index, value) of each run
    for i, x in enumerate(row):
        if not runs or runs[-1][1] != x:
            runs.append((i, x))
    expr = number(runs[-1][1])
    for (_, x), (end, _) in zip(reversed(runs[:-1]), reversed(runs[1:])):
        expr = f"{number(x)} if {var} < {end} else {expr}"
    return expr


def peaks_text(peaks) -> str:
    """Activation peaks per device, or past 16 devices the first and last few and the largest."""
    shown = [number(x) for x in peaks]
    if len(shown) <= 16:
        return " ".join(shown)
    return " ".join(shown[:8]) + " ... " + " ".join(shown[-2:]) + f" (at most {number(max(peaks))})"


def _listed_row(row: tuple[float, ...]) -> str:
    """The command line's form of per-stage values: `1` or `1,1,2,2`."""
    return number(row[0]) if len(set(row)) == 1 else ",".join(map(number, row))


def to_sched(result: Synthesis, name: str = "synthesized", width: int = 100) -> str:
    """The .sched text: literal per-device lists, the costs and the memory limit, with a header comment
    saying what was asked and found (the latency is a command-line option, noted in the comment)."""
    pr = result.problem
    names = KIND_NAMES if pr.split else FULL_NAMES
    costs = ", ".join(f"{n}={_listed_row(row)}" for n, row in zip(names, pr.costs))
    limit = _per_stage_expr(pr.limit, "d")
    lines = [
        f"# Synthesized by `schedc tune --synthesize`: p={pr.p}, m={pr.m}, {costs}, latency {number(pr.latency)},",
        f"# activation limit {_listed_row(pr.limit)} per device. Makespan {number(result.makespan)} "
        f"(lower bound {number(pr.lower_bound())}), peak activations {peaks_text(result.peak)};",
        f"# found by {result.found_by}, {count(result.timed, 'order')} timed.",
        f"# Simulate with the same latency: schedc simulate FILE --latency {number(pr.latency)}",
        f'schedule {name} "order synthesized under a limit of {_listed_row(pr.limit)} activations per device"',
        f"devices {pr.p}",
        f"pipeline main {{ stages {pr.p}; device s -> s; microbatches {pr.m} }}",
    ]
    if pr.split:
        lines.append("backward split")
    lines += [f"cost {n}(s) = {_per_stage_expr(row)}" if len(set(row)) > 1 else f"cost {n} = {number(row[0])}"
              for n, row in zip(names, pr.costs)]
    lines.append(f"limit memory <= {limit}")
    for d, order in enumerate(result.orders):
        lines += _device_block(d, order, width)
    return "\n".join(lines) + "\n"


def _device_block(d: int, order, width: int) -> list[str]:
    items = [f"{kind}({s}, {i})" for kind, s, i in order]
    out, line = [f"on device {d} {{"], "  "
    for item in items:
        if len(line) + len(item) + 1 > width and line.strip():
            out.append(line.rstrip())
            line = "  "
        line += item + " "
    if line.strip():
        out.append(line.rstrip())
    out.append("}")
    return out


__all__ = ["Problem", "Synthesis", "make_problem", "synthesize", "to_sched", "option_error", "number", "listed",
           "count"]
