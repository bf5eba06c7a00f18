"""Sequence chunks (Seq1F1B): `microbatches m chunks k` cuts every microbatch into k chunks of its
sequence. The IR counts units, microbatch i's chunk j being unit i * k + j (ops.unit_of); each unit does
1/k of its microbatch's work and keeps 1/k of its activation.

    pipeline main { stages 2; microbatches 2 chunks 2 }  ->  units 0 1 2 3: F(s,0.0) F(s,0.1) F(s,1.0) ...
"""
from __future__ import annotations

from itertools import chain
from typing import Any

from ..diagnostics import Source
from ..ops import BUILTIN, unit_of
from ..text import plural
from . import ast
from .expr import evaluate_int
from .params import fail_at

MAX_CHUNKS = 4096  # more chunks than any sequence has tokens worth cutting into


def chunk_count(pd: ast.PipelineDecl, env: dict[str, Any], source: Source) -> int:
    """A pipeline's `chunks k` (1 without): an integer 1..MAX_CHUNKS."""
    if pd.chunks is None:
        return 1
    chunks = evaluate_int(pd.chunks, env, "chunk count")
    if not 1 <= chunks <= MAX_CHUNKS:
        raise fail_at(f"pipeline '{pd.name}' cuts each microbatch into {chunks} sequence chunks; "
                      f"give 1..{MAX_CHUNKS}", pd.span, source)
    return chunks


def units(mbs: list[int], chunks: int) -> tuple[int, ...]:
    """The units of these microbatches, microbatch by microbatch, chunk by chunk."""
    return tuple(unit_of(mb, j, chunks) for mb in mbs for j in range(chunks))


def same_chunks(pipelines, source: Source) -> None:
    """Every pipeline cuts its microbatches alike (a stage's activation and costs are per unit)."""
    first = pipelines[0]
    for pipe in pipelines[1:]:
        if pipe.chunks != first.chunks:
            raise fail_at(f"pipeline '{pipe.name}' has {plural(pipe.chunks, 'sequence chunk')} per microbatch but "
                          f"'{first.name}' has {first.chunks}; give every pipeline the same", pipe.span, source)


def per_unit(table: dict[str, tuple[float, ...]], chunks: int) -> dict[str, tuple[float, ...]]:
    """Per-microbatch values of the built-in kinds (costs, activation units) as each chunk's share: 1/k
    (tasks' values are their own)."""
    if chunks == 1:
        return table
    return {kind: tuple(v / chunks for v in values) if kind in BUILTIN else values
            for kind, values in table.items()}


def cost_column(costs, kinds, mbs, stages, chunks: int, by_chunk: dict | None):
    """The ops' costs, stage by stage, microbatch by microbatch, kind by kind; with `by_chunk`, each
    sequence chunk's share of its kind's cost (1 where a kind has none)."""
    if not by_chunk or chunks == 1:
        return chain.from_iterable([costs[kind][s] for kind in kinds] * len(mbs) for s in stages)
    return [costs[kind][s] * (by_chunk[kind][s][mb % chunks] if kind in by_chunk else 1.0)
            for s in stages for mb in mbs for kind in kinds]
