"""Lowering: a schedule's per-device orders -> per-rank instruction streams with communication.

A forward whose next stage sits on another device gets a SEND_F after it and a RECV_F on the
consumer; gradients likewise (SEND_B/RECV_B). Streams are written in simulated time order and a
receive is posted when its message is sent: in the sender's send order (NCCL matches messages per pair
in issue order), early enough not to stall the consumer, and so that no two ranks' sends can wait on
each other (see lower_step).
Replicated stages get SYNC_GRAD (ascending stage, the same order on every rank), then STEP.

    device 0: F(0,0) B(0,0)          rank 0: F(0,0) SEND_F(0,0)>1 RECV_B(1,0)<1 B(0,0) STEP
    device 1: F(1,0) B(1,0)   ->     rank 1: RECV_F(0,0)<0 F(1,0) B(1,0) SEND_B(1,0)>0 STEP
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from itertools import chain, compress, count, repeat
from operator import and_, attrgetter, gt, itemgetter, le, ne, truth
from typing import Any

from ..ir import Op, Schedule, consume
from ..ops import BUILTIN, Opcode, feeds, message
from ..plan import Instr, Plan

LINK_KEY = attrgetter("kind", "pipe", "stage", "device")
_START, _END, _OP = itemgetter(0), itemgetter(1), itemgetter(2)
_KIND, _STAGE, _MB, _PIPE, _DEVICE, _PARTS = map(attrgetter, ("kind", "stage", "mb", "pipe", "device", "parts"))
_NONE = repeat(None)
_ITEM_FIELDS = attrgetter("kind", "stage", "mb", "pipe", "device")


class _Links(dict):
    """The message an op sends after it, by LINK_KEY (kind, pipeline, stage, device): (send opcode,
    receive opcode, peer), or (None, None, device) for none. A dict filled on first use, so that looking
    up every op is one C-level map."""

    def __init__(self, schedule: Schedule):
        super().__init__()
        self.pipelines = schedule.pipelines

    def __missing__(self, key: tuple) -> tuple:
        kind, k, s, device = key
        pipe, found = self.pipelines[k], (None, None, device)
        to, codes = feeds(kind, s), message(kind)
        if to is not None and 0 <= to < pipe.stages and pipe.placement[to] != device:
            found = (*codes, pipe.placement[to])
        self[key] = found
        return found


def lower_step(schedule: Schedule, step: tuple[tuple[Op, ...], ...],
               sequence: tuple[tuple[float, float, Op], ...]) -> list[list[Instr]]:
    """Lower one step program of every device; returns instruction lists per rank.

    The streams are written in simulated time: each op when it starts, its sends when it ends (`sequence`
    is the simulation's (start, end, op) in start order, a topological order). When a send is written,
    its receive is posted on the receiver at the receiver's current place: while it computes something
    else, before the consumer starts, and in the sender's order. Every wait (a send on its receive, a
    consumer on its data, an instruction on the one before it) then points backwards in this sweep, so
    a replay with rendezvous sends cannot deadlock.

    Each instruction is an item of the sweep (see _items); in time order, each is appended to its rank's
    stream. Only an op that takes negative time lets a device's sends to one peer end out of their
    order; then _sweep posts the receives that are due with each send. The command line refuses
    negative costs; a Schedule built in Python may still carry one.
    """
    devices, links = schedule.devices, _Links(schedule)
    starts, ends, ops = zip(*sequence) if sequence else ((), (), ())
    streams = None
    if ops and 3 * len(ops) >= ARRAY_ITEMS and not schedule.fused and all(map(le, starts, ends)):
        streams = _rank_streams(ops, links, starts, ends, devices)
    if streams is None:
        streams = _swept(schedule, ops, links, starts, ends)
    if schedule.fused:
        for stream in streams:
            stream[:] = filter(None, stream)  # the second halves, now inside their OVERLAP_F_B
    if schedule.collectives:
        _declare(schedule, streams)
    syncs = _sync_grads(schedule)
    for d, (stream, unsent) in enumerate(zip(streams, _unsent(step, ops, links, devices))):
        stream += unsent
        stream += syncs.get(d, ())
        stream.append(Instr(Opcode.STEP.value))
    return streams


def _swept(schedule: Schedule, ops: list[Op], links: _Links, starts: list[float], ends: list[float]) -> list[list[Instr]]:
    """The streams of lower_step, every item made first (_items) and then appended in sweep order."""
    streams: list[list[Instr]] = [[] for _ in range(schedule.devices)]
    targets, instrs, sending = _items(ops, links, streams)
    if schedule.fused:
        _overlap(schedule.fused, ops, instrs)
    if all(map(le, starts, ends)):  # each send posts just its own receive: append every item (in C)
        for order in _order_pieces(starts, ends, sending):
            consume(map(list.append, map(targets.__getitem__, order), map(instrs.__getitem__, order)))
    else:
        _sweep(_order(starts, ends, sending), targets, instrs, sending)
    return streams


def _rank_streams(ops: Sequence[Op], links: _Links, starts: Sequence[float], ends: Sequence[float],
                  devices: int) -> list[list[Instr]] | None:
    """_swept's streams for a big program whose ends follow their starts, made rank by rank: the items
    of _items, put in sweep order (_order_arrays) and grouped by rank, keeping that order (a stable
    sort); each rank's instructions are then made one after another from the items' columns (small
    integers, turned back into the opcodes, ints and peers by table lookups). A rank's instructions so
    lie together in memory, and the passes after lowering (the channel check, the plan writer) read
    them in order rather than scattered among every other rank's. None (make them with _swept) unless
    every op is a built-in one, its kind a str, and every stage, mb and pipe an int >= 0
    (tests/test_lower.py holds the two forms together)."""
    import numpy as np
    kind, stage, mb, pipe, device = zip(*map(_ITEM_FIELDS, ops))  # one pass over the ops, scattered in memory
    values = list(chain(stage, mb, pipe))
    if not (BUILTIN.issuperset(kind) and {str}.issuperset(map(type, kind)) and {int}.issuperset(map(type, values))
            and min(values) >= 0):
        return None
    ints = list(range(max(values) + 1))  # the ints the instructions hold, one object per value
    del values
    send, receive, peer = zip(*map(links.__getitem__, zip(kind, pipe, stage, device)))
    number = defaultdict(count().__next__)  # opcode -> its number, in order of first use
    code = np.array(list(map(number.__getitem__, chain(kind, receive, send))), dtype=np.int32)
    code = code.reshape(3, -1).T.ravel()  # by item: 3n the op's kind, 3n + 1 its receive, 3n + 2 its send
    names = list(number)
    # by item, the peer field as a number, devices standing for None; then the rank it is written to
    peers = np.array([[devices] * len(ops), device, peer], dtype=np.int32).T.ravel()
    rank = np.array([device, peer, device], dtype=np.int32).T.ravel()
    peer_of = [*range(devices), None]
    sending = list(map(truth, send))
    del kind, device, send, receive, peer
    order = _order_arrays(starts, ends, sending)
    del sending
    grouped = rank[order]
    order = order[np.argsort(grouped, kind="stable")]
    bounds = np.concatenate(([0], np.cumsum(np.bincount(grouped, minlength=devices)))).tolist()
    del grouped, rank
    fields = [np.array(column, dtype=np.int64) for column in (stage, mb, pipe)]
    streams = []
    for a, b in zip(bounds, bounds[1:]):
        items = order[a:b]
        n = items // 3
        columns = (map(names.__getitem__, code[items].tolist()),
                   *(map(ints.__getitem__, column[n].tolist()) for column in fields),
                   map(peer_of.__getitem__, peers[items].tolist()))
        streams.append(list(map(_instr, zip(*columns, _NONE, _NONE, _NONE, _NONE))))
    return streams


_instr = partial(tuple.__new__, Instr)  # Instr from all nine fields (skips the Python-level __new__)


def _instrs(op, stage, mb, pipe, peer) -> list[Instr]:
    """Instrs from columns (iterables) of opcode, stage, microbatch, pipeline and peer."""
    return list(map(_instr, zip(op, stage, mb, pipe, peer, _NONE, _NONE, _NONE, _NONE)))


def _items(ops: list[Op], links: _Links, streams: list[list[Instr]]) -> tuple[list, list, list[bool]]:
    """The instructions of the sweep, three items for the op at position n of the sequence: 3n its
    compute, 3n + 1 the receive its message needs and 3n + 2 the send. Returns, by item, the stream it is
    written to and the instruction, and by op whether it sends (else its message items are unused)."""
    kind, stage, mb, pipe, device = (list(map(field, ops)) for field in (_KIND, _STAGE, _MB, _PIPE, _DEVICE))
    send, receive, peer = zip(*map(links.__getitem__, zip(kind, pipe, stage, device))) if ops else ((), (), ())
    targets, instrs = [None] * (3 * len(ops)), [None] * (3 * len(ops))
    targets[::3] = targets[2::3] = list(map(streams.__getitem__, device))
    targets[1::3] = list(map(streams.__getitem__, peer))
    instrs[::3] = _instrs(kind, stage, mb, pipe, _NONE)
    instrs[1::3] = _instrs(receive, stage, mb, pipe, device)
    instrs[2::3] = _instrs(send, stage, mb, pipe, peer)
    if not BUILTIN.issuperset(kind):  # tasks, which may be split in parts (a built-in's parts are its chunks)
        parts = [1 if k in BUILTIN else n for k, n in zip(kind, map(_PARTS, ops))]
        for n in compress(range(len(ops)), map(ne, parts, repeat(1))):
            instrs[3 * n] = _instr((kind[n], stage[n], mb[n], pipe[n], None, None, ops[n].part, parts[n], None))
    return targets, instrs, list(map(truth, send))


def _overlap(fused: tuple[tuple[Op, Op], ...], ops: list[Op], instrs: list) -> None:
    """Make each overlapped pair that ran one OVERLAP_F_B instruction, with its halves in the pair's
    order, in the place of its first half; the second half's compute item becomes None. The pair ran
    as one op (simulate: the first half waits for the inputs of both and takes the pair's time, the
    second follows at no cost), so the receives of both halves are posted before it, and the sends of
    both follow it, the first half's first."""
    where = {id(op): n for n, op in enumerate(ops)}
    for first, second in fused:
        n, k = where.get(id(first)), where.get(id(second))
        if n is not None and k is not None:
            instrs[3 * n] = Instr(Opcode.OVERLAP_F_B.value, halves=(instrs[3 * n], instrs[3 * k]))
            instrs[3 * k] = None


