"""Reference per-rank orders for the zero-bubble family, looped BFS, DualPipe and DualPipeV.

Independent of schedc (nothing here imports it): the schedc tests compare the compiler's orders
against these.  Two kinds of reference:

* torch 2.13's own ``pipeline_order`` (torch.distributed.pipelining.schedules), built with mock
  stages as tests/reference_orders.py does for ScheduleInterleaved1F1B: ``zbv``, ``interleaved_zb``,
  ``zb_h1`` (ScheduleInterleavedZeroBubble with one stage per rank), ``looped_bfs``, ``dualpipev``;
* constructions written afresh from the published rules: ``zb_h2`` (the hand-made ZB-H2 shape of
  Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, as drawn in the comment of the
  sail-sg scheduler's manual order), ``v_half`` and ``v_min`` (Qi et al., "Pipeline Parallelism
  with Controllable Memory", 2024: the V-shape building block repeated, then squeezed and
  reordered as the sail-sg generator does; ``v_half_block`` / ``v_min_block`` without the squeeze)
  and ``dualpipe`` (the eight steps of DeepSeek's DualPipe, DeepSeek-V3 technical report and
  deepseek-ai/DualPipe ``dualpipe.py``).

Neutral form.  ``orders[rank]`` is the list of units rank ``rank`` runs in one step.  A unit is
either an op ``(kind, stage, mb)`` -- ``kind`` in ``F``, ``B`` (full backward), ``I`` (input
gradient), ``W`` (weight gradient); DualPipe's ops carry a fourth element, the pipeline
(``"down"`` / ``"up"``) -- or an overlapped pair ``(forward_op, backward_op)`` that runs as one
unit (torch's ``OVERLAP_F_B``, DualPipe's "F&B").  ``is_overlap(unit)`` tells them apart and
``halves(unit)`` gives the ops of a unit.  Stages are global indices; ``placement_*`` give the rank
of each stage.
"""

from __future__ import annotations

from collections import deque

from reference_orders import _MockStage  # the stage attributes torch's constructors read

Op = tuple
Unit = tuple  # an Op or a pair (forward Op, backward Op)
Orders = list  # list[list[Unit]]

BACKWARDS = ("B", "I")  # the op that carries the gradient to the previous stage


def is_overlap(unit: Unit) -> bool:
    return isinstance(unit[0], tuple)


def halves(unit: Unit) -> tuple:
    return tuple(unit) if is_overlap(unit) else (unit,)


def ops_of(orders: Orders) -> list:
    """Every op of every rank, overlapped pairs split into their halves."""
    return [op for units in orders for unit in units for op in halves(unit)]


# --------------------------------------------------------------------------------------------
# Placements
# --------------------------------------------------------------------------------------------

def placement_single(p: int):
    return lambda stage, pipe=None: stage


def placement_loop(p: int):
    """Stage s on rank s % p (interleaved, looped BFS): chunk c of rank d is stage c*p + d."""
    return lambda stage, pipe=None: stage % p


def placement_v(p: int):
    """V shape, 2p stages: rank d holds stage d (chunk 0) and stage 2p-1-d (chunk 1)."""
    return lambda stage, pipe=None: stage if stage < p else 2 * p - 1 - stage


def placement_dual(p: int):
    """DualPipe: pipeline ``down`` has stage s on rank s, ``up`` stage s on rank p-1-s."""
    return lambda stage, pipe: stage if pipe == "down" else p - 1 - stage


# --------------------------------------------------------------------------------------------
# torch 2.13's own orders
# --------------------------------------------------------------------------------------------

def _torch():
    from torch.distributed.pipelining import schedules
    return schedules


def _convert_unit(action):
    kind = action.computation_type.value
    if kind == "OVERLAP_F_B":
        return tuple(_convert_unit(sub) for sub in action.sub_actions)
    if kind in ("F", "B", "I", "W"):
        return (kind, int(action.stage_index), int(action.microbatch_index))
    return None  # UNSHARD / RESHARD / REDUCE_GRAD / comms: not units of the order


