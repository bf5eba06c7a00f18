"""check_memory: peak memory per device against its limit, in activation units (`limit memory <= expr`)
or in bytes for a model description (`schedc check --model model.toml --memory-limit 80GiB`).

    limit memory <= 2   with 1F1B, p=4:  device 0 holds F(0,0) F(0,1) F(0,2) when it starts F(0,2)
    -> error: device 0: 3 activation units alive at time 2, over the limit 2: F(0,0), F(0,1), F(0,2)

Bytes are the cluster cost model's (schedc/costmodel/bytes.py, device_bytes), one rule for `check --model`
and `simulate --cluster`: weights, gradients and optimizer state of the stages a device holds (the
embedding on the first, the logits' copy on the last; 16 bytes a parameter with Adam), and the
activation units at its simulated peak times the stage's layers times a layer's bytes without
recomputation (Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) at 16 bits) with the last stage's
logits, or the optimizer step's fp32 gradients if larger. No cluster: the tensors only, without the
allocator's share `simulate --cluster` adds. The model's layers must divide over the stages.
"""
from __future__ import annotations

import re

from ..diagnostics import OPTIONS, USAGE, Diagnostic, SchedError, Severity, error
from ..text import gib, listed
from ..passes.grid import elide, label, location
from ..ir import Op, Schedule
from ..ops import OpKind
from ..passes.memory import PERSISTENT, Held, first_over, holdings, host_holdings, memory_deltas, peak_of, timed_model
from ..passes.timing import Timing

TOLERANCE = 1e-9


def check_memory(schedule: Schedule, timing: Timing) -> list[Diagnostic]:
    """Guarantees, when it returns no error: no device's simulated peak of memory units exceeds its
    `limit memory`, over every step of a filled cycle: activations, the saved gradients tasks keep and
    tasks' persistent state (schedc/passes/memory.py). Otherwise one error per device over its limit, naming
    the simulated time (and step), what was added when the limit was crossed and everything held then."""
    host = _host_over(schedule, timing)
    if schedule.memory_limit is None:
        return host
    return [_over(schedule, timing, d, peak, limit)
            for d, (peak, limit) in enumerate(zip(timing.peak_memory, schedule.memory_limit))
            if peak > limit + TOLERANCE] + host


def _host_over(schedule: Schedule, timing: Timing) -> list[Diagnostic]:
    """`limit host_memory`: per device over it, the O whose copy crossed it and what the host held."""
    if schedule.host_limit is None or not timing.complete:
        return []
    out = []
    for d, (held, limit) in enumerate(zip(host_holdings(schedule, list(timing.steps) or [timing]),
                                          schedule.host_limit)):
        crossing = first_over(held, limit, TOLERANCE)
        if crossing is not None:
            first, alive, units = crossing
            shown = elide([label(schedule, h.op) for h in alive], 12)
            out.append(error(f"device {d}: {units:g} activation units on the host at time {first.start:g} when "
                             f"{label(schedule, first.op)} copies out, over the host limit {limit:g}; offloaded: "
                             f"{shown}", first.op.span or schedule.host_limit_span,
                             notes=(f"the limit is declared at {location(schedule.source, schedule.host_limit_span)}",)))
    return out


def _over(schedule: Schedule, timing: Timing, d: int, peak: float, limit: float) -> Diagnostic:
    limit_note = f"the limit is declared at {location(schedule.source, schedule.memory_limit_span)}"
    if timing.complete and timed_model(schedule):
        return _over_timed(schedule, timing, d, peak, limit, limit_note)
    crossing = _crossing(schedule, d, limit)
    if crossing is None:  # an incomplete (deadlocked) timing of a schedule with tasks
        return error(f"device {d}: peak memory {peak:g} activation units exceeds the limit {limit:g}",
                     schedule.memory_limit_span)
    op, alive, units = crossing
    when = timing.start.get(op)
    at = f" at time {when:g}" if when is not None else ""
    shown = elide([label(schedule, a) for a in alive], 12)
    return error(f"device {d}: {units:g} activation unit{'' if units == 1 else 's'} alive{at} when {label(schedule, op)} runs, over the "
                 f"limit {limit:g} (peak {peak:g}); alive: {shown}", op.span or schedule.memory_limit_span,
                 notes=(limit_note,))