def _order(starts: list[float], ends: list[float], sending: list[bool]) -> list[int]:
    """The items in sweep order. Computes are written at their op's start, messages at its end; at one
    time, the messages of ops that took time come first, by position; then computes and the messages of
    instant ops, by position, an op's compute before its messages."""
    times = [0.0] * (3 * len(starts))
    times[::3], times[1::3], times[2::3] = starts, ends, ends
    late = list(map(and_, sending, map(gt, ends, starts)))
    instant = list(map(ne, sending, late))  # sends and took no time
    first = [*compress(range(1, len(times), 3), late), *compress(range(2, len(times), 3), late)]
    rest = [*range(0, len(times), 3), *compress(range(1, len(times), 3), instant),
            *compress(range(2, len(times), 3), instant)]
    first.sort()
    rest.sort()
    order = first + rest
    order.sort(key=times.__getitem__)  # stable: the ties keep the order above
    return order


# Past this many items the sweep order is sorted as arrays (_order_arrays) and handed out in pieces: a
# list of them is an int object each (at 10^6 ops, 3 x 10^6 items: a tenth of a GiB while lowering).
ARRAY_ITEMS, PIECE = 1 << 20, 1 << 16


def _order_pieces(starts: list[float], ends: list[float], sending: list[bool]) -> Iterator[list[int]]:
    """_order's items, in its order, as consecutive lists (the whole of it for a small program)."""
    if 3 * len(starts) < ARRAY_ITEMS:
        yield _order(starts, ends, sending)
        return
    order = _order_arrays(starts, ends, sending)
    for at in range(0, len(order), PIECE):
        yield order[at:at + PIECE].tolist()


