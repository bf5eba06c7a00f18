"""check_deadlock: program order plus data dependencies must let every placed op run.

A device runs its order one op at a time; an op waits for its dependencies (an op that no device runs
never arrives). When the devices get stuck, each one waits at its next op for one op of another device
(or of itself, later), and following these waits names the cycle:

    device 0: F(0,0) B(0,0) F(0,1) B(0,1)        device 1: B(1,0) F(1,0) F(1,1) B(1,1)
    -> error: deadlock: device 0 waits at B(0,0) for B(1,0) on device 1, which waits at B(1,0) for
       F(1,0) on device 1, ordered after B(1,0) at f.sched:9
       followed by the rank x step grid with the stuck ops marked
"""
from __future__ import annotations

from dataclasses import dataclass

from ..diagnostics import Diagnostic, error
from ..passes.grid import label, location, schedule_grid
from ..ir import OP_KEY, Op, Schedule
from ..ops import Opcode, label as op_label
from ..passes.timing import Timing
from .census import Census, census
from ..text import MAX_SHOWN, more

GRIDS = 3  # diagnostics that carry a grid


def check_deadlock(schedule: Schedule, timing: Timing, counted: Census | None = None) -> list[Diagnostic]:
    """Guarantees, when it returns no error: run in their devices' orders, every placed op's
    dependencies are placed and run before it, so the schedule completes (ops left for fill_bubbles
    count as done). Otherwise one error per cycle of waits, and one per op that is waited for but never
    placed, each naming devices, ops and the source lines that ordered them, with a rank x step grid.
    counted: the schedule's census, when the caller has it."""
    if timing.complete and _dependencies_placed(schedule, counted or census(schedule)):
        return []
    run = replay(schedule)
    if not run.stuck:
        return []
    return _explain(schedule, run)


def _dependencies_placed(schedule: Schedule, counted: Census) -> bool:
    """Cheap sufficient test: the placed ops are exactly the expected ones (so built-in dependencies are
    placed) and every dependency of a placed task is placed or left for fill_bubbles."""
    if not counted.exact:
        return False
    unplaced = set(map(OP_KEY, schedule.unplaced))
    for op, deps in schedule.deps.explicit.items():
        if OP_KEY(op) in counted.placed and not all(OP_KEY(d) in counted.placed or OP_KEY(d) in unplaced for d in deps):
            return False
    return True


@dataclass(frozen=True)
class Replay:
    """Where each device stopped: position of its next op (len(order) when done) and, for a stuck
    device, the identity of the dependency its next op waits for."""

    position: tuple[int, ...]
    waits_for: dict[int, tuple]
    placed_at: dict[tuple, tuple[int, int]]  # first copy of each placed op: (device, step)

    @property
    def stuck(self) -> list[int]:
        return sorted(self.waits_for)


