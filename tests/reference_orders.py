"""Reference per-rank op orders for well-known pipeline schedules.

These are the *independent* constructions the schedc tests compare the compiler's output against.
Nothing here imports schedc: every order is either written out from the published rule of the
schedule (closed form) or taken from another implementation (torch.distributed.pipelining).

An order is ``list[list[tuple]]``: ``orders[rank]`` is the sequence of compute ops rank ``rank``
runs in one training step.  An op is ``(kind, stage, mb)`` with ``kind`` in ``{"F", "B"}``
(``B`` = full backward), ``stage`` the global model-stage index and ``mb`` the global microbatch
index; Chimera ops carry a fourth element, the pipeline name (``"down"`` / ``"up"``).

Functions
---------
gpipe(p, m)                 all F (mb ascending) then all B (mb ascending), stage d on rank d.
one_f_one_b(p, m)           Megatron-LM non-interleaved 1F1B (PipeDream-Flush).
interleaved(p, v, m)        torch's ScheduleInterleaved1F1B.pipeline_order, converted.
interleaved_closed_form(p, v, m)
                            Megatron-LM interleaved 1F1B written from its index formulas.
interleaved_torch_csv(p, v, m) / orders_from_torch_csv(text)
                            the same torch order in torch's compute-only CSV form (_dump_csv).
chimera(p, m)               Chimera (Li & Hoefler, SC'21) as run by kazukiosawa/pipe-fisher.
placement_*(...)            rank of each stage for the checks.
replay(orders, ...)         dependency replay used by the self-test.
format_order(ops)           compact text form, e.g. ``F0.0d F0.1d F3.4u B3.4u``.
"""

from __future__ import annotations

import csv
import io

Op = tuple
Orders = list  # list[list[Op]]


# --------------------------------------------------------------------------------------------
# GPipe and 1F1B (one stage per rank, stage d on rank d)
# --------------------------------------------------------------------------------------------

def gpipe(p: int, m: int) -> Orders:
    """GPipe (fill-drain): rank d runs F(d, 0..m-1) then B(d, 0..m-1), both ascending.

    The backward order is ascending microbatch order, as in torch's ``ScheduleGPipe``
    (``_step_microbatches`` and ``_get_pipeline_order`` both loop ``for i in range(m)`` for the
    backward) and in pipe-fisher's ``_call_gpipe_pipeline`` (FIFO queue of saved activations).
    """
    return [[("F", d, i) for i in range(m)] + [("B", d, i) for i in range(m)] for d in range(p)]


def one_f_one_b(p: int, m: int) -> Orders:
    """Megatron-LM 1F1B without interleaving (``forward_backward_pipelining_without_interleaving``).

    On rank d (stage d): ``w = min(p - 1 - d, m)`` warm-up forwards F(d,0..w-1); then ``m - w``
    steady-state pairs "F(d, w+j), B(d, j)" for j = 0..m-w-1; then the cool-down backwards
    B(d, m-w..m-1).  Forwards and backwards are each in ascending microbatch order.
    """
    orders = []
    for d in range(p):
        w = min(p - 1 - d, m)
        ops = [("F", d, i) for i in range(w)]
        for j in range(m - w):
            ops += [("F", d, w + j), ("B", d, j)]
        ops += [("B", d, j) for j in range(m - w, m)]
        orders.append(ops)
    return orders


# --------------------------------------------------------------------------------------------
# Interleaved 1F1B (v chunks per rank, stage c*p + d on rank d)
# --------------------------------------------------------------------------------------------

class _MockStage:
    """Stand-in for ``torch.distributed.pipelining.stage._PipelineStageBase``.

    ``ScheduleInterleaved1F1B.__init__`` (torch 2.13) only reads ``num_stages``, ``group_size`` and
    ``group_rank`` of the stages and assigns ``stage_index_to_group_rank`` on each; it computes the
    order of *every* rank, and lowers it with send/recv actions, without any process group.  The
    other attributes are set for robustness against small changes in torch.
    """

    def __init__(self, stage_index: int, num_stages: int, group_rank: int, group_size: int):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_rank = group_rank
        self.group_size = group_size
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.stage_index_to_group_rank = {}
        self.has_backward = True
        self.submod = None  # the split-backward schedules' torch.compile check finds no module