def _order_arrays(starts: list[float], ends: list[float], sending: list[bool]):
    """_order over numpy arrays, equal to it (tests/test_lower.py): the same items, sorted stably by
    time from the same tie order (messages of ops that took time by position, then the rest)."""
    import numpy as np
    start, end, sends = np.array(starts, dtype=float), np.array(ends, dtype=float), np.array(sending, dtype=bool)
    late = sends & (end > start)
    items = np.arange(3 * len(starts), dtype=np.int32 if 3 * len(starts) < 2 ** 31 else np.int64).reshape(-1, 3)
    first = items[:, 1:][late].ravel()  # already in position order (row-major)
    rest = np.concatenate((items[:, 0], items[:, 1:][sends & ~late].ravel()))
    rest.sort()
    del items, late, sends
    order = np.concatenate((first, rest))
    del first, rest
    times = np.column_stack((start, end, end)).ravel()
    del start, end
    keyed = times[order]
    del times
    return order[np.argsort(keyed, kind="stable")]


def _sweep(order: list[int], targets: list, instrs: list, sending: list[bool]) -> None:
    """Write the items in sweep order when a device's sends to a peer may end out of their order: a
    receive item posts, in the sender's order, every receive of its channel up to its own not yet posted."""
    channels: dict[tuple, list[int]] = {}  # (receiving stream, sending stream) by id -> receive items
    place = {}  # receive item -> its channel and its place in it
    for item in compress(range(1, len(instrs), 3), sending):
        channel = channels.setdefault((id(targets[item]), id(targets[item + 1])), [])
        place[item] = channel, len(channel)
        channel.append(item)
    posted: dict[int, int] = {}  # id of a channel -> how many of its receives are posted
    for item in order:
        if item not in place:
            targets[item].append(instrs[item])
            continue
        channel, k = place[item]
        done = posted.get(id(channel), 0)
        targets[item] += map(instrs.__getitem__, channel[done:k + 1])
        posted[id(channel)] = max(done, k + 1)


