"""Step 3 of the synthesis: orders timed as the compiler's simulator times them (each op at the later of its
device being free and its inputs' arrival), their activations counted, and a local search that moves
critical ops earlier while the makespan falls."""
from __future__ import annotations

import math

from .. import walk
from .problem import MOVE_BACK, TOLERANCE, UNITS, Problem


class Timer:
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

    def peaks(self, orders) -> tuple[float, ...]:
        """Per device, the peak of its memory along its order (Problem.memory: activation units, whole
        ones as ints, or bytes)."""
        peaks = (max(_walk(self.pr, order, d)) for d, order in enumerate(orders))
        return tuple(_whole(x) if self.pr.unit == UNITS else x for x in peaks)

    def score(self, orders, span=None) -> tuple[float, float]:
        """(makespan, sum of every op's end time); infinite for orders that deadlock."""
        span = span if span is not None else self.times(orders)
        if span is None:
            return (math.inf, math.inf)
        ends = [span[order[-1]][1] for order in orders]
        return (max(ends), sum(end for _, end in span.values()))


def improve(timer: Timer, orders: list[list[tuple]], score: tuple[float, float], bound: float,
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


def _memory_ok(timer: Timer, orders, d: int) -> bool:
    limit = timer.pr.limit[d] * (1 + TOLERANCE)
    return all(alive <= limit for alive in _walk(timer.pr, orders[d], d))


def _whole(x: float) -> float | int:
    """A count of units as an int when it is one (whole units: schedc's memory model), else rounded."""
    return int(round(x)) if abs(x - round(x)) <= TOLERANCE else round(x, 9)


def _walk(pr: Problem, order, d: int) -> list[float]:
    """Device d's memory after each op of its order (and 0 before the first)."""
    return [0.0, *walk.levels((pr.memory[kind][d] for kind, _, _ in order), 0.0)]


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