def _over_timed(schedule: Schedule, timing: Timing, d: int, peak: float, limit: float, note: str) -> Diagnostic:
    """Over the limit in the timed model (schedc/passes/memory.py): name the step, the time, what was allocated
    last (a forward, a gradient a task keeps, a task's state) and everything held then."""
    steps = list(timing.steps) or [timing]
    crossing = first_over(holdings(schedule, steps)[d], limit, TOLERANCE)
    if crossing is None:
        return error(f"device {d}: peak memory {peak:g} units exceeds the limit {limit:g}", schedule.memory_limit_span)
    held, alive, units = crossing
    step, when = _step_time(steps, held.start)
    at = "from the start" if held.end == PERSISTENT else (
        f"at time {when:g}" + (f" of step {step} of the cycle" if len(steps) > 1 else ""))
    shown = elide([h.describe(schedule) for h in alive], 12)
    declared = {spec.name: spec.span for spec in schedule.tasks}  # a placed task's span is its cursor's
    span = held.op.span or (declared.get(held.keeper.kind) if held.keeper is not None else None) \
        or schedule.memory_limit_span
    keepers = {h.keeper.kind: declared.get(h.keeper.kind) for h in alive if h.keeper is not None}
    notes = [f"task '{kind}' keeps outputs alive: declared at {location(schedule.source, at_span)}"
             for kind, at_span in keepers.items()]
    return error(f"device {d}: {units:g} units held {at} when {held.describe(schedule)} is added, over the limit "
                 f"{limit:g} (peak {peak:g}); held: {shown}", span, notes=(note, *notes))


def _step_time(steps: list[Timing], time: float) -> tuple[int, float]:
    """Absolute cycle time -> (step, time within that step)."""
    for k, step in enumerate(steps):
        if time < step.makespan - TOLERANCE or k == len(steps) - 1:
            return k, time
        time -= step.makespan
    return 0, time


def _crossing(schedule: Schedule, d: int, limit: float) -> tuple[Op, list[Op], float] | None:
    """The first op of device d's order after which more than `limit` units are alive, with the ops
    (forwards) whose activations are alive then."""
    deltas = memory_deltas(schedule)
    releases = schedule.releases
    alive: dict[tuple, Op] = {}
    units = 0.0
    for op in schedule.orders[d]:
        delta = deltas.get(op.kind)
        if delta is None or not 0 <= op.stage < len(delta):
            continue
        units += delta[op.stage]
        if op.kind == OpKind.F:
            alive[(op.stage, op.mb, op.pipe)] = op
        elif op.kind in releases:
            alive.pop((op.stage, op.mb, op.pipe), None)
        if units > limit + TOLERANCE:
            return op, list(alive.values()), units
    return None


