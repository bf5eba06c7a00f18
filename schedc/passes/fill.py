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

from dataclasses import replace

from ..diagnostics import Diagnostic, SchedError, Severity, error
from ..frontend.elaborate import MAX_OPS
from ..frontend.tasks import refine_tasks
from ..ir import Schedule
from .memory import holdings, peaks
from .timing import Timing
from .fill_gaps import FillState, StepFill, base_step, check_at_end, fill_step, number_tasks

WARN_CYCLE = 16  # a longer cycle is warned about: the tasks' work is that stale
AUTO_CUTS = (1, 2, 4, 8, 16)  # `split auto`: pieces per unit tried
AUTO_ROUNDS = 1
AUTO_BUDGET = 60_000  # task pieces filled over choose_cuts' trials (Chimera p=8, m=8: 34,000-47,000)
# trials whose cycle outgrew the plan's op limit before choose_cuts gives up: each lays out about that
# many ops (pipefisher_1f1b at m = 1,000: some 0.3 s of CPU each, 17 s over every cut)
OVER_LIMIT_TRIALS = 2


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
    filled in all once one fill succeeded (a big schedule tries fewer cuts); before one succeeds, at
    most OVER_LIMIT_TRIALS fills that outgrow the op limit (each lays out about that many ops)."""
    may_lag = laggable(schedule)
    lags = [(frozenset(), False)] + ([(may_lag, True), (may_lag, False)] if may_lag else [])
    useful = _useful(schedule, timing)
    cuts, tried, spent, over_limit = dict.fromkeys(kinds, 1), set(), 0, 0
    best, best_score, failure = None, None, None
    for kind, j in [(None, j) for j in AUTO_CUTS] + [(kind, j) for kind in kinds * AUTO_ROUNDS for j in AUTO_CUTS]:
        trial = dict.fromkeys(kinds, j) if kind is None else {**cuts, kind: j}
        if tuple(trial.values()) in tried:
            continue
        tried.add(tuple(trial.values()))
        size = sum(trial.get(op.kind, 1) for op in schedule.unplaced) * len(lags)  # pieces to fill
        if best is not None and spent + size > AUTO_BUDGET or best is None and over_limit >= OVER_LIMIT_TRIALS:
            continue
        spent += size
        refined = refine_tasks(schedule, trial)
        for lagged, first in lags:
            try:
                result = _fill(refined, timing, max_ops, lagged, first)
            except _NotLagged:
                continue
            except _OverLimit as exc:
                failure, over_limit = failure or exc, over_limit + 1
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
    """One fill: the `at end` tasks into every step alike (base_step), then the others step by step
    into the gaps left, until all are placed. Tasks of the `lagged` (kind, stage) groups run on the
    previous cycle's results: ready from the start of every step (their deps in the group aside), and
    placed no later than the last step of their deps (else _NotLagged); `lagged_first` puts them before
    the others in priority (they are ready at the start of step 0, when the rest waits for its F and
    B), else they keep their place in the fill list."""
    rank = {name: n for n, (name, _) in enumerate(schedule.fill)}
    at_end_kinds = frozenset(spec.name for spec in schedule.tasks if spec.at_end)
    check_at_end(schedule, at_end_kinds)
    # in fill priority (stable: declaration order within a kind)
    ordered = sorted(schedule.unplaced, key=lambda op: (not lagged_first or (op.kind, op.stage) not in lagged,
                                                        rank[op.kind]))
    state = FillState(schedule, timing, number_tasks(schedule, timing, ordered, at_end_kinds, lagged))
    # task numbers per device, in priority order
    pending = [[n for n, op in enumerate(ordered) if op.device == d and op.kind not in at_end_kinds]
               for d in range(schedule.devices)]
    every_step = [[n for n, op in enumerate(ordered) if op.device == d and op.kind in at_end_kinds]
                  for d in range(schedule.devices)]
    base = base_step(state, every_step)
    per_step = schedule.op_count() + sum(map(len, every_step))
    steps: list[StepFill] = []
    while not steps or any(pending):
        if (len(steps) + 1) * per_step + len(ordered) > max_ops:
            left = sorted({ordered[n].kind for tasks in pending for n in tasks})
            raise _OverLimit(error(f"the filled tasks need a cycle of more than {len(steps)} steps ({', '.join(left)} "
                                   f"still unplaced), more than the {max_ops:,} ops a plan may hold: give them "
                                   "less work or the schedule bigger bubbles", schedule.fill_span), schedule.source)
        steps.append(fill_step(state, len(steps), base, pending))
    _check_lagged(state, steps, lagged)
    return _result(schedule, timing, steps, lagged)


# -- the previous refresh's work in this cycle's bubbles -------------------------------------------

class _NotLagged(Exception):
    """A lagged task did not run before its deps' last step: that fill is not a valid plan."""


class _OverLimit(SchedError):
    """A fill whose cycle would hold more ops than a plan may."""


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


def _check_lagged(state: FillState, steps: list[StepFill], lagged: frozenset[tuple[str, int]]) -> None:
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


# -- the result: step programs, timings, stats ---------------------------------------------------------

def _result(schedule: Schedule, timing: Timing, steps: list[StepFill],
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
    """Peak memory units per device over the cycle (schedc/passes/memory.py): activations until their B (or W)
    or the last task that keeps them, saved gradients that tasks keep, tasks' persistent state; tasks of
    the cycle keep step 0's outputs across steps."""
    return peaks(holdings(schedule, steps))