def _unsent(step: tuple[tuple[Op, ...], ...], ops: list[Op], links: _Links, devices: int) -> list[list[Instr]]:
    """By rank, the receives of messages never sent, by sender and in its send order: those of the ops a
    deadlock kept from running (a suffix of each device's order). The streams end with them."""
    unsent: list[dict[int, list[Instr]]] = [{} for _ in range(devices)]  # receiver -> sender -> receives
    if len(ops) < sum(map(len, step)):
        ran = set(map(id, ops))
        for d, order in enumerate(step):
            for op in order:
                _, receive, peer = links[LINK_KEY(op)]
                if receive and id(op) not in ran:
                    unsent[peer].setdefault(d, []).append(
                        _instr((receive, op.stage, op.mb, op.pipe, d, None, None, None, None)))
    return [[instr for sender in sorted(row) for instr in row[sender]] for row in unsent]


def _declare(schedule: Schedule, streams: list[list[Instr]]) -> None:
    """After every op (or overlapped half) of a kind in `schedule.collectives`, the collectives it issues,
    in their order, each over the op's own rank or its stage's replica ranks (ir.Issued).

        Issued(F, ALL_TO_ALL) x 2:  F(0,0) SEND_F(0,0)>1  ->  F(0,0) ALL_TO_ALL(0,0) ALL_TO_ALL(0,0) SEND_F(0,0)>1
    """
    issued: dict[tuple[str, int], list[tuple[str, bool]]] = {}
    for c in schedule.collectives:
        for s in range(schedule.stages) if c.stages is None else sorted(c.stages):
            issued.setdefault((c.kind, s), []).append((c.collective, c.replicas))
    groups = _stage_groups(schedule)
    for stream in streams:
        out: list[Instr] = []
        for instr in stream:
            out.append(instr)
            for half in instr.units():
                pipe = half.pipe or 0
                out += [Instr(code, half.stage, half.mb, half.pipe, group=groups[pipe][half.stage] if replicas
                              else (schedule.pipelines[pipe].placement[half.stage],))
                        for code, replicas in issued.get((half.op, half.stage), ())]
        stream[:] = out


def _stage_groups(schedule: Schedule) -> list[list[tuple[int, ...]]]:
    """groups[pipe][stage]: the ranks holding that stage in the pipeline's replica group (SYNC_GRAD's)."""
    of = {k: group for group in schedule.replicas for k in group}
    return [[tuple(sorted({schedule.pipelines[j].placement[s] for j in of.get(k, (k,))}))
             for s in range(pipe.stages)] for k, pipe in enumerate(schedule.pipelines)]


