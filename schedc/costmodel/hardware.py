"""The cluster as the cost model sees it: the per-GPU rates (a GEMM's efficiency by size, HBM, the
collectives over NVLink or the network), the setting (model, cluster, layout), the byte and traffic
constants, and the time of a pipeline message on the link its two stages sit on."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .specs import ClusterSpec, ModelSpec
from ..layout import Layout, rank_at
from ..ops import OpKind


F, B, I, W = OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value  # noqa: E741


R = "recompute"  # the part of B that repeats (some of) the forward first


STATE_BYTES_PER_PARAM = 16   # 16-bit weight and gradient, fp32 master weight, Adam's two fp32 moments


REPLICATED_BYTES_PER_PARAM = 4  # of which the 16-bit weight and gradient stay on every data-parallel GPU
                                # with the distributed optimizer: 4 + 16/d at the step with the fp32
                                # gradients below, against 20 (Megatron-LM's README, "Distributed Optimizer")


                                # with the distributed optimizer: 4 + 16/d at the step with the fp32
                                # gradients below, against 20 (Megatron-LM's README, "Distributed Optimizer")
DDP_BUCKET_BYTES_PER_PARAM = 2   # torch DDP's buckets: a second copy of the 16-bit gradients (its default,
                                 # gradient_as_bucket_view=False; PyTorch's DistributedDataParallel docs)


                                 # gradient_as_bucket_view=False; PyTorch's DistributedDataParallel docs)
STEP_GRADIENT_BYTES_PER_PARAM = 4  # the fp32 gradients the optimizer step makes from the 16-bit ones
                                   # (Megatron-LM's mixed-precision optimizer), when no activation is alive


                                   # (Megatron-LM's mixed-precision optimizer), when no activation is alive
ADAM_BYTES_PER_PARAM = 32    # HBM traffic of a fused Adam step (read/write master, moments; read grad, write weight)


CROSS_ENTROPY_BYTES = 16     # HBM traffic per fp32 logit of the vocab-parallel cross entropy, forward


ELEMENTWISE = 11             # values read+written per b·s·h by layer norms and bias+dropout+add, forward


TRANSPOSES = 8               # values per b·s·h/t moved by the attention's head transposes, forward


ATTENTION_ELEMENTWISE = 4.5  # values per b·(a/t)·s² moved by softmax and attention dropout, forward


FP8_CAST_BYTES = 3           # per value cast to FP8 for a GEMM (Transformer Engine): read at 16 bits, written at 8
FP8_AMAX_BYTES = 2           # and with current scaling (--fp8-current-scaling) the 16-bit input read once more
                             # for its amax first: TransformerEngine@d0067d0 pytorch/csrc/quantizer.cpp,
                             # Float8CurrentScalingQuantizer::quantize_impl (nvte_compute_amax, then nvte_quantize_v2)


GRAD_ACCUMULATION = 3        # values per weight and microbatch: the new gradient read, the accumulated one read and written


@dataclass(frozen=True, slots=True)
class Part:
    """An op's time, split into computation, tensor-parallel communication, (with blocking
    point-to-point messages) the time its sender waits for its message to be through, and the part of
    context parallelism's key/value exchange its attention does not hide, and expert parallelism's
    all-to-alls (seconds)."""

    compute: float = 0.0
    tp: float = 0.0
    p2p: float = 0.0
    cp: float = 0.0
    a2a: float = 0.0  # expert parallelism's dispatch and combine all-to-alls (costmodel/experts.py)

    def __add__(self, other: Part) -> Part:
        return Part(self.compute + other.compute, self.tp + other.tp, self.p2p + other.p2p, self.cp + other.cp,
                    self.a2a + other.a2a)

    def __mul__(self, k: float) -> Part:
        return Part(self.compute * k, self.tp * k, self.p2p * k, self.cp * k, self.a2a * k)

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.p2p + self.cp + self.a2a


class Hardware:
    """Time of a GEMM, a memory-bound kernel, a collective and a message on one cluster."""

    def __init__(self, cluster: ClusterSpec):
        self.c = cluster

    def gemm(self, m: float, n: float, k: float, count: float = 1, fp8: bool = False) -> float:
        """A GEMM's time at its size's efficiency; fp8: at the GPU's FP8 peak (--fp8) and its FP8 share
        of it (gemm_fp8, where the cluster gives one)."""
        c = self.c
        small = min(m, n, k)
        large = c.gemm_fp8_efficiency if fp8 and c.gemm_fp8_efficiency else c.gemm_efficiency
        efficiency = large * small / (small + c.gemm_half_dim)
        return 2 * m * n * k * count / ((c.fp8_flops if fp8 else c.peak_flops) * efficiency)

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

    @property
    def tokens(self) -> int:
        """The tokens of a sequence one GPU holds: s / cp (context parallelism's 2·cp chunks, two each)."""
        return self.model.seq // self.layout.cp

    @property
    def cp_in_node(self) -> bool:
        """Whether a context-parallel group (cp ranks t apart) sits in one node: t·cp divides the node."""
        return self.cluster.gpus_per_node % (self.layout.tp * self.layout.cp) == 0


def tp_in_node(t: int, gpus_per_node: int) -> bool:
    """A tensor-parallel group of t GPUs (consecutive ranks) sits in one node for every group only when
    t divides the node's GPUs; else some groups cross nodes (t = 4 on 6-GPU nodes, t = 16 on 8)."""
    return gpus_per_node % t == 0


def rank_of(device: int, st: Setting) -> int:
    """The first GPU of a pipeline device (schedc.layout's rank order, Megatron's)."""
    return rank_at(device, 0, 0, st.layout.tp, st.layout.dp, cp=st.layout.cp)


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
    size = lay.microbatch_size * st.tokens * m.hidden * m.width
    split = lay.tp > 1 and (lay.scatter_gather or lay.sequence_parallel)
    per_gpu = size / lay.tp if split else size
    gather = hw.all_gather(size, lay.tp, st.tp_per_node) if split and not lay.sequence_parallel else 0.0
    node = [rank_of(d, st) // g for d in range(devices)]
    return [[0.0 if a == b else hw.message(per_gpu, node[a] == node[b] and st.tp_in_node) + gather
             for b in range(devices)] for a in range(devices)]


def stage_layers(model: ModelSpec, stages: int, layout: Layout | None = None) -> tuple[int, ...]:
    """Transformer layers of each stage: the layout's split (schedc.layout.split_layers: --stage-layers,
    or the even split, the embedding and the loss counted as layers where the layout says so; without
    them check_stages has refused layers that do not divide evenly)."""
    return (layout or Layout()).layer_split(model.layers, stages)


def stage_mix(model: ModelSpec, stages: int, layout: Layout | None = None) -> tuple[tuple[int, int], ...]:
    """Per stage, (dense layers, MoE layers) of its split (stage_layers): the model's first first_k_dense
    layers are dense, the rest routed (all dense without experts); the last stage's multi-token-prediction
    blocks count as MoE layers (DeepSeek-V3: one more MoE block after the last layer).

    >>> from schedc.descriptions import ModelFacts
    >>> stage_mix(ModelFacts(8, 64, 4, 16, 256, 256, experts=4, top_k=2, moe_ffn=64, first_k_dense=3, mtp=1), 2)
    ((3, 1), (0, 5))
    """
    dense = model.first_k_dense if model.moe else model.layers
    out, start = [], 0
    for s, n in enumerate(stage_layers(model, stages, layout)):
        mine = max(0, min(start + n, dense) - start)
        out.append((mine, n - mine + (model.mtp if s == stages - 1 and model.moe else 0)))
        start += n
    return tuple(out)
