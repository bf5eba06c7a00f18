"""One step of fill_bubbles (schedc/passes/fill.py): the tasks' state over the cycle, which task is ready when,
and the gaps of each device's step filled in time order by the first ready task in priority that fits."""
from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush

from ..diagnostics import SchedError, error
from ..ir import OP_KEY, Op, Schedule
from ..ops import BUILTIN
from .timing import Timing


@dataclass(slots=True)
class StepFill:
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
class FillState:
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


def number_tasks(schedule: Schedule, timing: Timing, ordered: list[Op], at_end_kinds: frozenset[str],
           lagged: frozenset[tuple[str, int]] = frozenset()) -> _Tasks:
    """Number the tasks and tabulate their deps. A dep is a task of the cycle (done once placed), an op
    of the schedule (done at its end), or neither (never done). Unplaced ops are task kinds only, so no
    dep is both an op of the schedule and a task of the cycle. A lagged task's deps outside its group
    are the previous cycle's: done."""
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
        if at_end[n]:  # its previous piece is ready with it and comes first in priority
            deps = [dep for dep in deps if not _same_instance(dep, op)]
        found = list(map(by_id.get, map(id, deps)))  # task number, None for the rest
        needed[n] = [task for task in found if task is not None]
        if len(needed[n]) < len(deps):
            others = [dep for dep, task in zip(deps, found) if task is None]
            keys = list(map(OP_KEY, others))
            needed[n] += [number[key] for key in keys if key in number]
            built_in = [dep for dep, key in zip(others, keys) if key not in number]
            tasks.first[n], tasks.waiting[n] = _built_in_ready(timing, op, built_in)
    if lagged:
        group = [(op.kind, op.stage) for op in ordered]
        for n in range(count):
            if group[n] in lagged:
                needed[n] = [t for t in needed[n] if group[t] == group[n]]
                tasks.first[n], tasks.waiting[n] = 0.0, 0
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

    def __init__(self, state: FillState, step: int, candidates: list[int]):
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


@dataclass(slots=True)
class _Base:
    """What every step of the cycle shares: the `at end` tasks placed, the gaps they leave (to the
    step's end), each device's tail, and per device the longest gap (a task longer never fits one)."""

    placed: list[list[tuple[float, float, Op]]]
    gaps: list[list[tuple[float, float]]]
    tail: list[float]
    length: float
    widest: list[float]


def base_step(state: FillState, every_step: list[list[int]]) -> _Base:
    """Place the `at end` tasks (deps: built-in ops only, so the same in every step): in a gap when one
    fits after their deps, else after the device's last op."""
    schedule, timing = state.schedule, state.timing
    gaps, last_end = _gaps(schedule, timing)
    state.begin_round()
    step = StepFill(0, [[] for _ in range(schedule.devices)], list(last_end))
    for d in range(schedule.devices):
        state.picker = picker = _Picker(state, 0, every_step[d])
        for start, end in gaps[d]:
            _fill_gap(state, step, d, start, end)
        state.picker = None
        _append(state, step, d, [n for n in every_step[d] if n not in picker.taken])
    length = max([timing.makespan] + [e for placed in step.placed for _, e, _ in placed])
    free = [_free(gaps[d], step.placed[d], timing.makespan, length) for d in range(schedule.devices)]
    return _Base(step.placed, free, step.tail, length, [max((e - s for s, e in g), default=0.0) for g in free])


def _free(gaps: list[tuple[float, float]], placed: list[tuple[float, float, Op]], makespan: float,
          length: float) -> list[tuple[float, float]]:
    """The idle intervals left of `gaps` (up to makespan) once `placed` run, and the step's tail to
    `length`: in time order."""
    cuts = sorted((s, e) for s, e, _ in placed)
    out = []
    for start, end in gaps + ([(makespan, length)] if length > makespan + EPS else []):
        for s, e in cuts:
            if e <= start + EPS or s >= end - EPS:
                continue
            if s > start + EPS:
                out.append((start, s))
            start = max(start, e)
        if end > start + EPS:
            out.append((start, end))
    merged: list[tuple[float, float]] = []
    for s, e in out:
        if merged and abs(merged[-1][1] - s) <= EPS:
            merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def check_at_end(schedule: Schedule, at_end_kinds: set[str]) -> None:
    """An `at end` task depends on built-in ops only (its pieces aside: they follow one another by
    priority, as they are ready at the same time)."""
    for op in schedule.unplaced:
        if op.kind in at_end_kinds and any(dep.kind not in BUILTIN and not _same_instance(dep, op)
                                           for dep in schedule.deps.get(op, ())):
            spec = next(s for s in schedule.tasks if s.name == op.kind)
            raise SchedError(error(f"task '{op.kind}' runs at the end of every step and may depend only on "
                                   "F, B, I and W", spec.span), schedule.source)


