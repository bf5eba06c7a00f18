"""synthesize: find a per-device order under an activation-memory limit (`schedc tune --synthesize`)
and write it as a `.sched` file with explicit lists, which the compiler then checks like any schedule.

    p=4, m=8, F=I=W=1, latency 1, limit 4 activations per device
    -> makespan 39 (the zero-bubble repo's heuristic 41, ZB-H1 41, lower bound 33)

The problem: p stages on p devices (stage s on device s), m microbatches, per-stage costs of F and B
or of F, I and W (`backward split`), a latency per message between devices, and a limit on the
activations alive per device, counted as the compiler's memory model counts them (schedc/passes/memory.py):
F holds one unit from its start until its B ends, or its W with a split backward (I frees nothing);
or, given a model, in the cost model's bytes (problem.bytes_held): I frees F's activations but for
what its deferred W reads, which W frees.

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
from collections.abc import Callable

from ..diagnostics import SCHEDULE
from .local_search import Timer, improve
from .problem import (
    ALTERNATE,
    GREEDY_BUDGET,
    GUARDED,
    RANK,
    SEARCH_BUDGET,
    STARTS,
    TOLERANCE,
    WEIGHTS,
    F,
    Problem,
    Synthesis,
    W,
    X,
    option_error,
)


def synthesize(problem: Problem, progress: Callable[[int, int], None] | None = None) -> Synthesis:
    """The best deadlock-free orders within `problem.limit` found by the three steps of the module
    header; `progress(done, total)` is told after each greedy variant. SchedError (exit 1) when no
    order fits: a device's limit below one activation."""
    small = [d for d, x in enumerate(problem.limit) if x < problem.memory[F][d] - TOLERANCE]
    if small:
        d = small[0]
        raise option_error(f"no order fits: device {d} has a memory limit of {problem.limit[d]:g} "
                           f"{problem.unit}, and a forward holds {problem.memory[F][d]:g}", kind=SCHEDULE)
    timer = Timer(problem)
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


def _greedy_starts(problem: Problem, timer: "Timer", bound: float,
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


def _search(timer: "Timer", starts: list[tuple], bound: float) -> tuple:
    """Step 3 from the STARTS best: (score, variant number, variant, orders, improved) of the best."""
    best = None
    ops = sum(map(len, starts[0][3])) if starts else 1
    budget = timer.count + max(50, SEARCH_BUDGET // ops)
    for score, n, variant, orders in starts[:STARTS]:
        if best is not None and best[0][0] <= bound + TOLERANCE:
            break  # optimal already
        improved, improved_score = orders, score
        if score[0] > bound + TOLERANCE and timer.count < budget:
            improved, improved_score = improve(timer, orders, score, bound, budget)
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
    limits = [min(int(x / problem.memory[F][d] + TOLERANCE), problem.m)  # never more than m forwards
              for d, x in enumerate(problem.limit)]
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
        self.alive = [0.0] * p
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
            if i >= m or not self._admits(d, kind):
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
        return self.next[d][F] < self.pr.m and not self._admits(d, F)

    def _admits(self, d: int, kind: int) -> bool:
        """Whether device d's memory lets its next op of `kind` run: before its first backward no more
        forwards than the warm-up cap; an op that allocates only within the limit (a deferred W's
        inputs count: with bytes, I allocates them)."""
        if kind == F and self.next[d][X] == 0 and self.next[d][F] >= self.warm[d]:
            return False
        grows = self.pr.memory[kind][d]
        return grows <= 0 or self.alive[d] + grows <= self.pr.limit[d] * (1 + TOLERANCE)

    def run(self, start: float, d: int, kind: int) -> None:
        pr = self.pr
        i = self.next[d][kind]
        self.next[d][kind] += 1
        self.end[(kind, d, i)] = self.free[d] = start + pr.costs[kind][d]
        self.alive[d] += pr.memory[kind][d]
        if kind != W:
            self.last[d] = kind
        self.orders[d].append((kind, d, i))


