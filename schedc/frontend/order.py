"""Order strategies: per-device programs popping from sorted queues (explicit lists are programs
of named ops), and greedy list scheduling under the cost model.

    queue F by (i, s); on device d { F * 2 ; (F B) * 2 ; B * 2 }
    -> device d's order: F F B F B F ... as the program pops them from its queues

Cursors may name a local chunk (`F[1]`), be optional (`F?`), choose (`(W[1] | W[0])`) and pair a
forward with a backward into one overlapped op (`F[0] & B[1]`, recorded in the schedule's `fused`);
with `backward mixed` a backward queue serves B and I alike and W pops the oldest pending weight
gradient (_MixedBackward).
"""
from __future__ import annotations

from dataclasses import replace
from itertools import chain, islice
from typing import Any

from . import ast
from ..diagnostics import Diagnostic, SchedError, Source, Span, error
from .expr import MAX_INT, EvalError, PipeRef, evaluate, evaluate_int
from ..passes.grid import elide, ranges
from ..budget import PROGRAM_STATEMENTS, REFUSED, STATEMENTS_PER_OP
from ..ir import Op, Pipeline, set_spans
from ..ops import BUILTIN, GRADIENT, SPLIT, OpKind
from ..text import plural
from .hoist import hoisted
from .loops import compiled
from .mixed import BACKWARDS, MixedBackward as _MixedBackward
from .queues import DeviceQueues, QueueKey, StepBudget, by_device, chunk_index


HOIST_ROUNDS = 32  # a loop of this many rounds or more runs its body with the invariants folded in


class _Enough(Exception):
    """A device's program placed an op of a kind it was asked to stop at (run_programs' `until`)."""