def replay(schedule: Schedule) -> Replay:
    """Run the orders, each device as far as it can, waking a device when the op it waits for is done
    (linear in ops + dependencies). A dependency that is never placed is never done."""
    orders = schedule.orders
    placed_at: dict[tuple, tuple[int, int]] = {}
    for d, order in enumerate(orders):
        for n, op in enumerate(order):
            placed_at.setdefault(OP_KEY(op), (d, n))
    done = set(map(OP_KEY, schedule.unplaced))
    deps_of = schedule.deps.keys_of
    if schedule.fused:  # an overlapped op starts when the inputs of both halves are there
        partner = {OP_KEY(f): b for f, b in schedule.fused}
        keys_of = deps_of

        def deps_of(op: Op) -> tuple[tuple, ...]:
            other = partner.get(OP_KEY(op))
            if other is None:
                return keys_of(op)
            return keys_of(op) + tuple(key for key in keys_of(other) if key != OP_KEY(op))
    position, waiting, blocked = [0] * len(orders), {}, {}
    ready = list(range(len(orders)))
    while ready:
        d = ready.pop()
        order, n = orders[d], position[d]
        blocked.pop(d, None)
        while n < len(order):
            op = order[n]
            missing = next((key for key in deps_of(op) if key not in done), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(d)
                blocked[d] = missing
                break
            key = OP_KEY(op)
            done.add(key)
            ready.extend(waiting.pop(key, ()))
            n += 1
        position[d] = n
    return Replay(tuple(position), blocked, placed_at)


# Explaining a stuck replay --------------------------------------------------------------------------

def _explain(schedule: Schedule, run: Replay) -> list[Diagnostic]:
    """One diagnostic per cycle of waits and per missing op waited for; the devices that wait behind
    one (stuck on a device of it) are listed in its notes."""
    target = {d: run.placed_at.get(key, (None, None))[0] for d, key in run.waits_for.items()}
    groups: list[list[int]] = []        # devices named by each diagnostic
    owner: dict[int, int] = {}          # stuck device -> index of the diagnostic that explains it
    for first in run.stuck:
        path, d = [], first
        while d is not None and d not in owner and d not in path:
            path.append(d)
            d = target[d]
        if d is None:                   # the chain ends at an op no device runs
            groups.append([path[-1]])
        elif d in path:                 # a new cycle
            groups.append(path[path.index(d):])
        index = len(groups) - 1 if d is None or d in path else owner[d]
        owner.update({e: index for e in path})
    diags = []
    for index, devices in enumerate(groups):
        behind = [d for d in run.stuck if owner[d] == index and d not in devices]
        make = _cycle if target[devices[0]] is not None else _never
        diags.append(make(schedule, run, devices, behind, index < GRIDS))
    return diags


def _op_at(schedule: Schedule, d: int, n: int) -> Op:
    return schedule.orders[d][n]


def _head(schedule: Schedule, run: Replay, d: int) -> Op:
    return _op_at(schedule, d, run.position[d])


def _unit(schedule: Schedule, op: Op) -> str:
    """An op's label, or an overlapped pair's: 'F(4,4) & B(4,4)'."""
    for forward, backward in schedule.fused:
        if forward is op:
            return op_label(Opcode.OVERLAP_F_B.value, halves=(label(schedule, forward), label(schedule, backward)))
    return label(schedule, op)


def _hop(schedule: Schedule, run: Replay, d: int) -> str:
    """'waits at B(0,3) for B(1,3) on device 1, ordered after F(1,5) at f.sched:13'."""
    head = _head(schedule, run, d)
    e, n = run.placed_at[run.waits_for[d]]
    awaited = _op_at(schedule, e, n)
    text = f"waits at {_unit(schedule, head)} for {label(schedule, awaited)}"
    if e == d:
        return text + (f", which device {d} runs later, ordered after {label(schedule, head)} at "
                       f"{location(schedule.source, awaited.span)}")
    text += f" on device {e}"
    if n != run.position[e]:
        text += (f", ordered after {label(schedule, _head(schedule, run, e))} at "
                 f"{location(schedule.source, awaited.span)}")
    return text


def _cycle(schedule: Schedule, run: Replay, cycle: list[int], behind: list[int], grid: bool) -> Diagnostic:
    start = cycle.index(min(cycle))
    cycle = cycle[start:] + cycle[:start]
    message = "deadlock: device " + ", which ".join(
        (f"{d} " if k == 0 else "") + _hop(schedule, run, d) for k, d in enumerate(cycle))
    stops = tuple(f"device {d} stops at {label(schedule, _head(schedule, run, d))}, placed by "
                  f"{location(schedule.source, _head(schedule, run, d).span)}" for d in cycle)
    marks = _marks(run, cycle + behind)
    return error(message, _head(schedule, run, cycle[0]).span, notes=stops + _behind(schedule, run, behind),
                 detail=schedule_grid(schedule, marks) if grid else "", ops=_ops(marks))


def _never(schedule: Schedule, run: Replay, devices: list[int], behind: list[int], grid: bool) -> Diagnostic:
    d = devices[0]
    head = _head(schedule, run, d)
    message = (f"deadlock: device {d} waits at {label(schedule, head)} for "
               f"{label(schedule, Op(*run.waits_for[d]))}, which no device runs")
    marks = _marks(run, devices + behind)
    return error(message, head.span, notes=_behind(schedule, run, behind),
                 detail=schedule_grid(schedule, marks) if grid else "", ops=_ops(marks))


def _behind(schedule: Schedule, run: Replay, devices: list[int]) -> tuple[str, ...]:
    notes = tuple(f"device {d} waits behind it, at {label(schedule, _head(schedule, run, d))} "
                  f"({location(schedule.source, _head(schedule, run, d).span)})" for d in devices[:MAX_SHOWN])
    return notes + ((more(len(devices) - MAX_SHOWN, "devices"),) if len(devices) > MAX_SHOWN else ())


def _marks(run: Replay, devices: list[int]) -> dict[tuple[int, int], str]:
    marks = {(d, run.position[d]): "stuck" for d in devices}
    for d in devices:
        where = run.placed_at.get(run.waits_for[d])
        if where is not None and where not in marks:
            marks[where] = "awaited"
    return marks


def _ops(marks: dict[tuple[int, int], str]) -> tuple[tuple[int, int, str], ...]:
    """The marked ops as a diagnostic carries them: (device, position, role), by device and position."""
    return tuple((d, n, role) for (d, n), role in sorted(marks.items()))
