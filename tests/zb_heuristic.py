"""References for order synthesis, independent of schedc (nothing here imports it).

* ``simulate`` — a tiny timer for one stage per device: each op starts when its device is free and its
  inputs have arrived (``latency`` per message between devices), in the device's order; memory counts
  one activation from a forward's start until its weight gradient (or full backward) ends.
* ``heuristic`` — the zero-bubble repo's heuristic scheduler (sail-sg/zero-bubble-pipeline-parallelism,
  ``zerobubble/scheduler/zb.py``: ``manual_order`` under its eight flag settings, ``initial_solution``),
  written afresh from its rules: a first round that lets each stage take as many warm-up forwards as
  memory allows and fit before the first input gradient comes back (fewer than the stage before it);
  then per microbatch one forward per stage (skipped on a stage far enough ahead when that would only
  delay the next input gradient, or when the wait it leaves is within the largest bubble so far),
  weight gradients run first when memory needs them and to fill waits for inputs; then the input
  gradients from the last stage up. Its memory is this module's: a forward +1, an input gradient 0, a
  weight gradient -1, against ``limit`` per device.
* ``zb_h1`` — ZB-H1 (Qi et al. 2024, ZB1P; torch's ScheduleInterleavedZeroBubble with one stage per rank):
  1F1B's warm-up (p-1-d forwards), then forward + input gradient per step, the weight gradient of the
  oldest microbatch from step d on; the weight gradients left over close the step. Peak memory p.
* ``zb_h2`` — ZB-H2: 2(p-1-d)+1 warm-up forwards (enough to cover the wait for the first input
  gradient), then input gradient and forward alternating while forwards remain, a W first whenever the
  forward would hold more than 2p; then the tail as the paper reorders it into a parallelogram: (W, I)
  pairs, then the weight gradients left. With m <= 2p it is the shape drawn in the comment of the
  heuristic's ``manual_order``. Peak memory at most 2p.

Orders are lists per device of ``(kind, stage, microbatch)``, kinds ``F``, ``B``, ``I``, ``W``.
"""

from __future__ import annotations

import itertools

Op = tuple


