"""The passes after elaboration, in the order they run, and the one function that runs them: every way
into the compiler (a .sched, a torch CSV, a plan.json's re-simulation, --cluster, tune) goes through
`run_passes` with PASSES or one of its named subsets, so a pass added here runs on all of them."""
from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable

from ..checks.channels import check_channels
from ..checks.census import Census, census
from ..checks.deadlock import check_deadlock
from ..checks.memory import check_memory
from ..checks.structure import check_structure
from ..passes.compiled import Compiled
from ..diagnostics import Diagnostic, has_errors
from ..ir import Schedule
from ..passes.lower import lower
from ..plan import Plan
from ..passes.simulate import Collectives, Links, forget_index, simulate, step_sequences
from ..passes.timing import Stats, Timing


@dataclass(frozen=True, slots=True)
class Checks:
    """The optional checks a command selects by its options (schedc check's); each is a pass of PASSES
    that does nothing unless selected."""

    model: str | None = None            # --model: memory in bytes (checks.memory.check_memory_bytes)
    memory_limit: str | None = None     # --memory-limit: the bytes' limit per device
    microbatch_size: int | None = None  # --microbatch-size: the bytes' microbatch size
    placement: str | None = None        # --placement: the stages on a named placement's ranks
    seq: int | None = None              # --seq: the model's sequence length for the bytes


@dataclass(frozen=True, slots=True)
class Unit:
    """What the passes hand on to each other. Each pass takes a Unit and returns a new one with its
    result filled in (dataclasses.replace); nothing is changed in place."""

    schedule: Schedule
    latency: float = 0.0
    links: Links | None = None            # per device pair message times, instead of `latency`
    census: Census | None = None          # placed ops against the expected ones (until the deadlock check)
    timing: Timing | None = None          # of the schedule as it now is (over the cycle once filled)
    unfilled: Timing | None = None        # the timing before fill_bubbles, when it ran
    sequences: tuple = ()                 # per step program: (start, end, op) in start order (until lowering)
    stats: Stats | None = None
    plan: Plan | None = None
    diagnostics: tuple[Diagnostic, ...] = ()
    checked: Schedule | None = None       # what the structure checks see, when not `schedule` (a plan's
    # re-simulation: its built-in ops, as a plan does not declare the tasks fill_bubbles placed)
    collectives: Collectives | None = None  # ZeRO's gathers and reduce-scatters on each device's lane
    checks: Checks = Checks()             # the optional checks selected

    @property
    def failed(self) -> bool:
        return has_errors(self.diagnostics)


def _census(u: Unit) -> Unit:
    return replace(u, census=census(u.checked or u.schedule))


def _check_structure(u: Unit) -> Unit:
    return replace(u, diagnostics=u.diagnostics + tuple(check_structure(u.checked or u.schedule, u.census)))


def _simulate(u: Unit) -> Unit:
    return replace(u, timing=simulate(u.schedule, u.latency, u.links, u.collectives))


def _check_deadlock(u: Unit) -> Unit:
    counted = u.census if u.checked is None else None  # a census of what was checked, not of every op
    # its last reader: the census is let go (at 10^6 ops its identities hold a quarter of a GiB)
    return replace(u, census=None, diagnostics=u.diagnostics + tuple(check_deadlock(u.schedule, u.timing, counted)))


def _fill_bubbles(u: Unit) -> Unit:
    if not u.schedule.fill or not u.timing.complete or u.failed:
        return u
    from ..passes.fill import fill_bubbles
    schedule, timing, notes = fill_bubbles(u.schedule, u.timing)
    return replace(u, schedule=schedule, timing=timing, unfilled=u.timing, diagnostics=u.diagnostics + tuple(notes))


def _check_memory(u: Unit) -> Unit:
    return replace(u, diagnostics=u.diagnostics + tuple(check_memory(u.schedule, u.timing)))


def _stats(u: Unit) -> Unit:
    return replace(u, stats=Stats.of(u.schedule, u.timing, u.unfilled))


def _step_sequences(u: Unit) -> Unit:
    return u if u.failed else replace(u, sequences=step_sequences(u.schedule, u.timing))


# Lowering lets go of the simulator's predecessor index past this many ops (at 10^6 ops it holds 0.14
# GiB while the plan is built); below, `compile --cluster` times the same schedule again from it.
KEEP_INDEX = 1 << 18


def _lower(u: Unit) -> Unit:
    if u.failed:
        return u
    if sum(map(len, u.schedule.orders)) > KEEP_INDEX:
        forget_index()  # the simulator's cache: no pass reads it from here on (compile --cluster's makespan may)
    return replace(u, plan=lower(u.schedule, u.stats, u.sequences, u.links), sequences=())  # their last reader


def _check_channels(u: Unit) -> Unit:
    return u if u.plan is None else replace(u, diagnostics=u.diagnostics + tuple(check_channels(u.plan)))


