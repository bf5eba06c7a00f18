"""The greedy list scheduler of `order greedy`: when a device is idle it starts the ready op with the smallest key,
a forward only while fewer than `inflight` activations are alive. It builds an order while it times it, so
it keeps its own clock (simulate times a finished order)."""
from __future__ import annotations

import heapq
from itertools import repeat
from typing import Any, Callable

from ..diagnostics import Diagnostic, Source, Span, error
from ..ir import Op, Pipeline, set_spans
from ..walk import unit_change
from . import ast
from .expr import PipeRef, compile_expr
from .queues import KIND_RANK, bind_names, chunk_index, key_functions


def order_greedy(decl: ast.Greedy | None, ops: list[Op], deps: dict[Op, tuple[Op, ...]],
                 pipelines: tuple[Pipeline, ...], devices: int, env: dict[str, Any],
                 source: Source, latency: float = 0.0) -> tuple[tuple[tuple[Op, ...], ...], list[Diagnostic]]:
    """When a device is idle it starts the ready op with the smallest key (default: backward first, then
    microbatch, then stage), starting a forward only while fewer than `inflight` activations are alive."""
    span = decl.span if decl else None
    chunk = chunk_index(pipelines)
    key_fn = _greedy_key(decl, pipelines, chunk, env)
    limit_fn = compile_expr(decl.inflight) if decl and decl.inflight is not None else None
    limits = [limit_fn({**env, "d": d}) if limit_fn else float("inf") for d in range(devices)]
    index = {op: n for n, op in enumerate(ops)}
    succ: list[list[int]] = [[] for _ in ops]
    missing = [0] * len(ops)
    for n, op in enumerate(ops):
        for dep in deps.get(op, ()):
            if dep in index:
                succ[index[dep]].append(n)
                missing[n] += 1
    keys = [key_fn(op) for op in ops]
    ready_at = [0.0] * len(ops)
    waiting: list[list] = [[] for _ in range(devices)]   # (ready time, key, n)
    ready: list[list] = [[] for _ in range(devices)]     # (key, n)
    for n, op in enumerate(ops):
        if missing[n] == 0:
            heapq.heappush(waiting[op.device], (0.0, keys[n], n))
    free_at, alive = [0.0] * devices, [0.0] * devices
    running: list = []  # (end, n)
    orders: list[list[Op]] = [[] for _ in range(devices)]  # placed with the span of `greedy` on return
    done, now = 0, 0.0
    while done < len(ops):
        for d in range(devices):
            if free_at[d] > now:
                continue
            while waiting[d] and waiting[d][0][0] <= now:
                _, key, n = heapq.heappop(waiting[d])
                heapq.heappush(ready[d], (key, n))
            n = _pick(ready[d], ops, alive[d], limits[d])
            if n is None:
                continue
            op = ops[n]
            alive[d] += max(unit_change(op.kind), 0)  # a forward allocates as it starts
            free_at[d] = now + op.cost
            heapq.heappush(running, (free_at[d], n))
            orders[d].append(op)
        upcoming = [w[0][0] for d, w in enumerate(waiting) if w and w[0][0] > now]
        upcoming += [free_at[d] for d in range(devices) if free_at[d] > now]
        if not running and not upcoming:
            stuck = [ops[n] for d in range(devices) for _, n in ready[d]]
            return _greedy_orders(orders, span), [error(
                "greedy ordering cannot progress: the in-flight limit blocks every ready forward"
                + (f" (e.g. {stuck[0]} on device {stuck[0].device})" if stuck else ""), span)]
        now = min(upcoming + ([running[0][0]] if running else []))
        while running and running[0][0] <= now:
            end, n = heapq.heappop(running)
            done += 1
            _finish(ops, n, end, succ, missing, ready_at, keys, waiting, alive, latency)
    return _greedy_orders(orders, span), []


def _greedy_orders(orders: list[list[Op]], span: Span | None) -> tuple[tuple[Op, ...], ...]:
    for order in orders:
        set_spans(order, repeat(span))
    return tuple(map(tuple, orders))


def _finish(ops, n, end, succ, missing, ready_at, keys, waiting, alive, latency) -> None:
    op = ops[n]
    alive[op.device] += min(unit_change(op.kind), 0)  # a release frees its forward's as it ends
    for m in succ[n]:
        missing[m] -= 1
        ready_at[m] = max(ready_at[m], end + (latency if ops[m].device != op.device else 0.0))
        if missing[m] == 0:
            heapq.heappush(waiting[ops[m].device], (ready_at[m], keys[m], m))


def _pick(ready: list, ops: list[Op], alive: float, limit: float) -> int | None:
    held, chosen = [], None
    while ready:
        item = heapq.heappop(ready)
        if unit_change(ops[item[1]].kind) > 0 and alive >= limit:
            held.append(item)
            continue
        chosen = item[1]
        break
    for item in held:
        heapq.heappush(ready, item)
    return chosen


def _greedy_key(decl: ast.Greedy | None, pipelines, chunk, env) -> Callable[[Op], tuple]:
    if decl is None or decl.key is None:
        return lambda op: (-KIND_RANK.get(op.kind, 0), op.mb if op.mb is not None else -1, op.stage, op.pipe,
                           op.part)
    fns = key_functions(decl.key, env)
    refs = [PipeRef(p.name) for p in pipelines]
    scope = dict(env)

    def key(op: Op) -> tuple:
        bind_names(scope, op, refs[op.pipe], chunk, pipelines[op.pipe].chunks)
        return (*(fn(scope) for fn in fns), op.pipe, op.stage, op.mb or 0, op.part)
    return key