class _ProgramRun:
    """Runs one device's program against its queues, collecting the order; the first fault (an empty
    queue, an op named twice or not of this device, a runaway loop) ends it with an EvalError, the first
    op of an `until` kind with _Enough."""

    COMPILED = True  # loops of many rounds run as generated functions (frontend/loops.py; tested against False)

    def __init__(self, device: int, queues: DeviceQueues, ops: list[Op],
                 pipelines: tuple[Pipeline, ...], budget: StepBudget, mixed: _MixedBackward | None = None,
                 chunk: dict[tuple[int, int], int] | None = None, until: frozenset[str] = frozenset()):
        self.device, self.queues, self.ops, self.pipelines, self.budget = device, queues, ops, pipelines, budget
        self.until = until
        self.order: list[Op] = []    # the ops placed so far, as the queues hold them (see placed())
        self.spans: list[Span] = []  # and the span of the cursor that placed each
        self.slots: list[int] = []   # and its unit slot (`F at t`; else the slot after the previous op's)
        self.next_slot = 0
        self.taken: set[int] = set()  # id() of the ops placed so far (and, mixed, of the unchosen halves)
        self._mine: dict[Op, Op] | None = None
        self.names = {p.name: k for k, p in enumerate(pipelines)}
        self.lets: dict[int, bool] = {}  # id(body) -> whether it has a `let` (bodies live as long as the AST)
        self.hoisted: list[tuple[ast.Stmt, ...]] = []  # and the loops' bodies with their invariants folded in
        self.mixed, self.chunk = mixed, chunk or {}
        self.fused: list[tuple[Op, Op]] = []  # overlapped (forward, backward) pairs, placed next to each other
        self.lenient = 0  # > 0 inside an optional item: a pop from an empty queue places nothing

    def run(self, body: tuple[ast.Stmt, ...], env: dict[str, Any]) -> None:
        scoped = self.lets.get(id(body))
        if scoped or (scoped is None and self._scoped(body)):
            env = dict(env)  # the body's lets end with it
        budget, statements = self.budget, self.STATEMENTS
        for stmt in body:
            budget.left -= 1
            if budget.left < 0:
                raise EvalError(budget.refusal(), stmt.span)
            statements[type(stmt)](self, stmt, env)

    def _scoped(self, body: tuple[ast.Stmt, ...]) -> bool:
        """Whether a body binds names (a `let`), so that it needs a scope of its own."""
        found = self.lets.get(id(body))
        if found is None:
            found = self.lets[id(body)] = any(isinstance(stmt, ast.Let) for stmt in body)
        return found

    def _let(self, stmt: ast.Let, env: dict) -> None:
        env[stmt.name] = evaluate(stmt.value, env)

    def _loop(self, stmt: ast.Loop, env: dict) -> None:
        start, stop = evaluate_int(stmt.start, env, "loop start"), evaluate_int(stmt.stop, env, "loop end")
        body = stmt.body
        if stop - start >= HOIST_ROUNDS:  # its invariants folded in (frontend/hoist.py), kept alive for lets
            body = hoisted(stmt, env)
            self.hoisted.append(body)
            make = compiled(stmt, self.mixed is not None, self.UNITS) if self.COMPILED else None
            if make is not None:  # its rounds as one Python function (frontend/loops.py)
                return make(body)(self, dict(env), start, stop)
        scope = dict(env)  # one scope for every round: an unscoped body binds nothing, a scoped one copies it
        budget = self.budget
        for k in range(start, stop):
            budget.left -= 1  # _charge's count, inline
            if budget.left < 0:
                raise EvalError(budget.refusal(), stmt.span)
            scope[stmt.var] = k
            self.run(body, scope)

    def _charge(self, span: Span) -> None:
        """Count one round of a loop (or of a repeated group) against the budget, so that
        `for k in 0 .. 1000000000 { }`, whose body runs no statement, stops like any runaway loop."""
        self.budget.left -= 1
        if self.budget.left < 0:
            raise EvalError(self.budget.refusal(), span)

    def _when(self, stmt: ast.When, env: dict) -> None:
        """`if`, and its `else if`s one after another: each a statement of its own, as run() counts it."""
        while not evaluate(stmt.test, env):
            orelse = stmt.orelse
            if len(orelse) != 1 or type(orelse[0]) is not ast.When:
                return self.run(orelse, env)
            stmt = orelse[0]
            self.budget.left -= 1
            if self.budget.left < 0:
                raise EvalError(self.budget.refusal(), stmt.span)
        self.run(stmt.then, env)

    def _item(self, stmt: ast.Item, env: dict) -> None:
        if stmt.when is not None and not evaluate(stmt.when, env):
            return
        if stmt.repeat is None and not stmt.optional and type(stmt.unit) is ast.Cursor:  # `F[0] at t`: one pop
            if stmt.slot is not None:
                slot = env.get(stmt.slot.id) if type(stmt.slot) is ast.Name else None
                if type(slot) is not int or not -MAX_INT <= slot <= MAX_INT:  # else what evaluate_int gives
                    slot = evaluate_int(stmt.slot, env, "slot")
                self._at(slot, stmt.slot.span)
            self._charge(stmt.span)
            return self._cursor(stmt.unit, env)
        count = evaluate_int(stmt.repeat, env, "repeat count") if stmt.repeat is not None else 1
        if count < 0:
            raise EvalError(f"repeat count is negative ({count})", stmt.repeat.span)
        if stmt.slot is not None:
            self._at(evaluate_int(stmt.slot, env, "slot"), stmt.slot.span)
        self.lenient += stmt.optional
        try:
            count -= 0 if self.lenient or count < 2 else self._rounds_at_once(stmt.unit, count, env)
            unit = self.UNITS[type(stmt.unit)]
            for _ in range(count):
                self._charge(stmt.span)  # every round counts: `F? * 1000000000` stops like any runaway loop
                placed = len(self.order)
                unit(self, stmt.unit, env)
                if self.lenient and len(self.order) == placed:
                    break  # an optional round that placed nothing changed nothing: every later one is the same
        finally:
            self.lenient -= stmt.optional

    def _at(self, slot: int, span: Span) -> None:
        """`at slot`: the item's first op runs in that unit slot, after the device's previous op's."""
        if slot < self.next_slot:
            raise EvalError(f"slot {slot} is not after the slot of the device's previous op "
                            f"({self.order[-1]} in slot {self.next_slot - 1})" if self.order else
                            f"slot {slot} is negative", span)
        self.next_slot = slot

    def _group(self, group: ast.Group, env: dict) -> None:
        self.run(group.body, env)

    def _overlap(self, overlap: ast.Overlap, env: dict) -> None:
        """`F[0] & B[1]`: the two ops placed next to each other, marked as one overlapped op."""
        if overlap.forward.kind != _F or overlap.backward.kind not in GRADIENT:
            raise EvalError(f"an overlapped op is a forward and a backward (F & B or F & I), not "
                            f"{overlap.forward.kind} & {overlap.backward.kind}", overlap.span)
        placed = len(self.order)
        self._cursor(overlap.forward, env)
        if len(self.order) == placed:  # an optional pop found nothing: the pair is skipped whole
            return
        self._cursor(overlap.backward, env)
        if len(self.order) == placed + 1:
            raise EvalError(f"{self.order[-1]} has no backward to overlap with ({overlap.backward.kind} is "
                            "empty)", overlap.span)
        self.fused.append((self.order[-2], self.order[-1]))

    def _choice(self, choice: ast.Choice, env: dict) -> None:
        """`(W[1] | W[0])`: the first cursor whose queue has an op."""
        for cursor in choice.options:
            if self.mixed and cursor.kind == _W and cursor.args is None:  # _next and _cursor in one look
                op = self.mixed.pop_weight(self.pipelines, self._pipe(cursor, env), self._chunk(cursor, env),
                                           self.chunk)
                if op is not None:
                    return self._take(op, cursor.span)
            elif self._next(cursor, env) is not None:
                return self._cursor(cursor, env)
        if not self.lenient:
            raise EvalError(f"program pops {' | '.join(_cursor_text(c) for c in choice.options)} and every "
                            "queue is empty", choice.span)

    def _rounds_at_once(self, unit: ast.Cursor | ast.Group, count: int, env: dict) -> int:
        """`F * n` or `(F B) * n` (plain pops of distinct kinds): place the n rounds at once when every
        queue holds its next n ops untaken, the common case; returns the rounds placed (0: the caller
        pops one at a time, reporting what is missing)."""
        cursors = _plain_cursors(unit) if count > 1 else None
        if not cursors or len({c.kind for c in cursors}) < len(cursors):
            return 0
        if self.mixed and any(c.kind in BACKWARDS for c in cursors):
            return 0
        steps = count * len(cursors) if isinstance(unit, ast.Group) else 0
        queues = [self.queues[(c.kind, self._pipe(c, env), None)] for c in cursors]
        if steps > self.budget.left or any(q is None for q in queues):
            return 0
        runs = [q.peek_run(count, self.taken) for q in queues]
        if not all(runs):
            return 0
        self.budget.left -= steps
        for queue in queues:
            queue.position += count
        last = 1 if self.until & {c.kind for c in cursors} else count  # popping an `until` kind: ends in round 1
        placed = list(chain.from_iterable(islice(zip(*runs), last)))  # round by round
        self.taken.update(map(id, placed))
        self.order += placed
        self.spans += [c.span for c in cursors] * count
        self.slots += range(self.next_slot, self.next_slot + len(placed))
        self.next_slot += len(placed)
        stop = next((n for n, op in enumerate(placed) if op.kind in self.until), None) if self.until else None
        if stop is not None:  # as if popped one at a time: the order ends at that op
            end = len(self.order) - len(placed) + stop + 1
            del self.order[end:], self.spans[end:], self.slots[end:]
            raise _Enough
        return count

    def _pipe(self, cursor: ast.Cursor, env: dict) -> str | None:
        if cursor.pipe is None:
            return None
        value = env.get(cursor.pipe)
        if isinstance(value, PipeRef):
            return value.name
        raise EvalError(f"'{cursor.pipe}' is not a pipeline (pipelines: {', '.join(self.names)})", cursor.span)

    def _chunk(self, cursor: ast.Cursor, env: dict) -> int | None:
        chunk = cursor.chunk
        if type(chunk) is ast.Num and type(chunk.value) is int and -MAX_INT <= chunk.value <= MAX_INT:
            return chunk.value  # `F[1]`: what evaluate_int gives for it, without the call
        return None if chunk is None else evaluate_int(chunk, env, "chunk")

    def _next(self, cursor: ast.Cursor, env: dict) -> Op | None:
        """The op the cursor would pop, without popping it (None: its queue is empty)."""
        pipe, chunk = self._pipe(cursor, env), self._chunk(cursor, env)
        if self.mixed and cursor.kind == _W:
            return self.mixed.peek_weight(self.pipelines, pipe, chunk, self.chunk)
        queue = self.queues[(_queued(cursor.kind, self.mixed), pipe, chunk)]
        return queue.peek(self.taken) if queue else None

    def _cursor(self, cursor: ast.Cursor, env: dict) -> None:
        pipe = None if cursor.pipe is None else self._pipe(cursor, env)
        if cursor.args is not None:
            if cursor.chunk is not None:
                raise EvalError("a named op takes no chunk: F(0, 3), not F[0](0, 3)", cursor.span)
            return self._named(cursor, pipe, env)
        chunk = self._chunk(cursor, env)
        if self.mixed and cursor.kind == _W:
            op = self.mixed.pop_weight(self.pipelines, pipe, chunk, self.chunk)
        else:
            queue = self.queues[(_queued(cursor.kind, self.mixed), pipe, chunk)]
            op = queue.pop(self.taken) if queue else None
        if op is None:
            if self.lenient:
                return
            raise EvalError(f"program pops {_cursor_text(cursor, pipe, chunk)} from an empty queue "
                            f"({self._why_empty(cursor, pipe, chunk)})", cursor.span)
        if self.mixed and cursor.kind in GRADIENT:
            op = self.mixed.choose(op, cursor.kind, self.taken)
        self._take(op, cursor.span)

    def _why_empty(self, cursor: ast.Cursor, pipe: str | None, chunk: int | None) -> str:
        where = (f" of pipeline '{pipe}'" if pipe else "") + (f" of chunk {chunk}" if chunk is not None else "")
        if self.mixed and cursor.kind == _W:
            return f"no input gradient{where} placed so far waits for its W"
        known = self.queues[(_queued(cursor.kind, self.mixed), pipe, chunk)]
        if known:
            return f"all {len(known.ops)} {cursor.kind} ops{where} of this device are already placed"
        if chunk is not None and self.queues[(_queued(cursor.kind, self.mixed), pipe, None)]:
            chunks = sorted({c for (kind, p, c) in self.queues.all() if kind == _queued(cursor.kind, self.mixed)
                             and p == pipe and c is not None})
            return f"this device holds chunks {', '.join(map(str, chunks))}"
        return f"no op of kind '{cursor.kind}'{where} runs on this device"

    def _named(self, cursor: ast.Cursor, pipe: str | None, env: dict) -> None:
        args = [evaluate_int(a, env, "op argument") for a in cursor.args]
        if len(args) not in (1, 2) or (len(args) == 1 and cursor.kind in BUILTIN):  # a task's may be t(s)
            raise EvalError(f"{cursor.kind}(...) takes a stage and a microbatch", cursor.span)
        stage, mb = args[0], (args[1] if len(args) == 2 else None)
        candidates = [Op(cursor.kind, stage, mb, k) for k in range(len(self.pipelines))
                      if pipe is None or self.pipelines[k].name == pipe]
        if self._mine is None:
            self._mine = {op: op for op in self.ops}
        found = [self._mine[c] for c in candidates if c in self._mine]
        label = f"{cursor.kind}({stage}{'' if mb is None else f',{mb}'})"
        if not found:
            raise EvalError(f"{label} is not an op of this device{self._elsewhere(stage, mb, pipe)}", cursor.span)
        if id(found[0]) in self.taken:
            raise EvalError(f"{label} is placed twice", cursor.span)
        if self.mixed and found[0].kind in BACKWARDS:
            self.mixed.name(found[0], self.taken)
        self._take(found[0], cursor.span)

    def _elsewhere(self, stage: int, mb: int | None, pipe: str | None) -> str:
        """Why a named op is none of this device's: its stage or microbatch is outside every pipeline's,
        or it runs on another device ('' when none of these says it)."""
        pipes = [p for p in self.pipelines if pipe is None or p.name == pipe]
        if pipes and all(not 0 <= stage < p.stages for p in pipes):
            return f": stage {stage} is outside 0..{pipes[0].stages - 1}"
        if mb is not None and pipes and all(mb not in p.microbatches for p in pipes):
            return f": microbatch {mb} is not one of pipeline '{pipes[0].name}' ({ranges(list(pipes[0].microbatches))})"
        homes = sorted({p.placement[stage] for p in pipes if 0 <= stage < p.stages and
                        (mb is None or mb in p.microbatches)} - {self.device})
        return f" (it runs on device {homes[0]})" if len(homes) == 1 else ""

    def _take(self, op: Op, span: Span) -> None:
        self.taken.add(id(op))
        self.order.append(op)
        self.spans.append(span)
        self.slots.append(self.next_slot)
        self.next_slot += 1
        if op.kind in self.until:
            raise _Enough

    def placed(self) -> tuple[Op, ...]:
        """The device's order: the ops placed so far, each with the span of the cursor that placed it."""
        set_spans(self.order, self.spans)
        return tuple(self.order)


