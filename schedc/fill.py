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

from .diagnostics import SchedError, error
from .ir import BUILTIN, Op, Schedule
from .memory import holdings, peaks
from .simulate import Timing

MAX_CYCLE = 16
EPS = 1e-9


@dataclass(slots=True)
class _Step:
    """One step of the cycle while it is being filled: task ops placed per device, with their times."""

    index: int
    placed: list[list[tuple[float, float, Op]]]
    tail: list[float]  # per device: where appended work would start


@dataclass(slots=True)
class _State:
    schedule: Schedule
    timing: Timing
    rank: dict[str, int]                    # task kind -> position in the fill list
    at_end: frozenset[str]                  # kinds that run in every step
    where: dict[Op, tuple[int, int, float]] = field(default_factory=dict)  # task -> (step, device, end)

    def ready_at(self, op: Op, step: int) -> float | None:
        """Earliest time in `step` at which op's dependencies are done on its device; None if not in it."""
        ready = 0.0
        for dep in self.schedule.deps.get(op, ()):
            placed = self.where.get(dep)
            if placed is not None:
                k, device, end = placed
                if k == step:
                    if device != op.device:
                        return None
                    ready = max(ready, end)
                continue
            end = self.timing.end.get(dep)
            if end is None:
                return None
            if step == 0 or op.kind in self.at_end:
                ready = max(ready, end + (self.timing.latency if dep.device != op.device else 0.0))
        return ready


def fill_bubbles(schedule: Schedule, timing: Timing, max_cycle: int = MAX_CYCLE) -> tuple[Schedule, Timing]:
    """Place `schedule.unplaced` (the tasks of `fill bubbles with`) into idle gaps; return the schedule
    with its `cycle` of K step programs and a Timing over the whole cycle (utilization with fills,
    `timing.extra` with utilization_unfilled, cycle_steps and step_times; `timing.steps` per step)."""
    rank = {name: n for n, (name, _) in enumerate(schedule.fill)}
    at_end_kinds = frozenset(spec.name for spec in schedule.tasks if spec.at_end)
    state = _State(schedule, timing, rank, at_end_kinds)
    _check_at_end(schedule, at_end_kinds)
    ordered = sorted(schedule.unplaced, key=lambda op: rank[op.kind])  # stable: declaration order within
    pending = [[op for op in ordered if op.device == d and op.kind not in at_end_kinds]
               for d in range(schedule.devices)]
    every_step = [[op for op in ordered if op.device == d and op.kind in at_end_kinds]
                  for d in range(schedule.devices)]
    gaps = _gaps(schedule, timing)
    steps: list[_Step] = []
    while not steps or any(pending):
        if len(steps) == max_cycle:
            left = sorted({op.kind for ops in pending for op in ops})
            raise SchedError(error(f"the filled tasks need more than {max_cycle} steps ({', '.join(left)} still "
                                   "unplaced): split them finer (`split k`), or give them less work",
                                   schedule.fill_span), schedule.source)
        steps.append(_fill_step_fixed(state, len(steps), gaps, pending, every_step))
    return _result(schedule, timing, steps)


def _fill_step_fixed(state: _State, k: int, gaps, pending: list[list[Op]], every_step) -> _Step:
    """Fill step k; when appended work makes the step longer than the makespan, every device's last gap
    grows to the step's new end, so fill again (a few rounds reach the fixed point)."""
    length = state.timing.makespan
    for _ in range(4):
        where, left = dict(state.where), [list(ops) for ops in pending]
        step = _fill_step(state, k, _stretch(gaps, state.timing.makespan, length), left, every_step)
        new_length = max([length] + [e for placed in step.placed for _, e, _ in placed])
        if new_length <= length + EPS:
            break
        state.where, length = where, new_length
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


def _gaps(schedule: Schedule, timing: Timing) -> list[list[tuple[float, float]]]:
    """Idle intervals of every device within [0, makespan], in time order."""
    out = []
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
    return out


def _fill_step(state: _State, k: int, gaps, pending: list[list[Op]], every_step: list[list[Op]]) -> _Step:
    devices = state.schedule.devices
    step = _Step(k, [[] for _ in range(devices)], [_last_end(state, d) for d in range(devices)])
    at_end = []
    progress = False
    for d in range(devices):
        candidates = sorted(pending[d] + every_step[d], key=lambda op: state.rank[op.kind])
        for start, end in gaps[d]:
            progress |= _fill_gap(state, step, d, start, end, candidates)
        pending[d] = [op for op in candidates if op.kind not in state.at_end]
        at_end.append([op for op in candidates if op.kind in state.at_end])
    if not progress and any(pending):
        progress = any([_append(state, step, d, pending[d]) for d in range(devices)])
        if not progress:
            stuck = next(op for ops in pending for op in ops)
            raise SchedError(error(f"task {stuck} can never run: a dependency is neither an op of the "
                                   "schedule nor a task that gets placed", _span(state.schedule, stuck)),
                             state.schedule.source)
    for d in range(devices):
        _append(state, step, d, at_end[d])
    return step


def _last_end(state: _State, device: int) -> float:
    order = state.schedule.orders[device]
    return max((state.timing.end[op] for op in order), default=0.0)


def _fill_gap(state: _State, step: _Step, d: int, start: float, end: float, candidates: list[Op]) -> bool:
    """Fill one gap: again and again the first candidate (in priority order) that is ready at the free
    start and ends within the gap. True when a task of the cycle (not an `at end` one) was placed."""
    cursor, placed_cycle_task = start, False
    while True:
        for n, op in enumerate(candidates):
            if cursor + op.cost > end + EPS:
                continue
            ready = state.ready_at(op, step.index)
            if ready is not None and ready <= cursor + EPS:
                break
        else:
            return placed_cycle_task
        del candidates[n]
        placed_cycle_task |= op.kind not in state.at_end
        cursor = _place(state, step, d, op, cursor)
        step.tail[d] = max(step.tail[d], cursor)


def _place(state: _State, step: _Step, d: int, op: Op, start: float) -> float:
    end = start + op.cost
    step.placed[d].append((start, end, op))
    if op.kind not in state.at_end:
        state.where[op] = (step.index, d, end)
    return end


def _append(state: _State, step: _Step, d: int, ops: list[Op]) -> bool:
    """Run what is ready of `ops` after the device's last work in this step; True if any ran."""
    placed = False
    while ops:
        for n, op in enumerate(ops):
            ready = state.ready_at(op, step.index)
            if ready is not None:
                break
        else:
            return placed
        del ops[n]
        step.tail[d] = _place(state, step, d, op, max(step.tail[d], ready))
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