def convert_torch_order(pipeline_order: dict) -> Orders:
    """torch's ``pipeline_order`` (rank -> list of ``_Action`` or None) in the neutral form: idle
    slots dropped, OVERLAP_F_B cells kept as (forward, backward) pairs."""
    orders = []
    for rank in range(len(pipeline_order)):
        units = [_convert_unit(a) for a in pipeline_order[rank] if a is not None]
        orders.append([u for u in units if u is not None])
    return orders


def torch_schedule(name: str, p: int, v: int, m: int):
    """Build torch's schedule ``name`` for rank 0's stages (the order of every rank is computed)."""
    cls = getattr(_torch(), name)
    if name in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
        stages = [_MockStage(0, 2 * p, 0, p), _MockStage(2 * p - 1, 2 * p, 0, p)]
    else:
        stages = [_MockStage(c * p, p * v, 0, p) for c in range(v)]
    return cls(stages, m)


def torch_order(name: str, p: int, v: int, m: int) -> Orders:
    return convert_torch_order(torch_schedule(name, p, v, m).pipeline_order)


def zbv(p: int, m: int) -> Orders:
    """torch's ScheduleZBVZeroBubble: 2p stages in a V (placement_v), split backward everywhere."""
    return torch_order("ScheduleZBVZeroBubble", p, 2, m)


