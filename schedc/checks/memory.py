"""check_memory: peak memory per device against its limit, in activation units (`limit memory <= expr`)
or in bytes for a model description (`schedc check --model model.toml --memory-limit 80GiB`).

    limit memory <= 2   with 1F1B, p=4:  device 0 holds F(0,0) F(0,1) F(0,2) when it starts F(0,2)
    -> error: device 0: 3 activation units alive at time 2, over the limit 2: F(0,0), F(0,1), F(0,2)

Bytes: a transformer layer's activations take s*b*h*(34 + 5*a*s/h) bytes at 16 bits without
recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models"); its 12h^2 + 13h parameters take 16 bytes each with Adam (2 weights + 2 grads + 12 fp32
master and moments; 4 + 4 + 8 at 32 bits). Layers are split evenly over the stages (the first stages
take the remainder); a device counts the weights of every model stage it holds once.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..diagnostics import Diagnostic, SchedError, Severity, Source, Span, error, listed
from ..grid import elide, label, location
from ..ir import Op, Schedule
from ..ops import OpKind
from ..cluster import DTYPE_BYTES, read_fields, read_toml
from ..memory import PERSISTENT, Held, first_over, holdings, memory_deltas, peak_of, timed_model
from ..timing import Timing

TOLERANCE = 1e-9
OPTIONS = Source("schedc check", "")  # where errors in command-line options are reported


def check_memory(schedule: Schedule, timing: Timing) -> list[Diagnostic]:
    """Guarantees, when it returns no error: no device's simulated peak of memory units exceeds its
    `limit memory`, over every step of a filled cycle: activations, the saved gradients tasks keep and
    tasks' persistent state (schedc/memory.py). Otherwise one error per device over its limit, naming
    the simulated time (and step), what was added when the limit was crossed and everything held then."""
    if schedule.memory_limit is None:
        return []
    return [_over(schedule, timing, d, peak, limit)
            for d, (peak, limit) in enumerate(zip(timing.peak_memory, schedule.memory_limit))
            if peak > limit + TOLERANCE]


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
    return error(f"device {d}: {units:g} activation units alive{at} when {label(schedule, op)} runs, over the "
                 f"limit {limit:g} (peak {peak:g}); alive: {shown}", op.span or schedule.memory_limit_span,
                 notes=(limit_note,))


def _over_timed(schedule: Schedule, timing: Timing, d: int, peak: float, limit: float, note: str) -> Diagnostic:
    """Over the limit in the timed model (schedc/memory.py): name the step, the time, what was allocated
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

