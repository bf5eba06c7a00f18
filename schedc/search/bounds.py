"""Lower bounds of a candidate before it is simulated (schedc/search.py prunes by them): its makespan,
its end-of-step tail and its memory before any activation, from its pipelines alone (a Shape: no
order is compiled). None exceeds what simulating the candidate gives, so pruning keeps the top K exact.

    1F1B p=4 m=8, F=1 B=2, no messages: device 3 cannot start before F(0..2) ran (3), runs 8 x 3
    units of ops, and its last op, B(3,7), leaves B(2..0) to run (6): makespan_bound 33, 1F1B's makespan
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from ..costmodel import Setting, device_memory, step_tails
from ..ops import OVERLAP, OpKind, builtin_kinds, fed_by, feeds


@dataclass(frozen=True)
class Shape:
    """What a schedule is made of without its order: devices and pipelines (for step_tails and bounds);
    with `orders`, the starts of the devices' orders (frontend/prefix.py) and what their ops free."""

    devices: int
    pipelines: tuple
    orders: tuple = ()
    split_backward: bool = False
    mixed_backward: bool = False
    # the memory model reads these of a schedule; a Shape has none (its peaks are the order walk's)
    tasks = ()
    recompute = offload = False

    @property
    def memory(self) -> dict:
        return {}

    @property
    def stages(self) -> int:
        return self.pipelines[0].stages

    @property
    def chunks(self) -> int:
        """Sequence chunks per microbatch, as Schedule.chunks (the pipelines hold them)."""
        return getattr(self.pipelines[0], "chunks", 1) if self.pipelines else 1


def makespan_bound(shape: Shape, table: dict[str, tuple[float, ...]], links, split: bool,
                   mixed: bool = False, pairs: bool = True) -> float:
    """No simulated makespan is below this: some device runs all its ops one at a time (busy), not
    before a forward of its first stage could arrive (the forwards that feed it and their messages),
    and its last op (a backward, without a split backward) leaves the backwards it feeds still to run.
    A mixed backward (`mixed`: full B or I + W per microbatch, overlapped F & B pairs) is bounded by
    mixed_costs and without the backwards after the last op (which may be a W); `pairs`: whether its
    programs can place overlapped pairs at all (V-Half's cannot: its F then saves nothing)."""
    return combine_terms(shape, [pipeline_terms(pipe.placement, table, links, split, mixed, pairs)
                                 for pipe in shape.pipelines])


def pipeline_terms(placement: tuple[int, ...], table: dict[str, tuple[float, ...]], links, split: bool,
                   mixed: bool = False, pairs: bool = True) -> tuple[tuple[float, ...], ...]:
    """Per stage of a pipeline so placed, makespan_bound's terms that do not depend on its microbatches:
    (the least time before its first forward can start, one microbatch's ops, the least time after its
    last backward), as combine_terms sums them."""
    if mixed:
        table, split = mixed_costs(table, pairs), False
    kinds = builtin_kinds(split)
    ahead = _reach(OpKind.F.value, placement, table, links)
    behind = [0.0] * len(placement) if split or mixed else _left(OpKind.B.value, placement, table, links)
    unit = [sum(ops) for ops in zip(*(table[kind] for kind in kinds))]  # per stage, its kinds in order
    return tuple(ahead), tuple(unit), tuple(behind)


def combine_terms(shape: Shape, terms: list[tuple[tuple[float, ...], ...]]) -> float:
    """makespan_bound from each pipeline's pipeline_terms: per device, the least time ahead, its
    microbatches times one microbatch's ops summed over its stages, the least time behind."""
    busy = [0.0] * shape.devices
    front = [math.inf] * shape.devices
    back = [math.inf] * shape.devices
    for pipe, (ahead, unit, behind) in zip(shape.pipelines, terms, strict=True):
        count = len(pipe.microbatches)
        for s, dev in enumerate(pipe.placement):
            busy[dev] += count * unit[s]
            front[dev] = min(front[dev], ahead[s])
            back[dev] = min(back[dev], behind[s])
    return max((f + b + k for f, b, k in zip(front, busy, back) if b > 0), default=0.0)