def _torch_interleaved_schedule(p: int, v: int, m: int):
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    # the stages rank 0 would hold: chunk c is stage c*p + 0 (torch's "loop" placement s -> s % p)
    stages = [_MockStage(c * p, p * v, 0, p) for c in range(v)]
    return ScheduleInterleaved1F1B(stages, m)


def _convert_torch_actions(actions) -> list[Op]:
    ops = []
    for a in actions:
        if a is None:  # idle slot
            continue
        kind = a.computation_type.value if hasattr(a.computation_type, "value") else str(a.computation_type)
        if kind in ("F", "B"):
            ops.append((kind, int(a.stage_index), int(a.microbatch_index)))
        elif kind in ("I", "W", "OVERLAP_F_B"):
            raise ValueError(f"unexpected action {a!r} in a full-backward schedule")
        # REDUCE_GRAD / UNSHARD / RESHARD / comm actions are not compute ops of the order
    return ops


def interleaved(p: int, v: int, m: int) -> Orders:
    """Interleaved 1F1B as torch's own ``ScheduleInterleaved1F1B.pipeline_order`` produces it.

    Built with mock stages (no process group is needed).  Stage of chunk c on rank d is ``c*p + d``
    (round-robin placement, stage s on rank ``s % p``).  Idle slots (``None``) are dropped and each
    ``_Action(stage, F|B, mb)`` becomes ``(kind, stage, mb)``.
    """
    sched = _torch_interleaved_schedule(p, v, m)
    return [_convert_torch_actions(sched.pipeline_order[d]) for d in range(p)]


def interleaved_torch_csv(p: int, v: int, m: int) -> str:
    """torch's compute-only CSV for the interleaved order (one row per rank, as ``_dump_csv``
    writes it: ``str(_Action)`` cells such as ``4F0``; idle slots are empty cells)."""
    sched = _torch_interleaved_schedule(p, v, m)
    buf = io.StringIO()
    writer = csv.writer(buf)
    for d in range(p):
        writer.writerow(["" if a is None else str(a) for a in sched.pipeline_order[d]])
    return buf.getvalue()


def orders_from_torch_csv(text: str) -> Orders:
    """Parse a torch compute-only schedule CSV (``<stage><F|B><mb>`` cells) into orders."""
    orders = []
    for row in csv.reader(io.StringIO(text)):
        ops = []
        for cell in row:
            cell = cell.strip()
            if not cell:
                continue
            for kind in ("F", "B"):
                stage, sep, mb = cell.partition(kind)
                if sep and stage.isdigit() and mb.isdigit():
                    ops.append((kind, int(stage), int(mb)))
                    break
            else:
                raise ValueError(f"unexpected cell {cell!r}")
        orders.append(ops)
    return orders