# Bytes, for a model description ------------------------------------------------------------------

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def check_memory_bytes(schedule: Schedule, timing: Timing, model_file: str | None,
                       memory_limit: str | None, microbatch_size: int | None = None,
                       seq: int | None = None) -> list[Diagnostic]:
    """Guarantees, when it returns no error: on every device, the weights, gradients and optimizer state
    of the stages it holds plus the activations alive at its peak fit in `memory_limit` bytes. The bytes
    are the cost model's (costmodel.device_bytes: the embedding and logits included) for the layout
    t = 1, no recomputation, microbatch size b from `microbatch_size` (--microbatch-size) or the model
    file's `microbatch_size`. Without a limit, a note reports each device's peak. Unreadable options
    raise SchedError (exit 2)."""
    if model_file is None:
        raise SchedError(error("--memory-limit needs a model description: --model model.toml"), OPTIONS,
                         kind=USAGE)
    from ..costmodel.specs import check_layout, check_stages, load_model_spec
    from ..layout import Layout  # only with --model
    from ..costmodel import device_bytes
    model = load_model_spec(model_file, seq)
    limit = parse_bytes(memory_limit) if memory_limit is not None else None
    b = microbatch_size if microbatch_size is not None else model.microbatch_size
    if b is None:
        raise SchedError(error("the bytes check needs the microbatch size: give --microbatch-size B (or "
                               "`microbatch_size = B` in a model TOML file; a config.json states none)"), OPTIONS, kind=USAGE)
    layout = Layout(microbatch_size=b, recompute="none")
    check_layout(model, layout, model_file)
    check_stages(model, schedule, model_file)
    totals, parts = device_bytes(model, layout, schedule, timing.peak_memory)
    diags = []
    timed = holdings(schedule, list(timing.steps) or [timing]) if timing.complete and timed_model(schedule) else None
    for d, (total, part) in enumerate(zip(totals, parts)):
        if limit is None or total <= limit:
            continue
        state, act = part["weights_gradients_optimizer"], part["activations"]
        op, alive = _peak_op(schedule, d) if timed is None else _timed_peak_op(timed[d])
        when = timing.start.get(op) if op is not None else None
        stages = sorted({s for pipe in schedule.pipelines for s, dev in enumerate(pipe.placement) if dev == d})
        diags.append(error(
            f"device {d}: {_gib(total)} at its peak exceeds the limit {_gib(limit)}: weights, gradients "
            f"and optimizer state {_gib(state)} ({'stage' if len(stages) == 1 else 'stages'} "
            f"{listed(list(map(str, stages)))}) and activations "
            f"{_gib(act)} of {alive} {'holdings' if timed else 'microbatch-stages'} alive"
            + (f" at time {when:g} when {label(schedule, op)} runs" if when is not None else "")
            + (f", the optimizer step's fp32 gradients {_gib(part['optimizer_step'])} beyond them"
               if part["optimizer_step"] > 0 else ""),
            op.span if op is not None else None))
    if not diags:
        shown = listed([f"device {d} {_gib(p)}" for d, p in enumerate(totals)])
        diags.append(Diagnostic(Severity.NOTE, f"peak memory per device: {shown}"
                                + (f" (limit {_gib(limit)})" if limit is not None else "")))
    return diags


def _gib(value: float) -> str:
    return f"{gib(value)} GiB"


def _peak_op(schedule: Schedule, d: int) -> tuple[Op | None, int]:
    """The op of device d's order at which its activation units peak, and how many are alive then."""
    releases = schedule.releases
    alive = peak = 0.0
    count = peak_count = 0
    at = None
    for op in schedule.orders[d]:
        if not 0 <= op.stage < len(schedule.activation):
            continue
        size = schedule.activation[op.stage]
        if op.kind == OpKind.F:
            alive, count = alive + size, count + 1
            if alive > peak:
                peak, at, peak_count = alive, op, count
        elif op.kind in releases:
            alive, count = alive - size, count - 1
    return at, peak_count


def _timed_peak_op(held: list[Held]) -> tuple[Op | None, int]:
    """The op whose holding brings device d to its peak in the timed model, and how many are alive."""
    _, at, count = peak_of(held)
    return (at.op if at is not None else None), count


MAX_MEMORY_BYTES = 1e18  # an exabyte per device: past any memory, far below an infinite one


def parse_bytes(text: str) -> float:
    """'80GiB', '512 MB', '1e10' -> bytes; anything else is a usage error (exit 2)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*", text or "")
    unit = match.group(2).lower() if match else None
    if not match or unit not in UNITS or float(match.group(1)) <= 0:
        raise SchedError(error(f"--memory-limit: cannot read {text!r} (write e.g. 80GiB, 512MB or 1e10)"),
                         OPTIONS, kind=USAGE)
    nbytes = float(match.group(1)) * UNITS[unit]
    if not nbytes <= MAX_MEMORY_BYTES:  # 1e400GiB is infinite: no limit at all, said as one
        raise SchedError(error(f"--memory-limit {text.strip()}: more than {MAX_MEMORY_BYTES:.0e} bytes, past any "
                               "device's memory (write e.g. 80GiB)"), OPTIONS, kind=USAGE)
    return nbytes
