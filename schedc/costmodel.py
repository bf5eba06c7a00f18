"""The cluster-scale cost model: op costs, message times and memory of a GPT training step from a model,
a cluster and a (tensor, pipeline, data) parallel layout (schedc/cluster.py). The simulator stays the one
source of timing: these costs go into the schedule, the schedule's real per-device order is simulated
with each message timed on the link its two stages sit on, and the end-of-step data-parallel
all-reduce and optimizer step are added after the simulated makespan.

Per transformer layer and microbatch, on one GPU of a tensor-parallel group of t (b, s, h, a, f, V as
usual; w bytes per value):

    GEMMs        QKV (bs x 3h/t x h), projection (bs x h x h/t), MLP (bs x f/t x h), (bs x h x f/t):
                 2·bs·(4h² + 2hf)/t FLOPs forward, twice that backward (input and weight gradients)
    attention    scores and context, b·a/t GEMMs of s x s x h/a: 4·b·s²·h/t FLOPs forward
    elementwise  layer norms, bias+dropout+add, bias+GeLU, softmax, attention dropout, transposes:
                 bytes over HBM; replicated over t without sequence parallelism, split with it
    t > 1        two all-reduces forward, two backward (with sequence parallelism two all-gathers and
                 two reduce-scatters each), over NVLink when t fits in a node, else over the network

A GEMM of smallest dimension n runs at peak · gemm · n / (n + gemm_half_dim); memory-bound kernels at
HBM bandwidth · hbm; a collective at the NCCL bus bandwidth of its link (intra or inter fraction of
the datasheet figure), two-level when its group spans nodes. Full recomputation repeats the forward
(with its all-reduces) inside B; selective recomputation repeats the attention core only (Korthikanti
et al. 2022). The first stage adds the embedding, the last the final layer norm, the logit GEMM and
the cross entropy. Model FLOPs follow Narayanan et al. (2021) equation 3: 96·B·s·l·h²·(1 + s/(6h) +
V/(16·l·h)) with full recomputation (72·...·(1 + s/(6h) + V/(12·l·h)) without it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .activations import Sizes, layer_bytes, megatron
from .cluster import ClusterSpec, ModelSpec
from .layout import Layout, rank_at
from .ops import OpKind, cost_range, feeds, in_cost_range
from .timing import bubble

F, B, I, W = OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value  # noqa: E741
R = "recompute"  # the part of B that repeats (some of) the forward first

STATE_BYTES_PER_PARAM = 16   # 16-bit weight and gradient, fp32 master weight, Adam's two fp32 moments
REPLICATED_BYTES_PER_PARAM = 4  # of which the 16-bit weight and gradient stay on every data-parallel GPU
                                # with the distributed optimizer: 4 + 16/d at the step with the fp32
                                # gradients below, against 20 (Megatron-LM's README, "Distributed Optimizer")
DDP_BUCKET_BYTES_PER_PARAM = 2   # torch DDP's buckets: a second copy of the 16-bit gradients (its default,
                                 # gradient_as_bucket_view=False; PyTorch's DistributedDataParallel docs)
STEP_GRADIENT_BYTES_PER_PARAM = 4  # the fp32 gradients the optimizer step makes from the 16-bit ones
                                   # (Megatron-LM's mixed-precision optimizer), when no activation is alive
ADAM_BYTES_PER_PARAM = 32    # HBM traffic of a fused Adam step (read/write master, moments; read grad, write weight)
CROSS_ENTROPY_BYTES = 16     # HBM traffic per fp32 logit of the vocab-parallel cross entropy, forward
ELEMENTWISE = 11             # values read+written per b·s·h by layer norms and bias+dropout+add, forward
TRANSPOSES = 8               # values per b·s·h/t moved by the attention's head transposes, forward
ATTENTION_ELEMENTWISE = 4.5  # values per b·(a/t)·s² moved by softmax and attention dropout, forward
GRAD_ACCUMULATION = 3        # values per weight and microbatch: the new gradient read, the accumulated one read and written


@dataclass(frozen=True, slots=True)
class Part:
    """An op's time, split into computation, tensor-parallel communication and (with blocking
    point-to-point messages) the time its sender waits for its message to be through (seconds)."""

    compute: float = 0.0
    tp: float = 0.0
    p2p: float = 0.0

    def __add__(self, other: Part) -> Part:
        return Part(self.compute + other.compute, self.tp + other.tp, self.p2p + other.p2p)

    def __mul__(self, k: float) -> Part:
        return Part(self.compute * k, self.tp * k, self.p2p * k)

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.p2p


@dataclass(frozen=True)
class StageCosts:
    """Per stage, the parts of F, B, I and W (B = I + W) of one microbatch."""

    parts: dict[str, tuple[Part, ...]]

    def costs(self) -> dict[str, tuple[float, ...]]:
        """kind -> per-stage seconds, as a costs table for elaborate.Options (FB: F and B as one op)."""
        table = {kind: tuple(p.total for p in parts) for kind, parts in self.parts.items()}
        table["FB"] = tuple(f + b for f, b in zip(table[F], table[B]))
        return table


class Hardware:
    """Time of a GEMM, a memory-bound kernel, a collective and a message on one cluster."""

    def __init__(self, cluster: ClusterSpec):
        self.c = cluster

    def gemm(self, m: float, n: float, k: float, count: float = 1) -> float:
        c = self.c
        small = min(m, n, k)
        efficiency = c.gemm_efficiency * small / (small + c.gemm_half_dim)
        return 2 * m * n * k * count / (c.peak_flops * efficiency)

    def memory(self, nbytes: float) -> float:
        return nbytes / (self.c.hbm_bandwidth * self.c.hbm_efficiency)

    def _intra(self) -> float:
        return self.c.intra_bandwidth * self.c.intra_efficiency

    def _inter(self) -> float:
        return self.c.inter_bandwidth * self.c.inter_efficiency

    def all_reduce(self, nbytes: float, n: int, per_node: int) -> float:
        """Ring all-reduce of nbytes over n GPUs, per_node of them in each node: within a node over
        NVLink, across nodes two-level (reduce-scatter in the node, all-reduce of a 1/per_node share
        over each GPU's network link, all-gather in the node)."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        k = max(1, min(per_node, n))
        nodes = -(-n // k)
        time = 2 * (k - 1) / k * nbytes / self._intra() + 2 * (k - 1) * self.c.intra_latency
        if nodes > 1:
            time += 2 * (nodes - 1) / nodes * (nbytes / k) / self._inter() + 2 * (nodes - 1) * self.c.inter_latency
        return time

    def all_gather(self, nbytes: float, n: int, per_node: int) -> float:
        """All-gather (or reduce-scatter) of nbytes in all: half an all-reduce."""
        return self.all_reduce(nbytes, n, per_node) / 2

    def message(self, nbytes: float, same_node: bool) -> float:
        if same_node:
            return self.c.intra_latency + nbytes / self._intra()
        return self.c.inter_latency + nbytes / self._inter()


@dataclass(frozen=True)
class Setting:
    """Everything the formulas read: the model, the cluster, the layout."""

    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout

    @property
    def hw(self) -> Hardware:
        return Hardware(self.cluster)

    @property
    def tp_per_node(self) -> int:
        """The fewest GPUs of a tensor-parallel group in one node (tensor innermost in the rank
        order): t when t divides the node, else gcd(t, node), the groups that straddle two nodes (t = 4
        on 6-GPU nodes: 2 and 2) setting the pace."""
        return math.gcd(self.layout.tp, self.cluster.gpus_per_node)

    @property
    def tp_in_node(self) -> bool:
        """Whether every tensor-parallel group sits in one node (t divides the node's GPUs)."""
        return tp_in_node(self.layout.tp, self.cluster.gpus_per_node)

    def tp_all_reduce(self, nbytes: float) -> float:
        return self.hw.all_reduce(nbytes, self.layout.tp, self.tp_per_node)


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


def stage_layers(model: ModelSpec, stages: int) -> int:
    """Layers per stage; the model's layers must divide evenly (callers check)."""
    return model.layers // stages


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


# Parameters and memory ------------------------------------------------------------------------------

def layer_params(model: ModelSpec, t: int) -> float:
    """Parameters of one layer on one GPU: the split weights over t, biases of the row-parallel GEMMs
    and the layer norms replicated."""
    h, f = model.hidden, model.ffn
    return (4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h


def stage_params(model: ModelSpec, t: int, stages: int, s: int) -> float:
    """Parameters of stage s on one GPU: its layers, the embedding (stage 0: words split over t,
    positions), the final layer norm and the tied word embedding's copy (the last stage)."""
    params = stage_layers(model, stages) * layer_params(model, t)
    words = model.vocab * model.hidden / t
    if s == 0:
        params += words + model.seq * model.hidden
    if s == stages - 1:
        params += 2 * model.hidden + (words if stages > 1 else 0.0)
    return params


def layer_activation_bytes(model: ModelSpec, layout: Layout) -> float:
    """Activation bytes one layer keeps per microbatch until its backward (Korthikanti et al. 2022,
    table 2, at 16 bits): sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34 + 5as/h)/t with
    sequence parallelism too; selective recomputation drops the 5as/h term; full recomputation keeps
    only the layer's input, 2sbh (2sbh/t with sequence parallelism). schedc/activations.py's table
    with Megatron's facts, at f = 4h as Korthikanti's table has it."""
    sizes = Sizes(model.seq, layout.microbatch_size, model.hidden, model.heads, 4 * model.hidden)
    return layer_bytes(sizes, megatron(model.width), layout.tp, layout.sequence_parallel, layout.recompute)


def working_bytes(model: ModelSpec, layout: Layout, last: bool) -> float:
    """Memory a backward needs on top of what is kept: one layer's full activations rebuilt by
    recomputation, and on the last stage the fp32 logits of the cross entropy (4·s·b·V/t)."""
    full = replace(layout, recompute="none")
    extra = layer_activation_bytes(model, full) if layout.recompute != "none" else 0.0
    if last:
        extra += 4 * model.seq * layout.microbatch_size * model.vocab / layout.tp
    return extra


# The step --------------------------------------------------------------------------------------------

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


def tp_in_node(t: int, gpus_per_node: int) -> bool:
    """A tensor-parallel group of t GPUs (consecutive ranks) sits in one node for every group only when
    t divides the node's GPUs; else some groups cross nodes (t = 4 on 6-GPU nodes, t = 16 on 8)."""
    return gpus_per_node % t == 0


def rank_of(device: int, st: Setting) -> int:
    """The first GPU of a pipeline device (schedc.layout's rank order, Megatron's)."""
    return rank_at(device, 0, 0, st.layout.tp, st.layout.dp)


def link_times(st: Setting, devices: int) -> list[list[float]]:
    """links[a][b], what simulate adds to a message from device a to device b: its whole time
    (message_times), or nothing when sends block (the sending op already holds it, stage_costs)."""
    if st.layout.blocking_p2p:
        return [[0.0] * devices for _ in range(devices)]
    return message_times(st, devices)


def message_times(st: Setting, devices: int) -> list[list[float]]:
    """Time of one pipeline message (b·s·h values; each of t GPUs sends 1/t of it with the scatter/gather
    optimisation or sequence parallelism, then an all-gather over NVLink restores the whole with
    scatter/gather) from device a to device b, over NVLink in a node, else the network."""
    m, lay, hw, g = st.model, st.layout, st.hw, st.cluster.gpus_per_node
    size = lay.microbatch_size * m.seq * m.hidden * m.width
    split = lay.tp > 1 and (lay.scatter_gather or lay.sequence_parallel)
    per_gpu = size / lay.tp if split else size
    gather = hw.all_gather(size, lay.tp, st.tp_per_node) if split and not lay.sequence_parallel else 0.0
    node = [rank_of(d, st) // g for d in range(devices)]
    return [[0.0 if a == b else hw.message(per_gpu, node[a] == node[b] and st.tp_in_node) + gather
             for b in range(devices)] for a in range(devices)]


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
        gib = 2 ** 30
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
    the logit layer 3 times."""
    s, h, f = model.seq, model.hidden, model.ffn
    per_layer = 2 * s * (4 * h * h + 2 * h * f) + 4 * s * s * h
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

    def exposed(self, lay: Layout, hidden: float | None) -> float:
        """The communication left after the last op. Overlapped (overlap_grad_reduce), it hides behind
        the last op's `hidden` seconds, but for the weights' all-gather with the distributed optimizer,
        which follows the step; hidden=None: the least it can be, whatever hides it."""
        total = self.exchange + self.embedding
        if not lay.overlap_grad_reduce:
            return total
        kept = self.exchange / 2 if lay.distributed_optimizer else 0.0
        return kept if hidden is None else max(kept, total - hidden)


def step_tails(st: Setting, schedule) -> list[Tail]:
    """Per device, its Tail: the exchange over the d (times replicas) GPUs holding each of its stages,
    the embedding's all-reduce on a device holding one end stage but not the other, and Adam over its
    parameters (with the distributed optimizer its shard of them)."""
    lay, hw, g, m = st.layout, st.hw, st.cluster.gpus_per_node, st.model
    stages = schedule.stages
    holders = stage_holders(schedule)
    per_node = max(1, g // lay.tp) if lay.tp < g else 1
    out = []
    for d in range(schedule.devices):
        mine = sorted({s for s, ds in holders.items() if d in ds})
        stepped = sum(stage_params(m, lay.tp, stages, s) / shards(lay, holders, s) for s in mine)
        exchange = 0.0
        for s in mine:
            group = lay.dp * len(holders[s])
            exchange += hw.all_reduce(m.width * stage_params(m, lay.tp, stages, s), group, min(group, per_node))
        first, last = holders.get(0, []), holders.get(stages - 1, [])
        embedding = hw.all_reduce(m.width * m.vocab * m.hidden / lay.tp, 2, 1) \
            if stages > 1 and (d in first) != (d in last) else 0.0
        out.append(Tail(exchange, embedding, hw.memory(ADAM_BYTES_PER_PARAM * stepped)))
    return out


def tails(st: Setting, schedule, costs: StageCosts) -> list[tuple[float, float]]:
    """Per device, (exposed data-parallel communication, optimizer step) after its last op (Tail), the
    last op's time what an overlapped exchange hides behind."""
    table, out = costs.costs(), []
    for d, tail in enumerate(step_tails(st, schedule)):
        last = schedule.orders[d][-1] if schedule.orders[d] else None
        hidden = table.get(last.kind, (0.0,) * schedule.stages)[last.stage] if last is not None else 0.0
        out.append((tail.exposed(st.layout, hidden), tail.optimizer))
    return out


def stage_holders(schedule) -> dict[int, list[int]]:
    """Per stage, the devices holding it (one per pipeline: two with Chimera's replicas)."""
    holders: dict[int, list[int]] = {}
    for pipe in schedule.pipelines:
        for s, d in enumerate(pipe.placement):
            holders.setdefault(s, []).append(d)
    return holders


def shards(lay: Layout, holders: dict[int, list[int]], s: int) -> int:
    """Over how many GPUs stage s's optimizer state is split: the d (times replicas) holding the
    stage with the distributed optimizer, else 1 (not sharded)."""
    return lay.dp * len(holders[s]) if lay.distributed_optimizer else 1


def predict(st: Setting, schedule, timing, free_timing, costs: StageCosts, batch: int) -> Prediction:
    """The step's prediction from the schedule simulated with messages (timing) and without (free)."""
    lay, m = st.layout, st.model
    tail = tails(st, schedule, costs)
    worst = max(range(schedule.devices), key=lambda d: (sum(tail[d]), -d))
    steps = len(schedule.steps)  # a filled cycle of K steps: per step, the cycle's time over K
    makespan, free = timing.makespan / steps, free_timing.makespan / steps
    iteration = makespan + sum(tail[worst])
    held = Part()
    for step in schedule.steps:
        for op in step[worst]:
            held = held + _part(costs, op)
    held = held * (1 / steps)
    breakdown = {"compute_s": held.compute, "tensor_parallel_comm_s": held.tp,
                 "pipeline_comm_s": held.p2p + makespan - free,
                 "data_parallel_comm_s": tail[worst][0], "optimizer_s": tail[worst][1],
                 "bubble_s": free - held.total}
    gpus = schedule.devices * lay.tp * lay.dp
    flops = model_flops(m, lay, batch) / (iteration * gpus)
    memory, parts = device_memory(st, schedule, timing)
    top = max(range(len(memory)), key=lambda d: (memory[d], -d))
    return Prediction(iteration, flops / 1e12, flops / st.cluster.peak_flops, memory[top], parts[top],
                      breakdown, gpus, schedule.microbatches, batch, tuple(memory),
                      {"critical_device": worst, "largest_memory_device": top,
                       "makespan_without_comm_s": _r(free), "bubble": round(bubble(timing.makespan, timing.busy), 9)})


def _part(costs: StageCosts, op) -> Part:
    """The parts of a built-in op; a task's cost (in seconds, schedc/predict.py) is computation."""
    parts = costs.parts.get(op.kind)
    return parts[op.stage] if parts is not None and 0 <= op.stage < len(parts) else Part(op.cost)


def device_memory(st: Setting, schedule, timing) -> tuple[list[float], list[dict[str, float]]]:
    """Per device, bytes at its peak (device_bytes) under the setting's model, layout and cluster."""
    return device_bytes(st.model, st.layout, schedule, timing.peak_memory, st.cluster)


def device_bytes(m: ModelSpec, lay: Layout, schedule, peaks, cluster: ClusterSpec | None = None
                 ) -> tuple[list[float], list[dict[str, float]]]:
    """Per device, bytes at its peak: weights, gradients and optimizer state of the stages it holds
    (with torch DDP, overlap_grad_reduce, its gradient buckets too; with the distributed optimizer the
    fp32 state and the step's gradients split over shards()), plus the larger of the backward's
    peak (the activations alive at the simulated peak, `peaks` in activation units per device: x layers
    per stage x bytes per layer, and the working memory of one backward) and the optimizer step's (the
    fp32 gradients it makes, after the last backward has freed every activation); then, on a cluster,
    what the allocator's fragmentation and the process outside it take (ClusterSpec.reserved_bytes).
    The one rule for memory in bytes: `simulate --cluster` and `check --model` (no cluster: the
    tensors only) both ask it."""
    stages = schedule.stages
    per_unit = stage_layers(m, stages) * layer_activation_bytes(m, lay)
    holders = stage_holders(schedule)
    # torch DDP's buckets: the distributed optimizer's reduce-scatter works on views of its gradient buffer
    buckets = DDP_BUCKET_BYTES_PER_PARAM if lay.overlap_grad_reduce and not lay.distributed_optimizer else 0
    totals, parts = [], []
    for d in range(schedule.devices):
        mine = sorted({s for s, ds in holders.items() if d in ds})
        state = step = 0.0
        for s in mine:
            params, k = stage_params(m, lay.tp, stages, s), shards(lay, holders, s)
            state += params * (REPLICATED_BYTES_PER_PARAM + buckets
                               + (STATE_BYTES_PER_PARAM - REPLICATED_BYTES_PER_PARAM) / k)
            step += STEP_GRADIENT_BYTES_PER_PARAM * params / k
        peak = peaks[d] if d < len(peaks) else 0.0
        act = peak * per_unit + working_bytes(m, lay, stages - 1 in mine)
        allocated = state + max(act, step)
        total = cluster.reserved_bytes(allocated) if cluster is not None else allocated
        parts.append({"weights_gradients_optimizer": state, "activations": act,
                      "optimizer_step": max(0.0, step - act), "allocator_and_context": total - allocated})
        totals.append(total)
    return totals, parts