def _plain_cursors(unit: ast.Unit) -> tuple[ast.Cursor, ...] | None:
    """The pops of `F` or `(F B)`: cursors without arguments or chunks, in a group without conditions,
    repeats or optional pops."""
    if isinstance(unit, ast.Cursor):
        return (unit,) if unit.args is None and unit.chunk is None else None
    if not isinstance(unit, ast.Group):
        return None
    items = unit.body
    if all(isinstance(item, ast.Item) and isinstance(item.unit, ast.Cursor) and item.unit.args is None
           and item.unit.chunk is None and item.when is None and item.repeat is None and not item.optional
           for item in items):
        return tuple(item.unit for item in items)
    return None


def _cursor_text(cursor: ast.Cursor, pipe: str | None = None, chunk: int | None = None) -> str:
    pipe = pipe or cursor.pipe
    return cursor.kind + (f".{pipe}" if pipe else "") + (f"[{chunk}]" if chunk is not None else "")


_ProgramRun.STATEMENTS = {ast.Let: _ProgramRun._let, ast.Loop: _ProgramRun._loop, ast.When: _ProgramRun._when,
                          ast.Item: _ProgramRun._item}
_ProgramRun.ENOUGH = _Enough
_ProgramRun.UNITS = {ast.Cursor: _ProgramRun._cursor, ast.Group: _ProgramRun._group,
                     ast.Overlap: _ProgramRun._overlap, ast.Choice: _ProgramRun._choice}

