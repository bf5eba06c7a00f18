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

from .diagnostics import Diagnostic, SchedError, Severity, error
from .frontend.elaborate import MAX_OPS
from .frontend.tasks import refine_tasks
from .ir import OP_KEY, Op, Schedule
from .ops import BUILTIN
from .memory import holdings, peaks
from .timing import Timing

WARN_CYCLE = 16  # a longer cycle is warned about: the tasks' work is that stale
AUTO_CUTS = (1, 2, 4, 8, 16)  # `split auto`: pieces per unit tried
AUTO_ROUNDS = 1
AUTO_BUDGET = 60_000  # task pieces filled over choose_cuts' trials (Chimera p=8, m=8: 34,000-47,000)
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


def _tasks(schedule: Schedule, timing: Timing, ordered: list[Op], at_end_kinds: frozenset[str],
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


def fill_bubbles(schedule: Schedule, timing: Timing,
                 max_ops: int = MAX_OPS) -> tuple[Schedule, Timing, list[Diagnostic]]:
    """Place `schedule.unplaced` (the tasks of `fill bubbles with`) into idle gaps; return the schedule
    with its `cycle` of K step programs, a Timing over the whole cycle (utilization with fills,
    `timing.extra` with utilization_unfilled, cycle_steps, step_times and the pieces per task;
    `timing.steps` per step) and a warning when the cycle is long. Tasks with `split auto` are cut as
    finely as gives the highest utilization (choose_cuts)."""
    auto = [name for name, _ in schedule.fill if any(spec.auto for spec in schedule.tasks if spec.name == name)]
    schedule, filled = choose_cuts(schedule, timing, auto, max_ops)
    return schedule, filled, _cycle_notes(schedule, filled)


def choose_cuts(schedule: Schedule, timing: Timing, kinds: list[str],
                max_ops: int = MAX_OPS) -> tuple[Schedule, Timing]:
    """Fill with the `split auto` tasks' units cut into j pieces each (refine_tasks, which charges every
    extra piece `cost piece`), j from AUTO_CUTS, keeping the cut that gives the highest useful
    utilization (the work of the uncut units over the cycle's capacity: what an extra piece costs is
    busy time, but not work); on a tie the one whose last step holds least (nearest to a step less),
    then the first tried. Every kind cut alike first, then each kind in turn (AUTO_ROUNDS times over),
    the others held at the best so far; each cut filled with and without lagging the groups that may
    lag (laggable). Deterministic; each combination once, and no more than AUTO_BUDGET task pieces
    filled in all once one fill succeeded (a big schedule tries fewer cuts)."""
    may_lag = laggable(schedule)
    lags = [(frozenset(), False)] + ([(may_lag, True), (may_lag, False)] if may_lag else [])
    useful = _useful(schedule, timing)
    cuts, tried, spent = dict.fromkeys(kinds, 1), set(), 0
    best, best_score, failure = None, None, None
    for kind, j in [(None, j) for j in AUTO_CUTS] + [(kind, j) for kind in kinds * AUTO_ROUNDS for j in AUTO_CUTS]:
        trial = dict.fromkeys(kinds, j) if kind is None else {**cuts, kind: j}
        if tuple(trial.values()) in tried:
            continue
        tried.add(tuple(trial.values()))
        size = sum(trial.get(op.kind, 1) for op in schedule.unplaced) * len(lags)  # pieces to fill
        if best is not None and spent + size > AUTO_BUDGET:
            continue
        spent += size
        refined = refine_tasks(schedule, trial)
        for lagged, first in lags:
            try:
                result = _fill(refined, timing, max_ops, lagged, first)
            except _NotLagged:
                continue
            except SchedError as exc:
                failure = failure or exc
                continue
            score = (round(useful(result[1]), 9), -round(sum(result[1].steps[-1].busy), 9))
            if best is None or score > best_score:
                best, best_score, cuts = result, score, trial
    if best is None:
        raise failure
    best[1].extra["utilization_useful"] = useful(best[1])
    return best


def _useful(schedule: Schedule, timing: Timing):
    """Useful utilization of a fill of `schedule` cut any way: the uncut work (built-in ops and `at end`
    tasks every step, the rest once) over devices x the cycle's time."""
    at_end = {spec.name for spec in schedule.tasks if spec.at_end}
    every_step = sum(timing.busy) + sum(op.cost for op in schedule.unplaced if op.kind in at_end)
    once = sum(op.cost for op in schedule.unplaced if op.kind not in at_end)
    return lambda filled: (filled.extra["cycle_steps"] * every_step + once) / (schedule.devices * filled.makespan)


def _cycle_notes(schedule: Schedule, filled: Timing) -> list[Diagnostic]:
    steps = filled.extra["cycle_steps"]
    if steps <= WARN_CYCLE:
        return []
    return [Diagnostic(Severity.WARNING, f"the filled tasks span a cycle of {steps} steps (more than "
                       f"{WARN_CYCLE}): their work (K-FAC's curvature) is refreshed once every {steps} steps; "
                       "bigger bubbles (more microbatches, larger ones) or less work shorten it", schedule.fill_span)]


def _fill(schedule: Schedule, timing: Timing, max_ops: int, lagged: frozenset[tuple[str, int]] = frozenset(),
          lagged_first: bool = False) -> tuple[Schedule, Timing]:
    """One fill: the `at end` tasks into every step alike (_base_step), then the others step by step
    into the gaps left, until all are placed. Tasks of the `lagged` (kind, stage) groups run on the
    previous cycle's results: ready from the start of every step (their deps in the group aside), and
    placed no later than the last step of their deps (else _NotLagged); `lagged_first` puts them before
    the others in priority (they are ready at the start of step 0, when the rest waits for its F and
    B), else they keep their place in the fill list."""
    rank = {name: n for n, (name, _) in enumerate(schedule.fill)}
    at_end_kinds = frozenset(spec.name for spec in schedule.tasks if spec.at_end)
    _check_at_end(schedule, at_end_kinds)
    # in fill priority (stable: declaration order within a kind)
    ordered = sorted(schedule.unplaced, key=lambda op: (not lagged_first or (op.kind, op.stage) not in lagged,
                                                        rank[op.kind]))
    state = _State(schedule, timing, _tasks(schedule, timing, ordered, at_end_kinds, lagged))
    # task numbers per device, in priority order
    pending = [[n for n, op in enumerate(ordered) if op.device == d and op.kind not in at_end_kinds]
               for d in range(schedule.devices)]
    every_step = [[n for n, op in enumerate(ordered) if op.device == d and op.kind in at_end_kinds]
                  for d in range(schedule.devices)]
    base = _base_step(state, every_step)
    per_step = schedule.op_count() + sum(map(len, every_step))
    steps: list[_Step] = []
    while not steps or any(pending):
        if (len(steps) + 1) * per_step + len(ordered) > max_ops:
            left = sorted({ordered[n].kind for tasks in pending for n in tasks})
            raise SchedError(error(f"the filled tasks need a cycle of more than {len(steps)} steps ({', '.join(left)} "
                                   f"still unplaced), more than the {max_ops:,} ops a plan may hold: give them "
                                   "less work or the schedule bigger bubbles", schedule.fill_span), schedule.source)
        steps.append(_fill_step(state, len(steps), base, pending))
    _check_lagged(state, steps, lagged)
    return _result(schedule, timing, steps, lagged)


# -- the previous refresh's work in this cycle's bubbles -------------------------------------------

class _NotLagged(Exception):
    """A lagged task did not run before its deps' last step: that fill is not a valid plan."""


def laggable(schedule: Schedule) -> frozenset[tuple[str, int]]:
    """The (kind, stage) groups of tasks that may lag: tasks of the cycle that wait on another device's
    tasks (so, without lagging, for the step boundary), that keep nothing alive and that no task of
    another group waits on (K-FAC: a replicated stage's inversion)."""
    at_end = {spec.name for spec in schedule.tasks if spec.at_end}
    group = {op: (op.kind, op.stage) for op in schedule.unplaced if op.kind not in at_end}
    crossing, blocked = set(), set()
    for op, key in group.items():
        for dep in schedule.deps.get(op, ()):
            if dep in group and group[dep] != key:
                blocked.add(group[dep])
                if dep.device != op.device:
                    crossing.add(key)
        if schedule.keeps.get(op):
            blocked.add(key)
    return frozenset(sorted(crossing - blocked))


def _check_lagged(state: _State, steps: list[_Step], lagged: frozenset[tuple[str, int]]) -> None:
    """A lagged group runs on the previous cycle's results, so all of it in steps up to the last one
    holding its deps (whose results of this cycle are exchanged at that step's end)."""
    if not lagged:
        return
    tasks, schedule = state.tasks, state.schedule
    step_of = {id(op): k for k, step in enumerate(steps) for placed in step.placed for _, _, op in placed}
    last: dict[tuple[str, int], int] = {}
    deps_last: dict[tuple[str, int], int] = {}
    for op in tasks.ops:
        key = (op.kind, op.stage)
        if key in lagged:
            last[key] = max(last.get(key, 0), step_of[id(op)])
            for dep in schedule.deps.get(op, ()):
                if (dep.kind, dep.stage) != key and id(dep) in step_of:
                    deps_last[key] = max(deps_last.get(key, 0), step_of[id(dep)])
    if any(last[key] > deps_last.get(key, -1) for key in last):
        raise _NotLagged


@dataclass(slots=True)
class _Base:
    """What every step of the cycle shares: the `at end` tasks placed, the gaps they leave (to the
    step's end), each device's tail, and per device the longest gap (a task longer never fits one)."""

    placed: list[list[tuple[float, float, Op]]]
    gaps: list[list[tuple[float, float]]]
    tail: list[float]
    length: float
    widest: list[float]


def _base_step(state: _State, every_step: list[list[int]]) -> _Base:
    """Place the `at end` tasks (deps: built-in ops only, so the same in every step): in a gap when one
    fits after their deps, else after the device's last op."""
    schedule, timing = state.schedule, state.timing
    gaps, last_end = _gaps(schedule, timing)
    state.begin_round()
    step = _Step(0, [[] for _ in range(schedule.devices)], list(last_end))
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


def _check_at_end(schedule: Schedule, at_end_kinds: set[str]) -> None:
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


def _fill_step(state: _State, k: int, base: _Base, pending: list[list[int]]) -> _Step:
    """Step k: the `at end` tasks as in every step; then, device by device, gap by gap, the tasks of
    the cycle that fit. A task longer than every gap of its device is appended after the device's last
    work once ready; when nothing at all fits, whatever is ready is. Appended work lengthens the step,
    and the other devices' tails up to its new end are filled too. Placements count as done for later
    steps (state.commit)."""
    devices = state.schedule.devices
    state.begin_round()
    step = _Step(k, [list(placed) for placed in base.placed], list(base.tail))
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


def _fill_device(state: _State, step: _Step, d: int, gaps, pending: list[list[int]]) -> bool:
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


def _append_ready(state: _State, step: _Step, d: int, pending: list[list[int]], tasks: list[int]) -> bool:
    """Append what is ready of `tasks` (pending on d) after d's last work; True if any was."""
    if not tasks:
        return False
    left = list(tasks)
    placed = _append(state, step, d, left)
    if placed:
        done = set(tasks) - set(left)
        pending[d] = [n for n in pending[d] if n not in done]
    return placed


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

def _result(schedule: Schedule, timing: Timing, steps: list[_Step],
            lagged: frozenset[tuple[str, int]] = frozenset()) -> tuple[Schedule, Timing]:
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
             "step_times": [round(t.makespan, 9) for t in timings], "makespan_unfilled": timing.makespan,
             "pieces": dict(schedule.fill), "lagged": [f"{kind}({stage})" for kind, stage in sorted(lagged)]}
    filled = Timing(timings[0].start, timings[0].end, cycle_time, busy, peaks, timing.latency, True,
                    tuple(timings), extra)
    return replace(schedule, cycle=tuple(programs)), filled


def cycle_peak_memory(schedule: Schedule, steps: list[Timing]) -> tuple[float, ...]:
    """Peak memory units per device over the cycle (schedc/memory.py): activations until their B (or W)
    or the last task that keeps them, saved gradients that tasks keep, tasks' persistent state; tasks of
    the cycle keep step 0's outputs across steps."""
    return peaks(holdings(schedule, steps))
