"""Timing: what simulate returns, the start and end of every placed op and the derived statistics."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any, Iterator

from ..ir import Op, Schedule


@dataclass(frozen=True, slots=True)
class Span:
    """What the cost model predicts a step from: the makespan, each device's busy time and activation
    peaks. A Timing has them too; the search's walk times an order without building one."""

    makespan: float
    busy: tuple[float, ...]
    peak_memory: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Timing:
    """Start and end of every placed op, and the derived statistics."""

    start: Mapping[Op, float]
    end: Mapping[Op, float]
    makespan: float
    busy: tuple[float, ...]
    peak_memory: tuple[float, ...]
    latency: float
    complete: bool  # False when the orders deadlock: ops that never ran have no times
    steps: tuple[Timing, ...] = ()  # a filled plan's K step programs, each timed from its own start
    extra: dict[str, Any] = field(default_factory=dict)  # written by fill_bubbles, read by no one: Stats.of
    # takes the fill's figures from the timings before and after it (to be dropped with fill's rewrite)
    sequence: Sequence[tuple[float, float, Op]] = ()  # (start, end, op) in start order: a topological order
    # (a tuple, or simulate's StartOrder: the same, sorted when first read)
    peak_host: tuple[float, ...] = ()  # with `offload F`: per device, the peak of its activations on the host

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.makespan - b for b in self.busy)

    @property
    def idle_inside(self) -> tuple[float, ...]:
        """Per device, its idle time between the start of its first op and the end of its last one
        (zero bubble's steady-state bubble: the warm-up's and the drain's idle left out); a filled
        cycle sums its step programs'."""
        if self.steps:
            return tuple(sum(row) for row in zip(*(step.idle_inside for step in self.steps)))
        first, last = _device_runs(self.start, self.end) or _device_spans(self)
        return tuple(last[d] - first[d] - b if d in first else 0.0 for d, b in enumerate(self.busy))

    def stats(self) -> dict[str, Any]:
        devices = len(self.busy)
        busy = sum(self.busy)
        span = self.makespan * devices
        return {
            "makespan": _round(self.makespan),
            "utilization": _round(busy / span) if span else 0.0,
            "bubble": _round(bubble(self.makespan, self.busy)),
            "busy": [_round(b) for b in self.busy],
            "idle": [_round(i) for i in self.idle],
            "idle_inside": [_round(i) for i in self.idle_inside],
            "peak_memory": [_round(m) for m in self.peak_memory],
            "latency": self.latency,
            **({"peak_host_memory": [_round(m) for m in self.peak_host]} if self.peak_host else {}),
        }


def _device_spans(timing: Timing) -> tuple[dict[int, float], dict[int, float]]:
    """Per device, the start of its first op and the end of its last, op by op."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    timed = timing.sequence or ((timing.start[op], timing.end[op], op) for op in timing.start)
    for start, end, op in timed:
        first[op.device] = min(first.get(op.device, start), start)
        last[op.device] = max(last.get(op.device, end), end)
    return first, last


def _device_runs(start: Mapping[Op, float], end: Mapping[Op, float]) -> tuple[dict, dict] | None:
    """_device_spans from simulate's parallel lists, a run of one device's ops at a time (simulate
    indexes them device by device): a min and a max over each run's slice in C instead of two dict
    updates per op. None when the times are not simulate's lists (then _device_spans)."""
    if not (isinstance(start, OpTimes) and isinstance(end, OpTimes) and start._ops is end._ops):
        return None
    starts, ends = start._times, end._times
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    n = 0
    for d, run in groupby(map(_DEVICE, start._ops)):
        k = n + len(list(run))
        low, high = min(starts[n:k]), max(ends[n:k])
        first[d], last[d] = (min(first[d], low), max(last[d], high)) if d in first else (low, high)
        n = k
    return first, last


_DEVICE = attrgetter("device")


def bubble(makespan: float, busy) -> float:
    """The bubble, as DESIGN.md and Narayanan et al. (2021) define it: the devices' idle time over their
    busy (ideal) time, (p - 1)/m for 1F1B with F=1, B=2. A ratio, not a fraction of the step: above 1
    when a device idles longer than it works (1F1B with p=1000, m=8: 124.875); 1 - utilization is the
    idle share of makespan x devices. 0 with no work. simulate, compile, render and tune all show this."""
    total = sum(busy)
    return (makespan * len(busy) - total) / total if total else 0.0


def _round(x: float) -> float:
    """A stat as printed and stored: 9 decimal places (float noise such as 1.0000000000000002 dropped),
    and never -0 (a difference that rounds to zero is 0)."""
    return round(x, 9) + 0.0