def torch_rounds_allow(p: int, m: int) -> bool:
    """torch's interleaved schedules run m in max(1, m // p) equal rounds: m must divide evenly."""
    return m % max(1, m // p) == 0


def interleaved_zb(p: int, v: int, m: int) -> Orders:
    """torch's ScheduleInterleavedZeroBubble (ZB1P with v chunks per rank, placement_loop)."""
    return torch_order("ScheduleInterleavedZeroBubble", p, v, m)


def zb_h1(p: int, m: int) -> Orders:
    """ZB-H1: torch's ScheduleInterleavedZeroBubble with one stage per rank."""
    return interleaved_zb(p, 1, m)


def looped_bfs(p: int, v: int, m: int) -> Orders:
    """torch's ScheduleLoopedBFS (Lamy-Poirier 2023): every forward of chunk 0, of chunk 1, ...;
    then the backwards chunk by chunk in reverse, microbatches descending."""
    return torch_order("ScheduleLoopedBFS", p, v, m)


def dualpipev(p: int, m: int) -> Orders:
    """torch's ScheduleDualPipeV (placement_v; needs m >= 2p); B, I, W mixed, OVERLAP_F_B pairs."""
    return torch_order("ScheduleDualPipeV", p, 2, m)


def torch_csv(name: str, p: int, v: int, m: int) -> str:
    """torch's compute-only CSV of a schedule (``_dump_csv(format="compute_only")`` cells)."""
    order = torch_schedule(name, p, v, m).pipeline_order
    return "".join(",".join("" if a is None else str(a) for a in order[r]) + "\n" for r in range(p))


# --------------------------------------------------------------------------------------------
# ZB-H2 (hand-made shape of the zero bubble paper)
# --------------------------------------------------------------------------------------------

def zb_h2(p: int, m: int) -> Orders:
    """ZB-H2 (Qi et al. 2024, section 3, Figure 3): rank d warms up with w = min(2(p-1-d)+1, m)
    forwards -- p-1-d more than ZB-H1, enough to cover the time until its first input gradient
    arrives --, then alternates input gradient and forward while forwards remain, then alternates
    weight and input gradients, and ends with the remaining weight gradients (F, I, W ascending).

        rank 0 of p=4, m=12:  F*7 (I F)*5 I (W I)*6 W*6    = fffffff bfbfbfbfbf b wbwbwbwbwbwb wwwwww

    which is the shape drawn in the manual-order comment of the sail-sg scheduler.  With unit
    costs F = I = W every rank is busy from its first op to its last (zero steady-state bubble).
    """
    orders = []
    for d in range(p):
        w = min(2 * (p - 1 - d) + 1, m)
        ops = [("F", d, i) for i in range(w)]
        for k in range(m - w):
            ops += [("I", d, k), ("F", d, w + k)]
        ops.append(("I", d, m - w))
        for k in range(w - 1):
            ops += [("W", d, k), ("I", d, m - w + 1 + k)]
        ops += [("W", d, k) for k in range(w - 1, m)]
        orders.append(ops)
    return orders


# --------------------------------------------------------------------------------------------
# V-Half and V-Min (building blocks of "Pipeline Parallelism with Controllable Memory")
# --------------------------------------------------------------------------------------------

def v_block(kind: str, p: int) -> list[list[int]]:
    """The building block: for rank d, the slots (unit time each) of microbatch 0's
    [F chunk 0, F chunk 1, I chunk 1, I chunk 0] in a repeating period of 6 slots (the two W's
    fill the remaining two).  A chunk's slots are offset by one per rank in the direction its
    data flows; the gap between the forward and the backward half of the V sets the memory:
    V-Min keeps about a third of 1F1B's activations, V-Half a half.  The extra interval keeps the
    four slots distinct modulo 6 where they would collide (p % 3 == 0 for V-Min, p even for V-Half).
    """
    if kind == "min":
        g = 2 if p % 3 == 0 else 0
        return [[d, 2 * p - 1 - d, 2 * p + g + d, 4 * p + g - 1 - d] for d in range(p)]
    if kind == "half":
        g = 3 if p % 2 == 0 else 0
        return [[2 * d, 3 * p - 2 - d, 3 * p + g + 2 * d - 1, 6 * p + g - 2 - d] for d in range(p)]
    raise ValueError(kind)


# Rank d's op types in the building block, in this order: forward of chunk 0 (stage d), forward of
# chunk 1 (stage 2p-1-d), input gradient of chunk 1, input gradient of chunk 0; the weight
# gradients are types 4 (of type 2's) and 5 (of type 3's), or one type 4 for both while squeezing.
_DOWN = (0, 2)  # types whose data comes from rank d-1 (chunk 0 forward, chunk 1 backward)
_UP = (1, 3)    # types whose data comes from rank d+1


def _fill_weights(times: list[list[int]], split: bool) -> list[list[int]]:
    """Add the weight gradients to one rank's slots: walking the slots in time, a slot no op holds
    runs the oldest pending W (type 2's before type 3's when ``split``); those still pending after
    the last slot follow it one by one."""
    times = [list(t) for t in times[:4]]
    ws = [[], []] if split else [[]]
    pending = [0, 0] if split else [0]
    at = {t: k for k, ts in enumerate(times) for t in ts}
    last = max(at)
    for t in range(last + 1):
        if t in at:
            if at[t] in (2, 3):
                pending[at[t] - 2 if split else 0] += 1
            continue
        for w in range(len(ws)):
            if pending[w]:
                ws[w].append(t)
                pending[w] -= 1
                break
    t = last
    for w in range(len(ws)):
        for _ in range(pending[w]):
            t += 1
            ws[w].append(t)
    return times + ws


def _peak(times: list[list[int]]) -> int:
    """Peak activations of one rank in chunk units: a forward adds one, a W frees one; without W
    slots (squeezing the backward order) every free slot after a backward frees one."""
    delta = (1, 1, 0, 0, -1, -1)
    at = {t: k for k, ts in enumerate(times) for t in ts}
    has_w = len(times) > 4
    cur = peak = owed = 0
    for t in range(max(at) + 1):
        k = at.get(t)
        if k is not None:
            cur += delta[k]
            owed += k in (2, 3)
        elif not has_w and owed:
            cur -= 1
            owed -= 1
        peak = max(peak, cur)
    return peak


def _in_time_order(times):
    """(rank, type, mb) of every op, by (slot, rank, type, mb)."""
    return sorted(((t, d, k, i) for d, rank in enumerate(times) for k, ts in enumerate(rank)
                   for i, t in enumerate(ts)))


def _dependency_slot(times, d, k, i) -> int:
    """The latest slot among what (d, k, i) waits for: its neighbour's op of the same type, its
    previous type on this rank (the V's turn), the previous microbatch of its type; a W waits for
    the i-th backward of its rank."""
    dep = -1
    if k in _DOWN and d > 0:
        dep = max(dep, times[d - 1][k][i])
    if k in _UP and d + 1 < len(times):
        dep = max(dep, times[d + 1][k][i])
    if 0 < k < 4:
        dep = max(dep, times[d][k - 1][i])
    if k == 4:
        dep = max(dep, sorted(times[d][2] + times[d][3])[i])
    if i > 0:
        dep = max(dep, times[d][k][i - 1])
    return dep


def _squeeze(times, with_w: bool):
    """Move ops of the warm-up (only ``with_w``) and of the cool-down to the earliest free slot
    after their dependencies where the rank's peak memory stays within the block's; the steady
    state (from rank 0's first chunk-0 input gradient to the last chunk-0 forward) stays."""
    if with_w:
        times = [_fill_weights(rank, split=False) for rank in times]
    times = [[list(ts) for ts in rank] for rank in times]
    bound = max(_peak(rank) for rank in times)
    used = [set() for _ in times]
    phase = 0
    last_mb = len(times[0][0]) - 1
    for t, d, k, i in _in_time_order(times):
        if phase == 0 and k == 3 and d == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_w):
            if phase == 1 and k == 0 and i == last_mb:
                phase = 2
            used[d].add(t)
            continue
        for slot in range(_dependency_slot(times, d, k, i) + 1, t):
            if slot in used[d]:
                continue
            times[d][k][i] = slot
            if _peak(times[d]) <= bound:
                break
        else:
            times[d][k][i] = t
        used[d].add(times[d][k][i])
    if not with_w:
        times = [_fill_weights(rank, split=False) for rank in times]
    return _eager(times)