_F, _B, _I, _W = OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value


def _queued(kind: str, mixed: _MixedBackward | None) -> str:
    """The queue a cursor pops from: with a mixed backward, B and I share B's (the next backward)."""
    return _B if mixed and kind == _I else kind


def run_programs(programs: list[ast.Program], queue_decls: list[ast.QueueDecl], ops: list[Op],
                 pipelines: tuple[Pipeline, ...], devices: int, env: dict[str, Any],
                 source: Source, mixed: bool = False, fused: list | None = None, slots: list | None = None,
                 optional: frozenset = frozenset(), until: frozenset[str] = frozenset(),
                 per_device: list | None = None, queues: type[DeviceQueues] = DeviceQueues
                 ) -> tuple[tuple[tuple[Op, ...], ...], list[Diagnostic]]:
    """Run each device's program; report empty pops and ops left over, naming device, op and line.
    With `mixed` (a mixed backward), the programs choose B or I per backward and the halves not chosen
    are dropped from the orders. Overlapped pairs the programs place are appended to `fused`, each
    device's list of the unit slots of its ops (`F at t`) to `slots`. Ops of the `optional` kinds (O and
    L: a program offloads what it chooses) may be left. `until`: each program stops at its first op of
    these kinds, and the orders are the starts of the full ones (nothing left over is reported).
    `per_device` and `queues`: each device's ops (`ops` unread) and its queues' class, where the caller
    makes them (prefix.py: each op made when a program reads it)."""
    _check_queue_pipes(queue_decls, pipelines, source)
    specific = {p.device: p for p in programs if p.device is not None}
    generic = [p for p in programs if p.device_var is not None]
    diags: list[Diagnostic] = []
    for dev in specific:
        if not 0 <= dev < devices:
            diags.append(error(f"program for device {dev}, but devices are 0..{devices - 1}", specific[dev].span))
    per_device = by_device(ops, devices) if per_device is None else per_device
    chunk = chunk_index(pipelines)
    keys = {(q.kind, q.pipe): QueueKey(q.key, env) for q in queue_decls}
    budget = StepBudget(max(PROGRAM_STATEMENTS.allowed(), STATEMENTS_PER_OP * sum(map(len, per_device))))
    orders = []
    for dev in range(devices):
        program = specific.get(dev) or (generic[-1] if generic else None)
        if program is None:
            diags.append(error(f"no program for device {dev}", programs[0].span))
            orders.append(())
            continue
        run = _ProgramRun(dev, queues(per_device[dev], keys, pipelines, chunk, mixed),
                          per_device[dev], pipelines, budget, _MixedBackward(per_device[dev]) if mixed else None,
                          chunk, until)
        scope = {**env, program.device_var: dev} if program.device_var else dict(env)
        try:
            run.run(program.body, scope)
        except _Enough:
            pass
        except EvalError as exc:
            diags.append(error(f"device {dev}: {exc.message}", exc.span))
            orders.append(run.placed())
            if budget.left < 0:  # shared: the other devices would stop at once for the same reason
                raise SchedError(merge_device_diagnostics(diags), source, kind=REFUSED)
            continue
        if fused is not None:
            fused += run.fused
        if slots is not None:
            slots.append(run.slots)
        left = [] if until else _left_over(run, per_device[dev], mixed, optional)
        if left:
            diags.append(error(f"device {dev}: program leaves {plural(len(left), 'op')} "
                               f"unscheduled: {elide(left, 6)}", program.span))
        orders.append(run.placed())
    return tuple(orders), merge_device_diagnostics(diags)