MODEL_KEYS = {"layers": int, "hidden": int, "heads": int, "seq": int, "microbatch_size": int, "dtype": str}
CLUSTER_MODEL_KEYS = {"vocab": int, "ffn": int}  # read by the cost model (schedc/cluster.py), accepted here
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True, slots=True)
class Model:
    """A GPT-style decoder: layers, hidden size h, heads a, sequence length s, microbatch size b."""

    layers: int
    hidden: int
    heads: int
    seq: int
    microbatch_size: int
    dtype: str = "bf16"

    @property
    def width(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def activation_bytes_per_layer(self) -> float:
        s, b, h, a = self.seq, self.microbatch_size, self.hidden, self.heads
        return s * b * h * (34 + 5 * a * s / h) * self.width / 2

    def state_bytes_per_layer(self) -> float:
        params = 12 * self.hidden ** 2 + 13 * self.hidden
        return params * (2 * self.width + (12 if self.width == 2 else 8))

    def stage_layers(self, stages: int) -> list[int]:
        return [self.layers // stages + (1 if s < self.layers % stages else 0) for s in range(stages)]


def check_memory_bytes(schedule: Schedule, timing: Timing, model_file: str | None,
                       memory_limit: str | None) -> list[Diagnostic]:
    """Guarantees, when it returns no error: on every device, the weights, gradients and optimizer state
    of the stages it holds plus the activations alive at its peak fit in `memory_limit` bytes. Without
    a limit, a note reports each device's peak. Unreadable options raise SchedError (exit 2)."""
    if model_file is None:
        raise SchedError(error("--memory-limit needs a model description: --model model.toml"), OPTIONS,
                         exit_code=2)
    model = load_model(model_file)
    limit = parse_bytes(memory_limit) if memory_limit is not None else None
    layers = model.stage_layers(schedule.stages)
    if min(layers) == 0:
        return [error(f"the model has {model.layers} layers, fewer than the schedule's {schedule.stages} stages")]
    diags = []
    peaks = []
    timed = holdings(schedule, list(timing.steps) or [timing]) if timing.complete and timed_model(schedule) else None
    for d in range(schedule.devices):
        state, stages = _state_bytes(schedule, model, layers, d)
        act, op, alive = (_activation_peak(schedule, model, layers, d) if timed is None
                          else _timed_peak(timed[d], model, layers))
        peaks.append(state + act)
        if limit is not None and state + act > limit:
            when = timing.start.get(op) if op is not None else None
            diags.append(error(
                f"device {d}: {_gib(state + act)} at its peak exceeds the limit {_gib(limit)}: weights, gradients "
                f"and optimizer state {_gib(state)} ({'stage' if len(stages) == 1 else 'stages'} "
                f"{listed(list(map(str, stages)))}) and activations "
                f"{_gib(act)} of {alive} {'holdings' if timed else 'microbatch-stages'} alive"
                + (f" at time {when:g} when {label(schedule, op)} runs" if when is not None else ""),
                op.span if op is not None else None))
    if not diags:
        shown = listed([f"device {d} {_gib(p)}" for d, p in enumerate(peaks)])
        diags.append(Diagnostic(Severity.NOTE, f"peak memory per device: {shown}"
                                + (f" (limit {_gib(limit)})" if limit is not None else "")))
    return diags


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def _state_bytes(schedule: Schedule, model: Model, layers: list[int], d: int) -> tuple[float, list[int]]:
    stages = sorted({s for pipe in schedule.pipelines for s, dev in enumerate(pipe.placement) if dev == d})
    return sum(layers[s] for s in stages) * model.state_bytes_per_layer(), stages


def _activation_peak(schedule: Schedule, model: Model, layers: list[int], d: int) -> tuple[float, Op | None, int]:
    """Peak activation bytes over device d's order, the op reaching it and how many activations are alive."""
    per_layer = model.activation_bytes_per_layer()
    releases = schedule.releases
    alive = peak = 0.0
    count = peak_count = 0
    at = None
    for op in schedule.orders[d]:
        if not 0 <= op.stage < len(layers):
            continue
        size = schedule.activation[op.stage] * layers[op.stage] * per_layer
        if op.kind == OpKind.F:
            alive, count = alive + size, count + 1
            if alive > peak:
                peak, at, peak_count = alive, op, count
        elif op.kind in releases:
            alive, count = alive - size, count - 1
    return peak, at, peak_count


def _timed_peak(held: list[Held], model: Model, layers: list[int]) -> tuple[float, Op | None, int]:
    """Peak bytes of what device d holds (activations, kept gradients, task state, each in activation
    units of its stage), the op reaching it and how many holdings are alive then."""
    per_layer = model.activation_bytes_per_layer()
    peak, at, count = peak_of(held, lambda h: h.units * layers[h.op.stage] * per_layer)
    return peak, at.op if at is not None else None, count


def parse_bytes(text: str) -> float:
    """'80GiB', '512 MB', '1e10' -> bytes; anything else is a usage error (exit 2)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*", text or "")
    unit = match.group(2).lower() if match else None
    if not match or unit not in UNITS or float(match.group(1)) <= 0:
        raise SchedError(error(f"--memory-limit: cannot read {text!r} (write e.g. 80GiB, 512MB or 1e10)"),
                         OPTIONS, exit_code=2)
    return float(match.group(1)) * UNITS[unit]


def load_model(path: str) -> Model:
    """Read a model description (TOML); errors are located in the file (exit 2)."""
    return _model(*read_toml(path, "model description"))


def _model(table: dict, source: Source) -> Model:
    values, diags = read_fields(table, source, MODEL_KEYS, {"dtype"}, also=tuple(CLUSTER_MODEL_KEYS))
    if diags:
        raise SchedError(diags, source, exit_code=2)
    return Model(**values)