class OpTimes(Mapping):
    """Op -> time, from parallel lists. The dict is built on the first lookup: a compile that finds
    nothing wrong looks no op up, and hashing 10^5 ops (a Python-level __hash__) is most of the cost."""

    __slots__ = ("_ops", "_times", "_table")

    def __init__(self, ops: list[Op], times: list[float]):
        self._ops, self._times, self._table = ops, times, None

    def table(self) -> dict[Op, float]:
        if self._table is None:
            self._table = dict(zip(self._ops, self._times))
        return self._table

    def __getitem__(self, op: Op) -> float:
        return self.table()[op]

    def get(self, op: Op, default: Any = None) -> Any:
        return self.table().get(op, default)

    def __contains__(self, op: object) -> bool:
        return op in self.table()

    def __iter__(self) -> Iterator[Op]:
        return iter(self.table())

    def __len__(self) -> int:
        return len(self.table())


class StartOrder(Sequence):
    """(start, end, op) of parallel lists, sorted by start (stable: a tie keeps the lists' order), the
    sort done when first read: simulate's Timing.sequence, which lowering reads and a compile that
    stops before lowering (`simulate`, --cluster) does not. Equal to the tuple of the same items."""

    __slots__ = ("_lists", "_sorted")

    def __init__(self, starts: list[float], ends: list[float], ops: list[Op]):
        self._lists, self._sorted = (starts, ends, ops), None

    def items(self) -> tuple[tuple[float, float, Op], ...]:
        if self._sorted is None:
            self._sorted = tuple(sorted(zip(*self._lists), key=_START))
            self._lists = None
        return self._sorted

    def __getitem__(self, n):
        return self.items()[n]

    def __len__(self) -> int:
        return len(self._sorted if self._lists is None else self._lists[0])

    def __iter__(self) -> Iterator[tuple[float, float, Op]]:
        return iter(self.items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StartOrder | tuple):
            return self.items() == tuple(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"StartOrder({self.items()!r})"


_START = itemgetter(0)


@dataclass(frozen=True, slots=True)
class Stats(Mapping):
    """A compiled schedule's statistics, as `schedc simulate --json` prints them and plan.json stores
    them. Read as fields (stats.makespan) or, like the JSON, by key (stats["busy"]); iterating gives the
    JSON's keys in its order, and the fill fields only for a filled schedule."""

    makespan: float
    utilization: float
    bubble: float              # idle over busy time (Narayanan et al.: (p-1)/m), not a fraction: bubble()
    busy: tuple[float, ...]
    idle: tuple[float, ...]
    idle_inside: tuple[float, ...]  # idle between each device's first and last op (steady-state bubble)
    peak_memory: tuple[float, ...]
    latency: float
    devices: int
    ops: int
    cycle_steps: int
    utilization_unfilled: float | None = None   # filled schedules: before fill_bubbles,
    step_times: tuple[float, ...] | None = None  # each step program's length,
    makespan_unfilled: float | None = None       # and the unfilled makespan,
    utilization_useful: float | None = None     # the utilization without the overhead of cut pieces,
    pieces: dict[str, int] | None = None          # each filled task's pieces per instance,
    lagged: tuple[str, ...] | None = None         # and the task groups run on the previous cycle's results
    peak_host_memory: tuple[float, ...] | None = None  # with `offload F`: the host's peak per device

    @classmethod
    def of(cls, schedule: Schedule, timing: Timing, unfilled: Timing | None = None) -> Stats:
        """The stats of a schedule timed by `timing`; `unfilled`: its timing before fill_bubbles."""
        base = timing.stats()
        fill = {}
        if unfilled is not None:
            fill = {"utilization_unfilled": unfilled.stats()["utilization"],
                    "step_times": tuple(_round(t.makespan) for t in timing.steps),
                    "makespan_unfilled": _round(unfilled.makespan),
                    "utilization_useful": _round(timing.extra.get("utilization_useful", base["utilization"])),
                    "pieces": dict(timing.extra.get("pieces", {})), "lagged": tuple(timing.extra.get("lagged", ()))}
        return cls(**{**base, "busy": tuple(base["busy"]), "idle": tuple(base["idle"]),
                      "idle_inside": tuple(base["idle_inside"]), "peak_memory": tuple(base["peak_memory"]),
                      **({"peak_host_memory": tuple(base["peak_host_memory"])} if "peak_host_memory" in base else {})},
                   devices=schedule.devices,
                   ops=schedule.op_count(), cycle_steps=len(schedule.steps), **fill)

    def to_json(self) -> dict[str, Any]:
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is None and name in _FILL_FIELDS:
                continue
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


_FILL_FIELDS = ("utilization_unfilled", "step_times", "makespan_unfilled", "utilization_useful", "pieces", "lagged",
                "peak_host_memory")  # (and the host's peak: given only with `offload F`)