def interleaved_closed_form(p: int, v: int, m: int) -> Orders:
    """Megatron-LM interleaved 1F1B (Narayanan et al. 2021), written from its index formulas.

    Requires ``m % p == 0``.  Rank d runs ``T = m*v`` "virtual microbatches" forward and backward.
    Virtual forward k (0 <= k < T): ``chunk = (k // p) % v``, ``mb = (k // (p*v))*p + k % p``;
    virtual backward k: same mb, ``chunk = v - 1 - (k // p) % v`` (chunks reversed).  The op's
    stage is ``chunk*p + d``.
    Warm-up ``w = min((v-1)*p + 2*(p-1-d), T)`` forwards 0..w-1; then T-w steady pairs
    "forward w+j, backward j"; then backwards T-w..T-1.  (This is current Megatron-core and torch;
    very old Megatron versions special-cased m == p as all-forward-then-all-backward.)
    """
    if m % p:
        raise ValueError("closed form needs m % p == 0")
    T = m * v

    def fwd(d, k):
        return ("F", ((k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    def bwd(d, k):
        return ("B", (v - 1 - (k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    orders = []
    for d in range(p):
        w = min((v - 1) * p + 2 * (p - 1 - d), T)
        ops = [fwd(d, k) for k in range(w)]
        for j in range(T - w):
            ops += [fwd(d, w + j), bwd(d, j)]
        ops += [bwd(d, k) for k in range(T - w, T)]
        orders.append(ops)
    return orders


# --------------------------------------------------------------------------------------------
# Chimera
# --------------------------------------------------------------------------------------------

def chimera(p: int, m: int) -> Orders:
    """Chimera with two pipelines, as run by kazukiosawa/pipe-fisher (``pipeline.py``,
    ``PipelineStage._call_chimera_pipeline``, "direct concatenation" of basic units).

    FINDINGS (read from pipe-fisher ``pipeline.py`` and ``main_bert.py``; re-implemented here)
    -----------------------------------------------------------------------------------------
    Pipelines and microbatches.
      * ``down``: stage s on rank s.  ``up``: stage s on rank p-1-s.  Every rank holds one stage
        of each (main_bert.py: ``rank_to_stage(rank)`` = rank for down, ``p-1-rank`` for up;
        the rank's ``PipelineStage`` is its down stage and ``up_pipe_stage`` its up stage).
      * Each pipeline gets n = m/2 microbatches per step (main_bert.py halves
        ``num_micro_batches_per_step`` for Chimera) from its own data iterator.  Here ``down`` owns
        global microbatches 0..n-1 and ``up`` owns n..m-1 (our numbering convention; pipe-fisher
        just draws them from two loaders).  Each stage runs its forwards and its backwards in
        FIFO order (next(iterator); saved activations popped with ``popleft``), so the k-th F
        (resp. B) of a pipeline on a rank is its k-th microbatch of that pipeline.
      * Requirements: p even, m even and m % p == 0 (pipe-fisher asserts ``n*2 % p == 0``).

    Per-rank rule.  Let h = p/2 and U = m/p = n/h (number of basic units, pipe-fisher's
    ``acc_steps``).  On rank d call X the pipeline in which d holds a stage in the FIRST half
    (X = down if d < h, else X = up; pipe-fisher's ``up_side_down = not first_half``), Y the other
    one, and ``sx = min(d, p-1-d)`` the stage of X on d (the stage of Y is p-1-sx).  Let
    a = h - sx (1..h; pipe-fisher's ``schedule_number_a``) and b = h - a = sx.
    X-ops and Y-ops below each take the next microbatch of that pipeline in FIFO order.
    For unit u = 0..U-1:
        a times:  [B(X) if u > 0]  F(X)        -- for u > 0 the previous unit's pending
                                                  backwards of X are interleaved here:
                                                  this *is* the direct concatenation
        b times:  F(Y)  F(X)
        a times:  F(Y)  B(Y)
        b times:  B(X)  B(Y)
    and after the last unit:
        a times:  B(X)
    So every rank does h forwards of X and h forwards of Y per unit; rank d starts with exactly
    ``a`` forwards of X before its first F(Y), and its first backward is B(Y), after
    a + 2b + 1 = h + b + 1 forwards (a F(X), b pairs F(Y)F(X), then one F(Y)).
    Unit 0 of ranks 0 and p-1 (sx = 0, a = h, b = 0): h F(X), then h pairs F(Y)B(Y)
    (they hold the LAST stage of Y, so B follows F immediately); their h B(X) are deferred.
    Unit 0 of ranks h-1 and h (sx = h-1, a = 1, b = h-1): F(X), then h-1 pairs F(Y)F(X), then
    F(Y)B(Y), then h-1 pairs B(X)B(Y); one B(X) is deferred.
    With U = 1 (m = p) there is no concatenation; with U > 1 unit u+1's first a forwards of X are
    each preceded by one of unit u's a deferred B(X), and the last unit's a deferred B(X) end the
    step.  (pipe-fisher then issues the gradient all-reduces; not part of this order.)

    Ops are ``(kind, stage, mb, pipeline_name)``.  Source: github.com/kazukiosawa/pipe-fisher,
    ``pipeline.py`` (``_call_chimera_pipeline``) and ``main_bert.py`` (stage/rank mapping, halved
    microbatch count).
    """
    if p % 2 or m % 2 or m % p:
        raise ValueError("chimera needs p even, m even and m % p == 0")
    h = p // 2
    n = m // 2
    units = m // p
    base = {"down": 0, "up": n}

    def stage_of(pipe, d):
        return d if pipe == "down" else p - 1 - d

    orders = []
    for d in range(p):
        X, Y = ("down", "up") if d < h else ("up", "down")
        sx = min(d, p - 1 - d)
        a = h - sx
        b = h - a
        nxt = {("F", X): 0, ("B", X): 0, ("F", Y): 0, ("B", Y): 0}
        ops: list[Op] = []

        def emit(kind, pipe):
            i = nxt[(kind, pipe)]
            nxt[(kind, pipe)] = i + 1
            ops.append((kind, stage_of(pipe, d), base[pipe] + i, pipe))

        for u in range(units):
            for _ in range(a):
                if u > 0:
                    emit("B", X)
                emit("F", X)
            for _ in range(b):
                emit("F", Y)
                emit("F", X)
            for _ in range(a):
                emit("F", Y)
                emit("B", Y)
            for _ in range(b):
                emit("B", X)
                emit("B", Y)
        for _ in range(a):
            emit("B", X)
        orders.append(ops)
    return orders


# --------------------------------------------------------------------------------------------
# Placement, replay, formatting
# --------------------------------------------------------------------------------------------

def placement_single(p: int):
    """rank of (stage, pipe) for GPipe / 1F1B."""
    return lambda stage, pipe=None: stage


def placement_interleaved(p: int, v: int):
    return lambda stage, pipe=None: stage % p


def placement_chimera(p: int):
    return lambda stage, pipe: stage if pipe == "down" else p - 1 - stage


def _pipe(op):
    return op[3] if len(op) > 3 else None


def replay(orders: Orders, num_stages: int) -> list[Op]:
    """Replay all ranks round-robin with unbounded message buffers: a rank runs its next op as
    soon as its predecessors are done (F(s,i) needs F(s-1,i); B(s,i) needs F(s,i) and B(s+1,i);
    same pipeline).  Returns the global completion sequence; raises if the replay gets stuck."""
    done = set()
    pos = [0] * len(orders)
    seq = []
    total = sum(len(o) for o in orders)
    while len(seq) < total:
        progressed = False
        for r, ops in enumerate(orders):
            if pos[r] >= len(ops):
                continue
            op = ops[pos[r]]
            kind, s, i, pipe = op[0], op[1], op[2], _pipe(op)
            if kind == "F":
                ready = s == 0 or ("F", s - 1, i, pipe) in done
            else:
                ready = ("F", s, i, pipe) in done and (s == num_stages - 1 or ("B", s + 1, i, pipe) in done)
            if ready:
                done.add((kind, s, i, pipe))
                seq.append(op)
                pos[r] += 1
                progressed = True
        if not progressed:
            stuck = {r: orders[r][pos[r]] for r in range(len(orders)) if pos[r] < len(orders[r])}
            raise AssertionError(f"replay deadlocked; next ops per rank: {stuck}")
    return seq


def format_op(op: Op) -> str:
    s = f"{op[0]}{op[1]}.{op[2]}"
    if len(op) > 3:
        s += str(op[3])[0]
    return s


def format_order(ops) -> str:
    return " ".join(format_op(o) for o in ops)


def chimera_table(p: int, m: int) -> dict[int, str]:
    return {d: format_order(ops) for d, ops in enumerate(chimera(p, m))}
