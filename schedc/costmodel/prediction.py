"""The step's prediction: the simulated makespan plus the end-of-step tails (the data-parallel exchange and
the optimizer step), model FLOPs (Narayanan et al. 2021, eq. 3), the breakdown and memory per GPU."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..descriptions import parameters
from ..descriptions.facts import window_share
from .specs import ModelSpec
from ..layout import Layout
from ..passes.timing import bubble
from ..ir import OP_KEY
from ..passes.memory import timed_model
from ..ops import COPY, OVERLAP, OpKind
from ..passes.simulate import pair_cost
from .experts import moe_model_flops
from .bytes import activation_peak_parts, device_memory, shards, stage_expert_params, stage_holders, stage_params
from .bytes import expert_shards
from .hardware import ADAM_BYTES_PER_PARAM, Part, Setting
from .stages import StageCosts, overlapped_pair
from ..text import GIB
from .state_terms import state_terms


@dataclass(frozen=True)
class Prediction:
    """What `schedc simulate --cluster` reports (seconds, bytes)."""

    iteration_s: float
    tflops_per_gpu: float
    peak_fraction: float
    memory_bytes: float
    memory_parts: dict[str, float]
    breakdown: dict[str, float]
    gpus: int
    microbatches: int
    global_batch: int
    device_memory: tuple[float, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        gib = GIB
        return {"iteration_s": _r(self.iteration_s), "tflops_per_gpu": _r(self.tflops_per_gpu),
                "peak_fraction": _r(self.peak_fraction), "memory_gib_per_gpu": _r(self.memory_bytes / gib),
                "memory_breakdown": {k + "_gib": _r(v / gib) for k, v in self.memory_parts.items()},
                "breakdown": {k: _r(v) for k, v in self.breakdown.items()}, "gpus": self.gpus,
                "microbatches": self.microbatches, "global_batch": self.global_batch,
                "memory_gib_per_device": [_r(v / gib) for v in self.device_memory], **self.extra}


def _r(x: float) -> float:
    return round(x, 6)


def model_flops(model: ModelSpec, layout: Layout, batch: int) -> float:
    """Model FLOPs of one step (Narayanan et al. 2021, eq. 3, for any ffn): every layer's forward 4
    times with full recomputation (forward, recomputation, two for the backward), 3 times otherwise;
    the logit layer 3 times. A layer's forward: its linear GEMMs (Q and the projection h x h, K and V
    h x kv_hidden, the MLP's two or, SwiGLU, three h x f) and the attention products (4s^2h; with a
    sliding window w < s, 4s^2h times its share of causal attention's pairs, facts.window_share).

        GPT: 2s(4h^2 + 2hf) + 4s^2h;  Llama 3.1 8B (h 4096, kv 1024, f 14336): 2s(2h^2 + 2h kv + 3hf) + 4s^2h
    """
    if model.moe:
        return moe_model_flops(model, layout, batch)
    s, h, f = model.seq, model.hidden, model.ffn
    linear = 2 * h * h + 2 * h * model.kv_hidden + (3 if model.mlp == "swiglu" else 2) * h * f
    per_layer = 2 * s * linear + 4 * s * s * h * window_share(s, model.window)  # a sliding window's pairs
    passes = 4 if layout.recompute == "full" else 3
    return batch * (passes * model.layers * per_layer + 3 * 2 * s * h * model.vocab)


@dataclass(frozen=True, slots=True)
class Tail:
    """A device's end of step, after its last op (seconds): the data-parallel gradient exchange of its
    stages (an all-reduce; with the distributed optimizer a reduce-scatter and an all-gather, the same
    time), the tied embedding's all-reduce between the end stages, and the optimizer step."""

    exchange: float
    embedding: float
    optimizer: float

    def exposed(self, lay: Layout, hidden: float | None, forward: float = 0.0) -> float:
        """The communication left after the last op. Overlapped (overlap_grad_reduce), it hides behind
        the last op's `hidden` seconds, but for the weights' all-gather with the distributed optimizer,
        which follows the step, unless overlap_param_gather runs it under the next step's first
        forward (`forward` seconds: what is left of it is charged); hidden=None: the least it can be,
        whatever hides it."""
        total = self.exchange + self.embedding
        kept = self.exchange / 2 if lay.sharding else 0.0
        if lay.overlap_param_gather:  # the gather under the next forward: what outlasts it stays
            left = max(0.0, kept - forward) if hidden is not None else 0.0
            total, kept = total - kept + left, left
        if not lay.overlap_grad_reduce or lay.sharding >= 2:
            return total
        return kept if hidden is None else max(kept, total - hidden)