def _check_queue_pipes(queue_decls: list[ast.QueueDecl], pipelines, source: Source) -> None:
    names = {p.name for p in pipelines}
    for q in queue_decls:
        if q.pipe is not None and q.pipe not in names:
            raise SchedError(error(f"unknown pipeline '{q.pipe}' in queue", q.span), source)


def _left_over(run: _ProgramRun, mine: list[Op], mixed: bool, optional: frozenset) -> list[Op]:
    """The device's ops its program did not place (but the halves of a backward it did not choose, and
    the optional kinds)."""
    if len(run.taken) == len(mine):  # ops are taken once each
        return []
    return [op for op in mine if id(op) not in run.taken and not (mixed and op.kind in SPLIT and _undecided(op, run))
            and op.kind not in optional]


def _undecided(op: Op, run: _ProgramRun) -> bool:
    """An I or W of a backward no program chose yet (its B stands for it among the ops left over)."""
    return id(run.mixed.halves[(_B, op.stage, op.mb, op.pipe)]) not in run.taken


def merge_device_diagnostics(diags: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic for the devices that fail alike at one place: "devices 0, 1: unknown name 'w'"."""
    groups: dict[tuple, list[tuple[int, Diagnostic]]] = {}
    for diag in diags:
        head, sep, rest = diag.message.partition(": ")
        device = head.removeprefix("device ")
        if sep and device.isdigit():
            groups.setdefault((diag.span, rest), []).append((int(device), diag))
        else:
            groups.setdefault((id(diag),), []).append((-1, diag))
    merged = []
    for key, members in groups.items():
        devices, first = [d for d, _ in members], members[0][1]
        if len(members) == 1:
            merged.append(first)
        else:
            names = ", ".join(map(str, devices))
            merged.append(replace(first, message=f"devices {names}: {key[1]}"))
    return merged


# Greedy list scheduling ------------------------------------------------------------------------------


