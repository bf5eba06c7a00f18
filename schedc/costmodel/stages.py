"""Per-stage op costs in seconds: a transformer layer's forward, backward (input and weight gradients) and
recomputation by part (compute, tensor-parallel communication), the embedding on the first stage, the
logits and loss on the last."""
from __future__ import annotations

from dataclasses import dataclass

from ..layout import Layout
from ..ops import cost_range, feeds, in_cost_range
from .bytes import layer_params
from .hardware import stage_layers, ATTENTION_ELEMENTWISE, B, CROSS_ENTROPY_BYTES, ELEMENTWISE, F, GRAD_ACCUMULATION, I, R, TRANSPOSES, W, message_times, Part, Setting


@dataclass(frozen=True)
class StageCosts:
    """Per stage, the parts of F, B, I and W (B = I + W) of one microbatch."""

    parts: dict[str, tuple[Part, ...]]

    def costs(self) -> dict[str, tuple[float, ...]]:
        """kind -> per-stage seconds, as a costs table for elaborate.Options (FB: F and B as one op)."""
        table = {kind: tuple(p.total for p in parts) for kind, parts in self.parts.items()}
        table["FB"] = tuple(f + b for f, b in zip(table[F], table[B]))
        return table


def layer_parts(st: Setting) -> dict[str, Part]:
    """One transformer layer, one microbatch: forward F, input-gradient I, weight-gradient W, and the
    recomputation R that B repeats before its backward (nothing without recomputation)."""
    m, lay, hw = st.model, st.layout, st.hw
    b, s, h, a, f, t, w = lay.microbatch_size, m.seq, m.hidden, m.heads, m.ffn, lay.tp, m.width
    bs = b * s
    gemms = hw.gemm(bs, 3 * h / t, h) + hw.gemm(bs, h, h / t) + hw.gemm(bs, f / t, h) + hw.gemm(bs, h, f / t)
    attention = 2 * hw.gemm(s, s, h / a, count=b * a / t)
    replicated = bs * h / (t if lay.sequence_parallel else 1)
    elementwise = hw.memory(w * (ELEMENTWISE * replicated + 2 * bs * f / t + TRANSPOSES * bs * h / t))
    attention_elementwise = hw.memory(w * ATTENTION_ELEMENTWISE * b * (a / t) * s * s)
    comm = 2 * st.tp_all_reduce(w * bs * h) if t > 1 else 0.0  # 2 AG + 2 RS cost the same with SP
    accumulate = hw.memory(GRAD_ACCUMULATION * w * layer_params(m, t))
    forward = Part(gemms + attention + elementwise + attention_elementwise, comm)
    recompute = {"full": forward, "selective": Part(attention + attention_elementwise, 0.0),
                 "none": Part()}[lay.recompute]
    return {F: forward,
            I: Part(gemms + 2 * attention + 2 * (elementwise + attention_elementwise), comm),
            W: Part(gemms + accumulate, 0.0),
            R: recompute}


def embedding_parts(st: Setting) -> dict[str, Part]:
    """The first stage's extra: the (vocab-parallel) embedding lookup and its gradient."""
    m, lay = st.model, st.layout
    tokens = lay.microbatch_size * m.seq * m.hidden * m.width
    comm = st.tp_all_reduce(tokens) if lay.tp > 1 else 0.0
    return {F: Part(st.hw.memory(3 * tokens), comm), I: Part(), W: Part(st.hw.memory(3 * tokens)),
            R: Part()}


def head_parts(st: Setting) -> dict[str, Part]:
    """The last stage's extra: final layer norm, logit GEMM (bs x V/t x h) and cross entropy."""
    m, lay, hw = st.model, st.layout, st.hw
    bs, t, w = lay.microbatch_size * m.seq, lay.tp, m.width
    logits = hw.gemm(bs, m.vocab / t, m.hidden)
    norm = hw.memory(4 * w * bs * m.hidden / (t if lay.sequence_parallel else 1))
    entropy = hw.memory(CROSS_ENTROPY_BYTES * bs * m.vocab / t)
    small = 3 * st.tp_all_reduce(4 * bs) if t > 1 else 0.0
    grad_in = st.tp_all_reduce(w * bs * m.hidden) if t > 1 else 0.0
    return {F: Part(norm + logits + entropy, small),
            I: Part(logits + 2 * norm + entropy / 2, grad_in), W: Part(logits), R: Part()}


def stage_costs(st: Setting, stages: int, placement: tuple[int, ...] | None = None,
                times: list[list[float]] | None = None) -> StageCosts:
    """F, B, I, W of every stage: its layers, the embedding on stage 0, the logits on the last; with
    blocking point-to-point messages (layout.blocking_p2p) and the stages' devices, an op whose output
    goes to another device also holds its device until the message is through (link_times). times:
    message_times(st, devices) when the caller has them already (schedc tune)."""
    per = stage_layers(st.model, stages)
    layer, embed, head = layer_parts(st), embedding_parts(st), head_parts(st)
    table: dict[str, list[Part]] = {k: [] for k in (F, B, I, W)}
    for s in range(stages):
        parts = {k: layer[k] * per for k in layer}
        for extra in ([embed] if s == 0 else []) + ([head] if s == stages - 1 else []):
            parts = {k: parts[k] + extra[k] for k in parts}
        table[F].append(parts[F])
        table[I].append(parts[I] + parts[R])
        table[W].append(parts[W])
        table[B].append(parts[I] + parts[R] + parts[W])
    if st.layout.blocking_p2p and placement is not None:
        _add_sends(table, placement, times if times is not None else message_times(st, max(placement) + 1))
    return StageCosts({k: tuple(v) for k, v in table.items()})


def _add_sends(table: dict[str, list[Part]], placement: tuple[int, ...], times: list[list[float]]) -> None:
    """Add the blocking send of every op whose output feeds a stage on another device (schedc.ops)."""
    for kind in (F, B, I):
        for s, part in enumerate(table[kind]):
            to = feeds(kind, s)
            if to is not None and 0 <= to < len(placement) and placement[to] != placement[s]:
                table[kind][s] = part + Part(p2p=times[placement[s]][placement[to]])


def costs_problem(table: dict[str, tuple[float, ...]], layout: Layout) -> str | None:
    """Why the derived op times (StageCosts.costs()) cannot be a schedule's costs (in_cost_range: finite,
    at most what a schedule's sums keep finite), or None; past the range it is the layout's sizes (or
    the cluster's figures) that made them so, not a measured cost."""
    for kind, row in table.items():  # F first
        bad = next((v for v in row if not in_cost_range(v)), None)
        if bad is not None:
            return (f"--microbatch-size {layout.microbatch_size:,} with this model: one {kind} would take "
                    f"{bad:.3g} s, where a cost must be {cost_range()}")
    return None