def simulate(orders: list[list[Op]], costs: dict[str, float], latency: float = 0.0):
    """(makespan, peak activations per device); raises ValueError on a deadlock."""
    p = len(orders)
    end: dict[Op, float] = {}
    pos = [0] * p
    free = [0.0] * p
    alive = [0] * p
    peak = [0] * p
    release = "W" if any(op[0] == "W" for order in orders for op in order) else "B"
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for d in range(p):
            while pos[d] < len(orders[d]):
                kind, s, i = op = orders[d][pos[d]]
                deps = _deps(kind, s, i, p, release)
                if any(dep not in end for dep in deps):
                    break
                ready = max([free[d]] + [end[dep] + (latency if dep[1] != s else 0.0) for dep in deps])
                end[op] = free[d] = ready + costs[kind]
                if kind == "F":
                    alive[d] += 1
                    peak[d] = max(peak[d], alive[d])
                elif kind == release:
                    alive[d] -= 1
                pos[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("deadlock")
    return max(free), peak


def _deps(kind: str, s: int, i: int, p: int, release: str) -> list[Op]:
    if kind == "F":
        return [("F", s - 1, i)] if s > 0 else []
    if kind in ("B", "I"):
        return [("F", s, i)] + ([(kind, s + 1, i)] if s < p - 1 else [])
    return [("I", s, i)]


# --------------------------------------------------------------------------------------------
# ZB-H1 and ZB-H2
# --------------------------------------------------------------------------------------------

def zb_h1(p: int, m: int) -> list[list[Op]]:
    orders = []
    for d in range(p):
        warm = min(p - 1 - d, m)
        ops = [("F", d, i) for i in range(warm)]
        weights = 0
        for step in range(m):  # steps after the warm-up: forward (while any) + input gradient
            if warm + step < m:
                ops.append(("F", d, warm + step))
            ops.append(("I", d, step))
            if step >= d:
                ops.append(("W", d, weights))
                weights += 1
        ops += [("W", d, k) for k in range(weights, m)]
        orders.append(ops)
    return orders


def zb_h2(p: int, m: int) -> list[list[Op]]:
    orders = []
    for d in range(p):
        warm = min(2 * (p - 1 - d) + 1, m)
        ops = [("F", d, i) for i in range(warm)]
        weights = 0
        for k in range(m - warm):  # (I F), a W first whenever the F would hold more than 2p
            ops.append(("I", d, k))
            if warm + k - weights >= 2 * p:
                ops.append(("W", d, weights))
                weights += 1
            ops.append(("F", d, warm + k))
        ops.append(("I", d, m - warm))
        for k in range(m - warm + 1, m):  # the tail: (W I) pairs, then the weight gradients left
            ops += [("W", d, weights), ("I", d, k)]
            weights += 1
        ops += [("W", d, k) for k in range(weights, m)]
        orders.append(ops)
    return orders


# --------------------------------------------------------------------------------------------
# The zero-bubble repo's heuristic scheduler
# --------------------------------------------------------------------------------------------

class _Heuristic:
    """One run of the heuristic under one setting of its three flags."""

    MEM = {"F": 1, "I": 0, "W": -1}

    def __init__(self, p, m, costs, latency, limit, bubble_before_first_i, prioritize_i, greedy_w):
        self.p, self.m, self.cost, self.comm, self.limit = p, m, costs, latency, limit
        self.bubble_before_first_i, self.prioritize_i, self.greedy_w = bubble_before_first_i, prioritize_i, greedy_w
        self.count = {k: [0] * p for k in "FIW"}  # next microbatch of each kind per stage
        self.last = [0.0] * p                      # end of the last op per stage
        self.mem = [0] * p
        self.bubble = [0.0] * p
        self.end: dict[Op, float] = {}
        self.orders: list[list[Op]] = [[] for _ in range(p)]

    def put(self, s: int, kind: str) -> None:
        i = self.count[kind][s]
        finish = self.last[s] + self.cost[kind]
        packed = finish
        if kind == "F" and s > 0:
            finish = max(finish, self.end[("F", s - 1, i)] + self.comm + self.cost[kind])
        if kind == "I" and s < self.p - 1:
            finish = max(finish, self.end[("I", s + 1, i)] + self.comm + self.cost[kind])
        if self.count["F"][s] > 0:
            self.bubble[s] += finish - packed
        self.last[s] = self.end[(kind, s, i)] = finish
        self.mem[s] += self.MEM[kind]
        self.count[kind][s] += 1
        self.orders[s].append((kind, s, i))

    def pending_w(self, s: int) -> bool:
        return self.count["W"][s] < self.count["I"][s]

    def fill_wait(self, s: int, arrival: float) -> None:
        """W ops into the wait for an input arriving at `arrival`; one more that overruns it unless the
        wait is within this stage's share of the largest bubble so far (and greedy_w is off)."""
        while self.pending_w(s) and self.last[s] + self.cost["W"] <= arrival:
            self.put(s, "W")
        if self.pending_w(s) and self.last[s] < arrival:
            if arrival - self.last[s] <= max(self.bubble) - self.bubble[s]:
                if self.greedy_w:
                    self.put(s, "W")
            else:
                self.put(s, "W")

    def make_room(self, s: int, need: int) -> None:
        while self.mem[s] + need > self.limit:
            if not self.pending_w(s):
                raise ValueError("cannot fit memory")
            self.put(s, "W")

    def first_round(self) -> None:
        p, cost, comm = self.p, self.cost, self.comm
        for s in range(p):
            self.put(s, "F")
        extra = [0] * p
        back = self.end[("F", p - 1, 0)] + cost["I"]  # when I(p-1, 0) ends
        for s in range(p - 2, -1, -1):
            mem, busy = self.mem[s], self.last[s]
            while self.count["F"][s] + extra[s] < self.m and mem + 1 <= self.limit:
                if self.bubble_before_first_i:
                    if busy + cost["F"] > back + comm:
                        break
                elif busy >= back + comm:
                    break
                mem, busy, extra[s] = mem + 1, busy + cost["F"], extra[s] + 1
            back = max(busy, back + comm) + cost["I"]
        for s in range(1, p):
            while extra[s] > 0 and extra[s] >= extra[s - 1] and self.count["F"][s] + extra[s] < self.m:
                extra[s] -= 1
        for s in range(p):
            for _ in range(extra[s]):
                self.put(s, "F")
        for s in range(p - 1, -1, -1):
            self.put(s, "I")

    def wants_forward(self, s: int) -> bool:
        f = self.count["F"]
        if f[s] >= self.m:
            return False
        if not (self.prioritize_i and s + 1 < self.p and f[s] >= f[s + 1] + 2):
            return True
        nxt = self.last[s + 1] + self.cost["F"] + self.cost["I"] + self.comm  # I from s+1 after its F, I
        if self.last[s] >= nxt:
            return False
        mem, w_cost, w = self.mem[s] + 1, 0.0, self.count["W"][s]
        while mem > self.limit and w < self.count["I"][s]:
            w_cost, mem, w = w_cost + self.cost["W"], mem - 1, w + 1
        if self.last[s] + self.cost["F"] + w_cost <= nxt:
            return True
        return not nxt - self.last[s] <= max(self.bubble) - self.bubble[s]

    def round(self, i: int) -> None:
        p = self.p
        want = [self.wants_forward(s) for s in range(p)]
        for s in range(p - 2, -1, -1):
            want[s] = want[s] and want[s + 1]
        for s in range(p):
            if not want[s]:
                continue
            self.make_room(s, 1)
            if s > 0:
                self.fill_wait(s, self.end[("F", s - 1, self.count["F"][s])] + self.comm)
            self.put(s, "F")
        for s in range(p - 1, -1, -1):
            self.make_room(s, 0)
            if s + 1 < p:
                self.fill_wait(s, self.end[("I", s + 1, i)] + self.comm)
            if s == 0 and self.count["F"][s] == self.m:
                while self.pending_w(s):
                    self.put(s, "W")
            self.put(s, "I")

    def run(self) -> list[list[Op]]:
        self.first_round()
        for i in range(1, self.m):
            self.round(i)
        for s in range(self.p):
            while self.count["W"][s] < self.m:
                self.put(s, "W")
        return [sorted(order, key=lambda op: self.end[op]) for order in self.orders]


def heuristic(p: int, m: int, costs: dict[str, float], latency: float, limit: int) -> list[list[Op]]:
    """The best (by ``simulate``'s makespan) of the heuristic's runs under its eight flag settings that
    fit ``limit`` and do not deadlock."""
    best = None
    for flags in itertools.product((True, False), repeat=3):
        try:
            orders = _Heuristic(p, m, costs, latency, limit, *flags).run()
            makespan, peak = simulate(orders, costs, latency)
        except ValueError:
            continue
        if max(peak) <= limit and (best is None or makespan < best[0]):
            best = (makespan, orders)
    if best is None:
        raise ValueError(f"the heuristic finds no order for p={p}, m={m} within {limit} activations")
    return best[1]