def _eager(times):
    """Each op as early as its dependencies and its rank's previous op allow, unit costs, in the
    slots' order; returns the start slots (the sail-sg 'squeeze')."""
    end = {}
    prev = [None] * len(times)
    out = [[[0] * len(ts) for ts in rank] for rank in times]
    for _, d, k, i in _in_time_order(times):
        start = 0
        if k in _DOWN and d > 0:
            start = max(start, end[d - 1, k, i])
        if k in _UP and d + 1 < len(times):
            start = max(start, end[d + 1, k, i])
        if 0 < k < 4:
            start = max(start, end[d, k - 1, i])
        if i > 0:
            start = max(start, end[d, k, i - 1])
        if prev[d] is not None:
            start = max(start, end[prev[d]])
        end[d, k, i] = start + 1
        prev[d] = (d, k, i)
        out[d][k][i] = start
    return out


def _v_order(kind: str, p: int, m: int, squeeze: bool = True) -> Orders:
    """Microbatch i of each of the block's four ops at its slot + 6i; with ``squeeze``, the warm-up
    and cool-down are squeezed twice (first placing W's, then without them), as the reference
    generator does; then the W's fill the free slots and each rank runs its ops in slot order."""
    times = [[[t + 6 * i for i in range(m)] for t in block] for block in v_block(kind, p)]
    if squeeze:
        times = [rank[:4] for rank in _squeeze(times, with_w=True)]
        times = [rank[:4] for rank in _squeeze(times, with_w=False)]
    orders = []
    for d, rank in enumerate(times):
        stage = (d, 2 * p - 1 - d, 2 * p - 1 - d, d, 2 * p - 1 - d, d)
        kind_of = ("F", "F", "I", "I", "W", "W")
        timed = sorted((t, k, i) for k, ts in enumerate(_fill_weights(rank, split=True)) for i, t in enumerate(ts))
        orders.append([(kind_of[k], stage[k], i) for _, k, i in timed])
    return orders


def v_half(p: int, m: int) -> Orders:
    """V-Half as the reference generator orders it: the half-memory building block repeated m
    times, warm-up and cool-down squeezed, W's in the free slots."""
    return _v_order("half", p, m)


def v_min(p: int, m: int) -> Orders:
    """V-Min as the reference generator orders it (minimal-memory block, squeezed)."""
    return _v_order("min", p, m)


def v_half_block(p: int, m: int) -> Orders:
    """V-Half's building block repeated m times as it is, W's in the free slots (no squeezing)."""
    return _v_order("half", p, m, squeeze=False)


def v_min_block(p: int, m: int) -> Orders:
    """V-Min's building block repeated m times as it is, W's in the free slots (no squeezing)."""
    return _v_order("min", p, m, squeeze=False)