def _sync_grads(schedule: Schedule) -> dict[int, list[Instr]]:
    """By device, SYNC_GRAD for every replicated stage it holds, ascending by stage (one pass over the
    replicas' stages for all devices, not one per device)."""
    out: dict[int, list[Instr]] = {}
    for group in schedule.replicas:
        for s in range(schedule.pipelines[group[0]].stages):
            ranks = sorted({schedule.pipelines[k].placement[s] for k in group})
            if len(ranks) > 1:
                for device in ranks:
                    out.setdefault(device, []).append(Instr(Opcode.SYNC_GRAD.value, s, None, group=tuple(ranks)))
    return {device: sorted(instrs, key=lambda i: i.stage) for device, instrs in out.items()}


def plan_meta(schedule: Schedule, stats: Mapping[str, Any],
              links: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
    """What plan.json records beside the streams. With the per device pair message times a `--cluster`
    compile simulated with, "links" lists [from, to, seconds] for the pairs its pipelines send over,
    and a per-stage activation size other than 1 is "activation": a re-simulation of the plan (simulate
    or render of plan.json) then gives the compile's figures."""
    extra: dict[str, Any] = {}
    if links is not None:
        pairs = {(a, b) for pipe in schedule.pipelines for a, b in zip(pipe.placement, pipe.placement[1:]) if a != b}
        extra["links"] = [[a, b, links[a][b]] for a, b in sorted(pairs | {(b, a) for a, b in pairs})]
    if any(size != 1.0 for size in schedule.activation):
        extra["activation"] = list(schedule.activation)
    if schedule.chunks > 1:  # sequence chunks: an instruction's mb is its unit (ops.unit_of)
        extra["chunks"] = schedule.chunks
    return {
        "schedule": schedule.name,
        "description": schedule.description,
        "source": schedule.source.path,
        "params": schedule.params,
        "devices": schedule.devices,
        "stages": schedule.stages,
        "microbatches": schedule.microbatches * schedule.chunks,
        "pipelines": [{"name": p.name, "stages": p.stages, "placement": list(p.placement),
                       "microbatches": list(p.microbatches)} for p in schedule.pipelines],
        "replicas": [list(g) for g in schedule.replicas],
        "costs": {**{k: list(v) for k, v in schedule.costs.items()}, **_task_costs(schedule)},
        "stats": dict(stats),
        **extra,
    }


def _task_costs(schedule: Schedule) -> dict[str, list[float]]:
    """Per task kind, the cost of one of its pieces on each stage (0 where it has none), as placed: a
    plan's re-simulation (simulate or render of plan.json) charges them from this table."""
    costs: dict[str, list[float]] = {}
    for program in schedule.steps:
        for order in program:
            if BUILTIN.issuperset(map(_KIND, order)):  # no task on this device: a C-level pass
                continue
            for op in order:
                if op.is_task:
                    costs.setdefault(op.kind, [0.0] * schedule.stages)[op.stage] = op.cost
    return dict(sorted(costs.items()))


def lower(schedule: Schedule, stats: Mapping[str, Any],
          sequences: Sequence[tuple[tuple[float, float, Op], ...]],
          links: Sequence[Sequence[float]] | None = None) -> Plan:
    """Schedule -> Plan: every rank's K step programs with communication, gradient sync and STEP.
    sequences: for each step program, its ops as (start, end, op) in start order (simulate.step_sequences);
    stats: what plan.json records of the simulation; links: the message times it ran with (plan_meta).

        1F1B p=2 m=1: orders (F(0,0) B(0,0)), (F(1,0) B(1,0))
        -> rank 0: F SEND_F RECV_B B STEP; rank 1: RECV_F F B SEND_B STEP (see lower_step)
    """
    steps = [lower_step(schedule, step, sequence) for step, sequence in zip(schedule.steps, sequences, strict=True)]
    ranks = tuple(tuple(tuple(steps[k][d]) for k in range(len(steps))) for d in range(schedule.devices))
    return Plan(plan_meta(schedule, stats, links), ranks)