def step_tails(st: Setting, schedule) -> list[Tail]:
    """Per device, its Tail: the exchange over the d x cp (times replicas) GPUs holding each of its stages
    (from ZeRO level 2 only the weights' all-gather after the step, and at level 3 nothing: their
    reduce-scatters and gathers are timed in the schedule),
    the embedding's all-reduce on a device holding one end stage but not the other, and Adam over its
    parameters (with the distributed optimizer its shard of them)."""
    lay, hw, g, m = st.layout, st.hw, st.cluster.gpus_per_node, st.model
    stages = schedule.stages
    holders = stage_holders(schedule)
    per_node = max(1, g // lay.tp) if lay.tp < g else 1
    out = []
    for d in range(schedule.devices):
        mine = sorted({s for s, ds in holders.items() if d in ds})
        stepped = sum(_stepped(m, lay, stages, s, shards(lay, holders, s)) for s in mine)
        exchange = 0.0
        for s in mine:
            group = lay.dp * lay.cp * len(holders[s])
            exchange += hw.all_reduce(m.width * stage_params(m, lay.tp, stages, s, lay), group, min(group, per_node))
        if lay.sharding >= 2:  # the reduce-scatters are the simulator's (sharding.py); level 2 gathers the
            exchange = 0.0 if lay.sharding == 3 else exchange / 2  # new weights after the step, level 3 not
        first, last = holders.get(0, []), holders.get(stages - 1, [])
        embedding = hw.all_reduce(m.width * m.vocab * m.hidden / lay.tp, 2, 1) \
            if stages > 1 and m.tied_embeddings and (d in first) != (d in last) else 0.0
        out.append(Tail(exchange, embedding, hw.memory(ADAM_BYTES_PER_PARAM * stepped)))
    return out


def _stepped(m: ModelSpec, lay: Layout, stages: int, s: int, k: int) -> float:
    """The parameters of stage s one GPU's optimizer steps: its shard of 1/k (k: shards()), the routed
    experts' of 1/(k / ep) (their state is sharded over the expert-data-parallel ranks)."""
    experts = stage_expert_params(m, lay, stages, s)
    return (stage_params(m, lay.tp, stages, s, lay) - experts) / k + experts / expert_shards(lay, k)


def tails(st: Setting, schedule, costs: StageCosts) -> list[tuple[float, float]]:
    """Per device, (exposed data-parallel communication, optimizer step) after its last op (Tail), the
    last op's time what an overlapped exchange hides behind."""
    table, out = costs.costs(), []
    for d, tail in enumerate(step_tails(st, schedule)):
        last = schedule.orders[d][-1] if schedule.orders[d] else None
        hidden = table.get(last.kind, (0.0,) * schedule.stages)[last.stage] if last is not None else 0.0
        first = schedule.orders[d][0] if schedule.orders[d] else None
        forward = table.get(first.kind, (0.0,) * schedule.stages)[first.stage] if first is not None else 0.0
        out.append((tail.exposed(st.layout, hidden, forward), tail.optimizer))
    return out


def predict(st: Setting, schedule, timing, free_makespan: float, costs: StageCosts, batch: int,
            gathers: float = 0.0) -> Prediction:
    """The step's prediction from the schedule simulated with messages (timing: a Timing or a
    timing.Span) and the makespan without them (free_makespan); `gathers`: of that makespan, what ZeRO's
    collectives on the lanes add to it (sharding.py), data-parallel communication, not bubble."""
    lay, m = st.layout, st.model
    tail = tails(st, schedule, costs)
    worst = max(range(schedule.devices), key=lambda d: (sum(tail[d]), -d))
    steps = len(schedule.steps)  # a filled cycle of K steps: per step, the cycle's time over K
    makespan, free = timing.makespan / steps, free_makespan / steps
    iteration = makespan + sum(tail[worst])
    held, hidden = _held(costs, schedule, worst)
    held, hidden = held * (1 / steps), hidden / steps
    # the messages' exposure: what they add to the makespan (none where a filled cycle's tasks packed
    # otherwise with them), the rest of the makespan beyond the device's work its bubble
    pipeline = max(0.0, held.p2p + makespan - free)
    breakdown = {"compute_s": held.compute, "tensor_parallel_comm_s": held.tp, "pipeline_comm_s": pipeline,
                 "data_parallel_comm_s": tail[worst][0] + gathers / steps, "optimizer_s": tail[worst][1],
                 "bubble_s": makespan - held.compute - held.tp - pipeline - held.cp - gathers / steps}
    if held.cp:
        breakdown["context_parallel_comm_s"] = held.cp
    if held.a2a:  # what the all-to-alls leave exposed on the critical device (hidden ones are in overlap_hidden_s)
        breakdown["expert_parallel_comm_s"] = held.a2a
        breakdown["bubble_s"] -= held.a2a
    gpus = schedule.devices * lay.tp * lay.dp * lay.cp
    flops = model_flops(m, lay, batch) / (iteration * gpus)
    memory, parts = device_memory(st, schedule, timing.peak_memory)
    top = max(range(len(memory)), key=lambda d: (memory[d], -d))
    return Prediction(iteration, flops / 1e12, flops / st.cluster.peak_flops, memory[top], parts[top],
                      breakdown, gpus, schedule.microbatches, batch, tuple(memory),
                      {**utilization(m, lay, batch, iteration, gpus, st.cluster.peak_flops), "critical_device": worst, "largest_memory_device": top, "overlap_hidden_s": _r(hidden),
                       "deferred_w_gib": _r(deferred_w_bytes(st, schedule, top) / GIB),
                       "state_breakdown": {k + "_gib": _r(v / GIB) for k, v in state_terms(m, lay, schedule)[top].items()},
                       "makespan_without_comm_s": _r(free), "bubble": round(bubble(timing.makespan, timing.busy), 9),
                       **op_seconds(costs, m), **a2a_split(costs, schedule, worst, held.a2a, m)})


def op_seconds(costs: StageCosts, model: ModelSpec) -> dict[str, Any]:
    """An MoE model's op times per stage (`op_seconds`: F, B, I, W and FB, the overlapped pair) and its
    all-to-all seconds per op kind (`a2a_seconds`: in F, B, I and, exposed, in FB), so a schedule's bubble
    can be checked against its formula on the cost model's own op times (DeepSeek-V3's Table 2);
    nothing for a dense model, whose output stays as it was."""
    if not model.moe:
        return {}
    table = costs.costs()
    pairs = [overlapped_pair(f, b) for f, b in zip(costs.parts[OpKind.F.value], costs.parts[OpKind.B.value])]
    a2a = {kind: [_r(p.a2a) for p in parts] for kind, parts in costs.parts.items()}
    return {"op_seconds": {kind: [_r(v) for v in row] for kind, row in table.items()},
            "a2a_seconds": {**a2a, OVERLAP: [_r(p.a2a) for p in pairs]}}


def utilization(model: ModelSpec, layout: Layout, batch: int, iteration: float, gpus: int,
                peak: float) -> dict[str, Any]:
    """The model's parameters and its model-FLOPs utilization: the step's model FLOPs without
    recomputation (a recomputed forward is not the model's work) over time x GPUs x the 16-bit peak
    (an FP8 run's MFU is against the same peak), beside the hardware rate the prediction reports."""
    useful = model_flops(model, replace(layout, recompute="none"), batch) / (iteration * gpus)
    return {"parameters": parameters(model), "model_tflops_per_gpu": _r(useful / 1e12), "mfu": _r(useful / peak)}


def deferred_w_bytes(st: Setting, schedule, device: int) -> float:
    """Of a device's activations at its peak, the bytes deferred weight gradients hold (from their I to
    their W); 0 without a split backward, or under the timed memory model (which counts units)."""
    if not (schedule.split_backward or schedule.mixed_backward) or timed_model(schedule):
        return 0.0
    return activation_peak_parts(st.model, st.layout, schedule)[device][1]


def _held(costs: StageCosts, schedule, device: int) -> tuple[Part, float]:
    """A device's ops over the steps, by part, and the seconds its overlapped pairs hide. A pair counts
    its time (simulate.pair_cost), not its halves apart: both halves' computation, and of their
    communication what the overlap leaves exposed (the hidden seconds come off the blocking sends),
    so compute + communication + bubble is the device's step as simulated."""
    first = {OP_KEY(f): (f if f.kind == OpKind.F else b).stage for f, b in schedule.fused}
    table, held, hidden, pending = costs.costs(), Part(), 0.0, None
    for step in schedule.steps:
        for op in step[device]:
            if op.kind in COPY:  # the copy engine's, beside the device's compute: only waits for it show (bubble)
                continue
            part = _part(costs, op, schedule.chunks > 1)
            if pending is not None:  # the second half: the pair is complete
                pair, stage = pending[0] + part, pending[1]
                saved = pair.total - pair_cost(table, pair.total, stage)
                held, hidden, pending = held + _hide(pair, saved), hidden + saved, None
            elif OP_KEY(op) in first:
                pending = (part, first[OP_KEY(op)])
            else:
                held = held + part
    return held, hidden


def _hide(pair: Part, saved: float) -> Part:
    """A pair's parts less `saved` seconds of its communication hidden behind computation
    (point-to-point, then context parallelism's ring: what overlapped_pair hides; past them,
    computation: halves on stages of different sizes)."""
    p2p = min(pair.p2p, saved)
    cp = min(pair.cp, saved - p2p)
    if pair.a2a:
        a2a = min(pair.a2a, saved - p2p - cp)
        return Part(pair.compute - (saved - p2p - cp - a2a), pair.tp, pair.p2p - p2p, pair.cp - cp, pair.a2a - a2a)
    return Part(pair.compute - (saved - p2p - cp), pair.tp, pair.p2p - p2p, pair.cp - cp)


def _part(costs: StageCosts, op, chunked: bool = False) -> Part:
    """The parts of a built-in op (of a sequence chunk's, its share of the microbatch's: the parts
    scaled to the op's cost alike); a task's cost (in seconds, schedc/costmodel/fit.py) is computation."""
    parts = costs.parts.get(op.kind)
    if parts is None or not 0 <= op.stage < len(parts):
        return Part(op.cost)
    part = parts[op.stage]
    return part * (op.cost / part.total) if chunked and part.total > 0 else part


def a2a_split(costs: StageCosts, schedule, device: int, exposed: float, model: ModelSpec) -> dict[str, float]:
    """An MoE model's all-to-all seconds in a step on the critical device: exposed (the breakdown's
    expert_parallel_comm_s) and hidden under the other half of overlapped pairs (what its ops carry,
    less the exposed); nothing for a dense model, whose output stays as it was."""
    if not model.moe:
        return {}
    chunked = schedule.chunks > 1
    carried = sum(_part(costs, op, chunked).a2a for step in schedule.steps for op in step[device] if op.kind not in COPY)
    carried /= len(schedule.steps)
    return {"a2a_exposed_s": _r(exposed), "a2a_hidden_s": _r(max(0.0, carried - exposed))}