def mixed_costs(table: dict[str, tuple[float, ...]], pairs: bool = True) -> dict[str, tuple[float, ...]]:
    """Per stage, the least an F and a backward can cost under a mixed backward: a backward is a B or an
    I + W (the lesser), and, where the programs place overlapped pairs (`pairs`), an F overlapped with
    a backward saves at most F + B - FB of its stage (simulate.fuse_costs), which is taken off the F
    (each F is in at most one pair). Without pairs every F costs its own F.

        F = 3, B = 6, FB = 7 (2 hidden)  ->  F 1, B 6   (pairs=False: F 3, B 6)
    """
    f, b = table[OpKind.F.value], table[OpKind.B.value]
    split = [i + w for i, w in zip(table.get(OpKind.I.value, b), table.get(OpKind.W.value, [0.0] * len(b)))]
    backward = tuple(min(x, y) if OpKind.I.value in table else x for x, y in zip(b, split))
    overlap = table.get(OVERLAP) if pairs else None
    saved = [max(0.0, x + y - z) for x, y, z in zip(f, b, overlap or [math.inf] * len(f))]
    return {**table, OpKind.F.value: tuple(max(0.0, x - v) for x, v in zip(f, saved)), OpKind.B.value: backward}


@cache
def _chain(kind: str, n: int) -> tuple[int, ...]:
    """The n stages in the order `kind`'s output flows through them (ops.feeds), from the stage whose
    op reads no neighbour (ops.fed_by): 0, 1, ... for F; the last stage down to 0 for B."""
    stage = next(s for s in range(n) if not 0 <= fed_by(kind, s)[1] < n)
    order = [stage]
    while (to := feeds(kind, stage)) is not None and 0 <= to < n:
        order.append(to)
        stage = to
    return tuple(order)


def _reach(kind: str, place: tuple[int, ...], table, links) -> list[float]:
    """Per stage, the least time from the start of the chain until its op of `kind` can start: the ops
    before it in the chain and their messages."""
    reach = [0.0] * len(place)
    order = _chain(kind, len(place))
    for here, to in zip(order, order[1:]):
        reach[to] = reach[here] + table[kind][here] + links[place[here]][place[to]]
    return reach


def _left(kind: str, place: tuple[int, ...], table, links) -> list[float]:
    """Per stage, the least time from the end of its op of `kind` until the chain's end: the messages
    and ops after it in the chain."""
    left = [0.0] * len(place)
    order = _chain(kind, len(place))
    for here, to in reversed(list(zip(order, order[1:]))):
        left[here] = links[place[here]][place[to]] + table[kind][to] + left[to]
    return left


def tail_bound(st: Setting, shape: Shape) -> float:
    """The end-of-step tail predict adds (the largest device's), at least: its communication as little
    as whatever the last op hides lets it be (Tail.exposed), plus the optimizer."""
    return max(tail.exposed(st.layout, None) + tail.optimizer for tail in step_tails(st, shape))


def state_bound(st: Setting, shape: Shape, held: tuple | None = None) -> tuple[float, int]:
    """The largest device's bytes before any activation: weights, gradients, optimizer state and one
    backward's working memory (device_memory with no activation alive), and that device. With the
    starts of the devices' orders (Shape.orders), the activations alive at their peaks too: the walk of
    a whole order passes through its start's sums, so its peak is no lower.

        1f1b p=4: device 0's start F(0,0..3) B(0,0) holds 4 microbatches' activations of stage 0

    held: the shape's held_bytes, when the caller keeps it (device_memory)."""
    memory, _ = device_memory(st, shape, (0.0,) * shape.devices, held)
    top = max(range(len(memory)), key=lambda k: (memory[k], -k))
    return memory[top], top


def lane_bound(sharded, shape: Shape) -> float:
    """ZeRO 2/3: the least time the busiest device's communication lane (simulate.Lane) needs, which the
    simulated makespan includes: one reduce-scatter of a stage's gradients per microbatch (its backward,
    or W, makes them: costmodel.sharding) and at level 3 at least one gather of each stage it holds
    (none is gathered when the step starts), one after another on the lane. `sharded`: the shape's
    sharding.sharded_collectives (None without ZeRO 2/3).

        p = 2, m = 4, level 3, 1 s per collective of each stage  ->  4 + 1 = 5 s on each device
    """
    if sharded is None:
        return 0.0
    lane = [0.0] * shape.devices
    gathered: set[tuple[int, int]] = set()
    for pipe in shape.pipelines:
        for s, dev in enumerate(pipe.placement):
            lane[dev] += len(pipe.microbatches) * sharded.seconds[s]
            if sharded.level == 3 and (dev, s) not in gathered:
                gathered.add((dev, s))
                lane[dev] += sharded.seconds[s]
    return max(lane, default=0.0)