# --------------------------------------------------------------------------------------------
# DualPipe
# --------------------------------------------------------------------------------------------

def dualpipe(p: int, m: int) -> Orders:
    """DualPipe (DeepSeek-V3, deepseek-ai/DualPipe ``dualpipe.py``), per-rank order in 8 steps.

    Two pipelines of p stages over the same ranks, in opposite directions (placement_dual); each
    owns m/2 microbatches (``down`` 0..m/2-1, ``up`` m/2..m-1).  Needs p even, m even, m >= 2p.
    On rank d let h = p/2, r = min(d, p-1-d), X the pipeline in which d is in the first half of the
    stages (``down`` for d < h) and Y the other; every op takes the next microbatch of its
    (pipeline, kind) in order, backwards of one pipeline share one counter whether full (B) or split
    (I), and each W runs the oldest pending I of the rank (one FIFO):

      1. F(X) * 2(h-r-1)                 5. (B(Y), F(Y)&B(X)) * (h-r-1)
      2. (F(X) F(Y)) * (r+1)             6. (B(Y) B(X)) * (r+1), the later half split (I):
      3. (I(Y) W F(Y)) * (h-r-1)            Y's from iteration (r+1)//2 on when r is odd,
      4. (F(X)&B(Y), F(Y)&B(X))             X's from that iteration on when r is even
         * (m/2 - p + r + 1); on the     7. (W I(X)) * (h-r-1)
         middle ranks (r = h-1) the      8. W * (r+1)
         first F(X)&B(Y) runs as F(X) B(Y)
    ``&`` is an overlapped pair (forward, backward).
    """
    if p % 2 or m % 2 or m < 2 * p:
        raise ValueError("dualpipe needs p even, m even and m >= 2p")
    h, n = p // 2, m // 2
    base = {"down": 0, "up": n}
    orders = []
    for d in range(p):
        r = min(d, p - 1 - d)
        X, Y = ("down", "up") if d < h else ("up", "down")
        stage = {"down": d, "up": p - 1 - d}
        count = {}
        fifo = deque()
        units = []

        def op(kind, pipe):
            key = ("F" if kind == "F" else "B", pipe)
            i = count.get(key, 0)
            count[key] = i + 1
            o = (kind, stage[pipe], base[pipe] + i, pipe)
            if kind == "I":
                fifo.append(o)
            return o

        def weight():
            _, s, i, pipe = fifo.popleft()
            return ("W", s, i, pipe)

        units += [op("F", X) for _ in range(2 * (h - r - 1))]
        for _ in range(r + 1):
            units += [op("F", X), op("F", Y)]
        for _ in range(h - r - 1):
            units.append(op("I", Y))
            units.append(weight())
            units.append(op("F", Y))
        for k in range(n - p + r + 1):
            if k == 0 and r == h - 1:
                units += [op("F", X), op("B", Y)]
            else:
                units.append((op("F", X), op("B", Y)))
            units.append((op("F", Y), op("B", X)))
        for _ in range(h - r - 1):
            units.append(op("B", Y))
            units.append((op("F", Y), op("B", X)))
        split = False
        for k in range(r + 1):
            if k == (r + 1) // 2 and r % 2 == 1:
                split = True
            units.append(op("I" if split else "B", Y))
            if k == (r + 1) // 2 and r % 2 == 0:
                split = True
            units.append(op("I" if split else "B", X))
        for _ in range(h - r - 1):
            units.append(weight())
            units.append(op("I", X))
        units += [weight() for _ in range(r + 1)]
        if fifo:
            raise AssertionError(f"rank {d}: weight gradients left over: {list(fifo)}")
        orders.append(units)
    return orders


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------

def format_unit(unit: Unit) -> str:
    if is_overlap(unit):
        return "(" + ";".join(format_unit(h) for h in unit) + ")"
    s = f"{unit[0]}{unit[1]}.{unit[2]}"
    return s + str(unit[3])[0] if len(unit) > 3 else s


def format_order(units) -> str:
    return " ".join(format_unit(u) for u in units)
