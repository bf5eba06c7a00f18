"""fill_bubbles (PipeFisher): user tasks placed into the idle gaps of a simulated step, over a cycle of steps.

After the order is fixed and simulated, every device's step has idle gaps (before its first op, between
ops, after its last op up to the makespan). Gap by gap, in time order, a device runs the first task in
the declared priority (`fill bubbles with a, b, c`: all a before any b) that is ready at the gap's free
start and ends within the gap, and repeats until nothing more fits. A task is ready when its
dependencies are done:

- a built-in op (F, B, ...) of the step: at its end in step 0; in later steps of the cycle the op's
  output from step 0 is kept (saved activations or errors, as PipeFisher keeps them) and ready at once;
- another task on the same device: at its end when placed in this step, at once when placed earlier;
- a task on another device: from the next step on (K-FAC state is exchanged with the gradient sync at
  the end of the step, never in the middle of one).

What does not fit goes to the same gaps of the next step; the plan becomes a cycle of K step programs,
the tasks' work done once per cycle. When a whole step places no task, the ready ones are appended at
the end of their devices' step instead (a task too big for any gap). `at end` tasks run in every step:
in a gap when one fits, else after the device's last op. Each step lasts the unfilled makespan, or more
when appended work runs past it.

    device 0: F0 F1 . . B0 . B1        curvature_A(0,i) after F(0,i), cost 1
          ->  F0 F1 A0 A1 B0 . B1      (a cycle of 1 step)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from heapq import heappop, heappush

from .diagnostics import SchedError, error
from .ir import OP_KEY, Op, Schedule
from .ops import BUILTIN
from .memory import holdings, peaks
from .timing import Timing

MAX_CYCLE = 16
EPS = 1e-9


@dataclass(slots=True)
class _Step:
    """One step of the cycle while it is being filled: task ops placed per device, with their times."""

    index: int
    placed: list[list[tuple[float, float, Op]]]
    tail: list[float]  # per device: where appended work would start


@dataclass(slots=True)
class _Tasks:
    """The tasks to place, numbered in priority order (fill list, then declaration order), with what each
    waits for, worked out once: readiness is asked for hundreds of thousands of times (every gap looks
    at every task of its device), and a task like inversion(s) waits on m * c curvature pieces."""

    ops: list[Op]
    at_end: list[bool]                   # runs in every step
    first: list[float]                   # ready after its built-in deps: max end, + latency across devices
    waiting: list[int]                   # deps not placed in an earlier step (tasks; ops that never run)
    dependents: list[list[int]]          # the tasks that wait on this one, once per dep
    local: list[list[int]]               # those of them on the same device


@dataclass(slots=True)
class _State:
    """The fill in progress. A task is ready in step k when every dep is done (see the module docstring):
    `missing` counts the deps not done yet in the step, and `after` holds the latest end of the deps
    placed earlier in the step on the same device, so readiness is read, not recomputed."""

    schedule: Schedule
    timing: Timing
    tasks: _Tasks
    missing: list[int] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    placed_now: list[int] = field(default_factory=list)  # tasks of the cycle placed in this round
    picker: _Picker | None = None                        # the device whose gaps are being filled

    def begin_round(self) -> None:
        """Start filling a step: only placements of earlier steps count as done."""
        self.missing, self.placed_now = self.tasks.waiting.copy(), []
        self.after = [0.0] * len(self.missing)

    def commit(self) -> None:
        """The step is kept: tasks that waited on its placements no longer do in later steps."""
        waiting, dependents = self.tasks.waiting, self.tasks.dependents
        for n in self.placed_now:
            for t in dependents[n]:
                waiting[t] -= 1

    def ready_at(self, n: int, step: int) -> float | None:
        """Earliest time in `step` at which task n's dependencies are done on its device; None if not in
        it. Built-in deps bind in step 0 only (later steps keep step 0's outputs), `at end` tasks always."""
        tasks = self.tasks
        if self.missing[n]:
            return None
        ready = tasks.first[n] if step == 0 or tasks.at_end[n] else 0.0
        return max(ready, self.after[n])


def _tasks(schedule: Schedule, timing: Timing, ordered: list[Op], at_end_kinds: frozenset[str]) -> _Tasks:
    """Number the tasks and tabulate their deps. A dep is a task of the cycle (done once placed), an op
    of the schedule (done at its end), or neither (never done). Unplaced ops are task kinds only, so no
    dep is both an op of the schedule and a task of the cycle."""
    count = len(ordered)
    at_end = [op.kind in at_end_kinds for op in ordered]
    # Op.key -> task number (elaboration refuses a task declared twice, so keys are unique)
    number = {key: n for n, key in enumerate(map(OP_KEY, ordered)) if not at_end[n]}
    # elaboration gives a task's deps as the very ops it places, so most are found by id (an int hash;
    # an Op hashes in Python); the rest by key
    by_id = {id(ordered[n]): n for n in number.values()}
    tasks = _Tasks(ordered, at_end, [0.0] * count, [0] * count, [[] for _ in range(count)], [])
    needed: list[list[int]] = [[] for _ in range(count)]  # task deps, in dep order
    for n, op in enumerate(ordered):
        deps = schedule.deps.get(op, ())
        found = list(map(by_id.get, map(id, deps)))  # task number, None for the rest
        needed[n] = [task for task in found if task is not None]
        if len(needed[n]) < len(deps):
            others = [dep for dep, task in zip(deps, found) if task is None]
            keys = list(map(OP_KEY, others))
            needed[n] += [number[key] for key in keys if key in number]
            built_in = [dep for dep, key in zip(others, keys) if key not in number]
            tasks.first[n], tasks.waiting[n] = _built_in_ready(timing, op, built_in)
    device = [op.device for op in ordered]
    for n, deps in enumerate(needed):
        deps = _counted(tasks, n, deps, needed, device)
        tasks.waiting[n] += len(deps)
        for task in deps:
            tasks.dependents[task].append(n)
    tasks.local = [[t for t in waiting if device[t] == device[n]] for n, waiting in enumerate(tasks.dependents)]
    return tasks


def _counted(tasks: _Tasks, n: int, deps: list[int], needed: list[list[int]], device: list[int]) -> list[int]:
    """The task deps that task n waits on: a split piece (`split k`) after its previous piece p, with the
    other deps all p's too, waits on p alone. Once p is done for n (placed in an earlier step, or in this
    one on their device), so is each dep of p, as p ran after them; and a dep placed in this step ends by
    p's end (p started at most EPS before the dep's end and lasts at least EPS), so p's end alone gives
    n's ready time. The inversion pieces of a stage then wait on one piece, not on m * c curvature
    pieces each, and placing a curvature piece counts down one task, not k.

    The test is on lists of task numbers in dep order: elaboration gives piece j the deps
    [curvature pieces..., piece j-1], so piece j+1's deps without its last (piece j) are the first
    len(deps) - 1 of piece j's: [curvature pieces...]."""
    if deps:
        p = deps[-1]
        before = needed[p]
        if (device[p] == device[n] and tasks.ops[p].cost >= EPS
                and deps[:-1] == before[:len(deps) - 1]):
            return [p]
    return deps


def _built_in_ready(timing: Timing, op: Op, deps: list[Op]) -> tuple[float, int]:
    """When op's deps that are ops of the schedule are done (their latest end, + latency across devices),
    and how many of them never run."""
    ready, never = 0.0, 0
    for dep in deps:
        end = timing.end.get(dep)
        if end is None:
            never += 1
        else:
            ready = max(ready, end + (timing.latency if dep.device != op.device else 0.0))
    return ready, never


class _Picker:
    """A device's tasks in one step, for its gaps (filled in time order). The tasks with no missing deps
    sit in one heap of task numbers per cost, so the first in priority order that fits a gap is the
    lowest top among the costs that fit; one not yet ready at the cursor moves to a heap by ready time
    until the cursor reaches it."""

    def __init__(self, state: _State, step: int, candidates: list[int]):
        self.state, self.step = state, step
        self.later: list[tuple[float, int]] = []
        self.by_cost: dict[float, list[int]] = {}
        self.taken: set[int] = set()
        missing = state.missing
        for n in candidates:
            if not missing[n]:
                self.add(n)

    def add(self, n: int) -> None:
        """Task n has no missing deps (left)."""
        heappush(self.by_cost.setdefault(self.state.tasks.ops[n].cost, []), n)

    def pick(self, cursor: float, end: float) -> int | None:
        """The first task in priority order that is ready at `cursor` and ends within `end`; taken."""
        later, limit = self.later, cursor + EPS
        while later and later[0][0] <= limit:
            self.add(heappop(later)[1])
        found = None
        while found is None and (heap := self._first_fitting(cursor, end)) is not None:
            n = heappop(heap)
            ready = self.state.ready_at(n, self.step)
            if ready is not None and ready <= limit:
                found = n
            else:
                heappush(later, (ready, n))
        if found is not None:
            self.taken.add(found)
        return found

    def _first_fitting(self, cursor: float, end: float) -> list[int] | None:
        """The cost heap with the lowest top among those whose cost fits between cursor and end."""
        best, bound = None, end + EPS
        for cost, heap in self.by_cost.items():
            if heap and (best is None or heap[0] < best[0]) and not cursor + cost > bound:
                best = heap
        return best


def fill_bubbles(schedule: Schedule, timing: Timing, max_cycle: int = MAX_CYCLE) -> tuple[Schedule, Timing]:
    """Place `schedule.unplaced` (the tasks of `fill bubbles with`) into idle gaps; return the schedule
    with its `cycle` of K step programs and a Timing over the whole cycle (utilization with fills,
    `timing.extra` with utilization_unfilled, cycle_steps and step_times; `timing.steps` per step)."""
    rank = {name: n for n, (name, _) in enumerate(schedule.fill)}
    at_end_kinds = frozenset(spec.name for spec in schedule.tasks if spec.at_end)
    _check_at_end(schedule, at_end_kinds)
    ordered = sorted(schedule.unplaced, key=lambda op: rank[op.kind])  # stable: declaration order within
    state = _State(schedule, timing, _tasks(schedule, timing, ordered, at_end_kinds))
    # task numbers per device, in priority order
    pending = [[n for n, op in enumerate(ordered) if op.device == d and op.kind not in at_end_kinds]
               for d in range(schedule.devices)]
    every_step = [[n for n, op in enumerate(ordered) if op.device == d and op.kind in at_end_kinds]
                  for d in range(schedule.devices)]
    gaps, last_end = _gaps(schedule, timing)
    steps: list[_Step] = []
    while not steps or any(pending):
        if len(steps) == max_cycle:
            left = sorted({ordered[n].kind for tasks in pending for n in tasks})
            raise SchedError(error(f"the filled tasks need more than {max_cycle} steps ({', '.join(left)} still "
                                   "unplaced): split them finer (`split k`), or give them less work",
                                   schedule.fill_span), schedule.source)
        steps.append(_fill_step_fixed(state, len(steps), gaps, last_end, pending, every_step))
    return _result(schedule, timing, steps)


def _fill_step_fixed(state: _State, k: int, gaps, last_end: list[float], pending: list[list[int]],
                     every_step) -> _Step:
    """Fill step k; when appended work makes the step longer than the makespan, every device's last gap
    grows to the step's new end, so fill again (a few rounds reach the fixed point). When the rounds run
    out, the step keeps its last round, but its placements are not recorded as done."""
    length = state.timing.makespan
    for _ in range(4):
        left = [list(tasks) for tasks in pending]
        state.begin_round()
        step = _fill_step(state, k, _stretch(gaps, state.timing.makespan, length), last_end, left, every_step)
        new_length = max([length] + [e for placed in step.placed for _, e, _ in placed])
        if new_length <= length + EPS:
            state.commit()
            break
        length = new_length
    pending[:] = left
    return step


def _stretch(gaps, makespan: float, length: float):
    """Gaps of a step that lasts `length`: the tail gap (or a new one) reaches its end."""
    if length <= makespan + EPS:
        return gaps
    out = []
    for device_gaps in gaps:
        device_gaps = list(device_gaps)
        if device_gaps and abs(device_gaps[-1][1] - makespan) <= EPS:
            device_gaps[-1] = (device_gaps[-1][0], length)
        else:
            device_gaps.append((makespan, length))
        out.append(device_gaps)
    return out


def _check_at_end(schedule: Schedule, at_end_kinds: set[str]) -> None:
    for op in schedule.unplaced:
        if op.kind in at_end_kinds and any(dep.kind not in BUILTIN for dep in schedule.deps.get(op, ())):
            spec = next(s for s in schedule.tasks if s.name == op.kind)
            raise SchedError(error(f"task '{op.kind}' runs at the end of every step and may depend only on "
                                   "F, B, I and W", spec.span), schedule.source)


def _gaps(schedule: Schedule, timing: Timing) -> tuple[list[list[tuple[float, float]]], list[float]]:
    """Idle intervals of every device within [0, makespan], in time order; and each device's last end."""
    out, last_end = [], []
    for order in schedule.orders:
        spans = sorted((timing.start[op], timing.end[op]) for op in order)
        gaps, free = [], 0.0
        for start, end in spans:
            if start > free + EPS:
                gaps.append((free, start))
            free = max(free, end)
        if timing.makespan > free + EPS:
            gaps.append((free, timing.makespan))
        out.append(gaps)
        last_end.append(max((end for _, end in spans), default=0.0))
    return out, last_end


def _fill_step(state: _State, k: int, gaps, last_end: list[float], pending: list[list[int]],
               every_step: list[list[int]]) -> _Step:
    devices = state.schedule.devices
    at_end_task = state.tasks.at_end
    step = _Step(k, [[] for _ in range(devices)], list(last_end))
    at_end = []
    progress = False
    for d in range(devices):
        candidates = sorted(pending[d] + every_step[d])  # task numbers are in priority order
        state.picker = picker = _Picker(state, k, candidates)
        for start, end in gaps[d]:
            progress |= _fill_gap(state, step, d, start, end)
        state.picker = None
        left = [n for n in candidates if n not in picker.taken]
        pending[d] = [n for n in left if not at_end_task[n]]
        at_end.append([n for n in left if at_end_task[n]])
    if not progress and any(pending):
        progress = any([_append(state, step, d, pending[d]) for d in range(devices)])
        if not progress:
            stuck = next(state.tasks.ops[n] for tasks in pending for n in tasks)
            raise SchedError(error(f"task {stuck} can never run: a dependency is neither an op of the "
                                   "schedule nor a task that gets placed", _span(state.schedule, stuck)),
                             state.schedule.source)
    for d in range(devices):
        _append(state, step, d, at_end[d])
    return step


def _fill_gap(state: _State, step: _Step, d: int, start: float, end: float) -> bool:
    """Fill one gap: again and again the first task (in priority order) that is ready at the free start
    and ends within the gap. True when a task of the cycle (not an `at end` one) was placed."""
    cursor, placed_cycle_task = start, False
    while (n := state.picker.pick(cursor, end)) is not None:
        placed_cycle_task |= not state.tasks.at_end[n]
        cursor = _place(state, step, d, n, cursor)
        step.tail[d] = max(step.tail[d], cursor)
    return placed_cycle_task


def _place(state: _State, step: _Step, d: int, n: int, start: float) -> float:
    """Place task n at `start` on device d (its own); the tasks of d that waited on it only for this may
    now run, from its end on."""
    op = state.tasks.ops[n]
    end = start + op.cost
    step.placed[d].append((start, end, op))
    if not state.tasks.at_end[n]:
        state.placed_now.append(n)
        missing, after = state.missing, state.after
        for t in state.tasks.local[n]:
            missing[t] -= 1
            if end > after[t]:
                after[t] = end
            if not missing[t] and state.picker is not None:
                state.picker.add(t)
    return end


def _append(state: _State, step: _Step, d: int, tasks: list[int]) -> bool:
    """Run what is ready of `tasks` after the device's last work in this step; True if any ran."""
    placed = False
    while tasks:
        for i, n in enumerate(tasks):
            ready = state.ready_at(n, step.index)
            if ready is not None:
                break
        else:
            return placed
        del tasks[i]
        step.tail[d] = _place(state, step, d, n, max(step.tail[d], ready))
        placed = True
    return placed


def _span(schedule: Schedule, op: Op):
    return op.span or schedule.fill_span


# -- the result: step programs, timings, stats ---------------------------------------------------------

def _result(schedule: Schedule, timing: Timing, steps: list[_Step]) -> tuple[Schedule, Timing]:
    programs, timings = [], []
    for step in steps:
        start = dict(timing.start)
        end = dict(timing.end)
        orders = []
        for d, order in enumerate(schedule.orders):
            items = [(timing.start[op], n, op) for n, op in enumerate(order)]
            items += [(s, len(order) + n, op) for n, (s, e, op) in enumerate(step.placed[d])]
            orders.append(tuple(op for _, _, op in sorted(items, key=lambda x: (x[0], x[1]))))
            for s, e, op in step.placed[d]:
                start[op], end[op] = s, e
        length = max([timing.makespan] + [e for placed in step.placed for _, e, _ in placed])
        busy = tuple(b + sum(op.cost for _, _, op in step.placed[d]) for d, b in enumerate(timing.busy))
        programs.append(tuple(orders))
        timings.append(Timing(start, end, length, busy, (), timing.latency, True))
    peaks = cycle_peak_memory(schedule, timings)
    timings = [replace(t, peak_memory=peaks) for t in timings]
    cycle_time = sum(t.makespan for t in timings)
    busy = tuple(sum(t.busy[d] for t in timings) for d in range(schedule.devices))
    unfilled = timing.stats()["utilization"]
    extra = {"utilization_unfilled": unfilled, "cycle_steps": len(steps),
             "step_times": [round(t.makespan, 9) for t in timings], "makespan_unfilled": timing.makespan}
    filled = Timing(timings[0].start, timings[0].end, cycle_time, busy, peaks, timing.latency, True,
                    tuple(timings), extra)
    return replace(schedule, cycle=tuple(programs)), filled


def cycle_peak_memory(schedule: Schedule, steps: list[Timing]) -> tuple[float, ...]:
    """Peak memory units per device over the cycle (schedc/memory.py): activations until their B (or W)
    or the last task that keeps them, saved gradients that tasks keep, tasks' persistent state; tasks of
    the cycle keep step 0's outputs across steps."""
    return peaks(holdings(schedule, steps))