def _check_memory_bytes(u: Unit) -> Unit:
    c = u.checks
    if not (c.model or c.memory_limit):
        return u
    from ..checks.memory import check_memory_bytes
    found = check_memory_bytes(u.schedule, u.timing, c.model, c.memory_limit, c.microbatch_size, c.seq)
    return replace(u, diagnostics=u.diagnostics + tuple(found))


def _check_placement(u: Unit) -> Unit:
    if u.checks.placement is None:
        return u
    from ..interop.torch_placement import check_placement
    return replace(u, diagnostics=u.diagnostics + tuple(check_placement(u.schedule, u.checks.placement)))


# The passes after elaboration, in the order they run. A check returns diagnostics and changes nothing;
# fill_bubbles, the step sequences and lowering are skipped once a check has failed.
PASSES: tuple[Callable[[Unit], Unit], ...] = (
    _census,            # the placed ops' identities against the expected ones (for the next checks)
    _check_structure,   # one F and one B (or I and W) per stage and microbatch, on the stage's device
    _simulate,          # event-driven timing under the cost model; memory peaks
    _check_deadlock,    # program order plus dependencies let every op run
    _fill_bubbles,      # `fill bubbles with`: tasks into idle gaps, a cycle of K step programs
    _check_memory,      # peak per device within `limit memory`
    _stats,             # makespan, bubble, utilization, busy/idle, peaks (and the fill's figures)
    _step_sequences,    # each step program's ops in simulated start order
    _lower,             # sends, receives, gradient sync and STEP per rank: the plan
    _check_channels,    # on the plan: messages match per pair, a blocking replay completes
    _check_memory_bytes,  # selected (--model, --memory-limit): weights, state and activations in bytes
    _check_placement,   # selected (--placement): each stage on the rank a named placement gives it
)

# PASSES' named subsets: each leaves out the passes it has no use for, so a pass added to PASSES runs
# on every way in (read at the call, so a pass added at run time counts too).
LOWERING = (_step_sequences, _lower, _check_channels)
TIMED = (_simulate, _check_deadlock, _fill_bubbles, _check_memory, _stats, _check_memory_bytes)
FILLED = (_fill_bubbles, _check_memory)  # a plan was filled and held to its limit when it was compiled


def analysis() -> tuple[Callable[[Unit], Unit], ...]:
    """The passes before lowering (`simulate`, --cluster without a plan): checked, timed, filled."""
    return tuple(p for p in PASSES if p not in LOWERING)


def replay() -> tuple[Callable[[Unit], Unit], ...]:
    """A plan.json's orders re-simulated (render, check, simulate of a plan): its program is already
    filled and lowered, so the checks and the timing alone."""
    return tuple(p for p in PASSES if p not in LOWERING and p not in FILLED)


def untimed() -> tuple[Callable[[Unit], Unit], ...]:
    """The passes tune runs on each order it simulates (the checks before timing, and any pass added to
    PASSES): the search times the order itself, with simulate's engine and its cached costs
    (simulate.order_makespan over a cached predecessor index), and predicts from that time."""
    return tuple(p for p in PASSES if p not in LOWERING and p not in TIMED)


def run_passes(schedule: Schedule, latency: float = 0.0, links: Links | None = None,
               passes: Iterable[Callable[[Unit], Unit]] | None = None, checked: Schedule | None = None,
               checks: Checks = Checks(), collectives: Collectives | None = None) -> Unit:
    """Run the passes in order (PASSES unless told) over a schedule; returns the last Unit. links: per
    device pair message times (simulate), instead of one latency; checked, checks, collectives: see Unit."""
    unit = Unit(schedule, latency, links, checked=checked, checks=checks, collectives=collectives)
    for run in PASSES if passes is None else passes:
        unit = run(unit)
    return unit


def compile_schedule(schedule: Schedule, latency: float = 0.0, links: Links | None = None,
                     checks: Checks = Checks(), collectives: Collectives | None = None) -> Compiled:
    """Check, time, fill, lower and check the plan of an elaborated schedule (PASSES, with the optional
    checks selected)."""
    u = run_passes(schedule, latency, links, checks=checks, collectives=collectives)
    return Compiled(u.schedule, u.timing, u.stats, u.plan, list(u.diagnostics))


def analyse(schedule: Schedule, latency: float = 0.0, links: Links | None = None,
            collectives: Collectives | None = None) -> Compiled:
    """The passes up to the stats, without lowering (analysis()): the schedule checked and timed (and
    filled); the plan is None."""
    u = run_passes(schedule, latency, links, analysis(), collectives=collectives)
    return Compiled(u.schedule, u.timing, u.stats, None, list(u.diagnostics))


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while compiling. A big schedule builds ~10^6 IR values
    and instructions, none of them in reference cycles, and the collector's repeated passes over them
    cost about a quarter of a compile. What is alive afterwards is frozen (left out of later passes)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