def _same_instance(a: Op, b: Op) -> bool:
    return (a.kind, a.stage, a.mb, a.pipe) == (b.kind, b.stage, b.mb, b.pipe)


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


def fill_step(state: FillState, k: int, base: _Base, pending: list[list[int]]) -> StepFill:
    """Step k: the `at end` tasks as in every step; then, device by device, gap by gap, the tasks of
    the cycle that fit. A task longer than every gap of its device is appended after the device's last
    work once ready; when nothing at all fits, whatever is ready is. Appended work lengthens the step,
    and the other devices' tails up to its new end are filled too. Placements count as done for later
    steps (state.commit)."""
    devices = state.schedule.devices
    state.begin_round()
    step = StepFill(k, [list(placed) for placed in base.placed], list(base.tail))
    progress = False
    for d in range(devices):
        progress |= _fill_device(state, step, d, base.gaps[d], pending)
    for d in range(devices):
        progress |= _append_ready(state, step, d, pending, [n for n in pending[d]
                                                           if state.tasks.ops[n].cost > base.widest[d] + EPS])
    if not progress and any(pending):
        progress = any([_append_ready(state, step, d, pending, list(pending[d])) for d in range(devices)])
        if not progress:
            stuck = next(state.tasks.ops[n] for tasks in pending for n in tasks)
            raise SchedError(error(f"task {stuck} can never run: a dependency is neither an op of the "
                                   "schedule nor a task that gets placed", _span(state.schedule, stuck)),
                             state.schedule.source)
    length = max([base.length] + step.tail)
    if length > base.length + EPS:
        for d in range(devices):
            _fill_device(state, step, d, [(step.tail[d], length)], pending)
    state.commit()
    return step


def _fill_device(state: FillState, step: StepFill, d: int, gaps, pending: list[list[int]]) -> bool:
    """Fill device d's `gaps` (in time order) from its pending tasks; True if any was placed."""
    state.picker = picker = _Picker(state, step.index, pending[d])
    progress = False
    for start, end in gaps:
        if end > start + EPS:
            progress |= _fill_gap(state, step, d, start, end)
    state.picker = None
    if picker.taken:
        pending[d] = [n for n in pending[d] if n not in picker.taken]
    return progress


def _append_ready(state: FillState, step: StepFill, d: int, pending: list[list[int]], tasks: list[int]) -> bool:
    """Append what is ready of `tasks` (pending on d) after d's last work; True if any was."""
    if not tasks:
        return False
    left = list(tasks)
    placed = _append(state, step, d, left)
    if placed:
        done = set(tasks) - set(left)
        pending[d] = [n for n in pending[d] if n not in done]
    return placed


def _fill_gap(state: FillState, step: StepFill, d: int, start: float, end: float) -> bool:
    """Fill one gap: again and again the first task (in priority order) that is ready at the free start
    and ends within the gap. True when a task of the cycle (not an `at end` one) was placed."""
    cursor, placed_cycle_task = start, False
    while (n := state.picker.pick(cursor, end)) is not None:
        placed_cycle_task |= not state.tasks.at_end[n]
        cursor = _place(state, step, d, n, cursor)
        step.tail[d] = max(step.tail[d], cursor)
    return placed_cycle_task


def _place(state: FillState, step: StepFill, d: int, n: int, start: float) -> float:
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


def _append(state: FillState, step: StepFill, d: int, tasks: list[int]) -> bool:
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


EPS = 1e-9
