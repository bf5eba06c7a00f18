"""ZeRO levels 2 and 3 as the simulator times them: which ops of a device's order gather their stage's
parameters and which reduce-scatter its gradients, and how long each takes on the data-parallel
group. The collectives run on the device's communication lane (simulate.Lane): a gather is prefetched
while the previous op runs and delays its op only by what outlasts that; a reduce-scatter follows the
backward that made the gradients and delays nothing but the lane, so the first gather of a step and
the last reduce-scatter are what stay exposed.

Level 2 reduce-scatters each microbatch's gradients of a stage when its backward has made them (B, or W
of a split backward), as ZeRO-2 does under gradient accumulation (Rajbhandari et al. 2020, section 5.2:
the gradients are reduced as they are produced, each rank keeping its partition), so no whole 16-bit
gradient is kept between microbatches. Level 3 does the same and gathers the parameters of a stage
before an op that computes with them (FSDP2 under torch's pipelining: a forward reshards after itself
when reshard_after_forward is set; a backward does not, so the forward that follows it finds them
gathered; without resharding a stage is gathered once per step):

    1F1B, p = 4, stage 0, m = 6, resharding:  F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
        -> gathers at F0 F1 F2 F3 B0 B1 B2 (a forward after a backward finds the stage gathered; the
           cool-down's backwards too)
    GPipe, m = 6, resharding:  F0 .. F5 B0 .. B5  ->  gathers at F0 .. F5 and B0
    either, without resharding: one gather, at the stage's first op
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Issued
from ..ops import COPY, Opcode, OpKind
from .bytes import stage_holders, stage_params
from .hardware import Setting

_GRADIENTS = (OpKind.B.value, OpKind.W.value)  # the ops that finish a microbatch's weight gradients


def gathering(order, reshard_after_forward: bool) -> list[bool]:
    """Per op of one device's order, whether it gathers its stage's parameters first (level 3): a
    built-in compute op of a stage not gathered at that point; a forward leaves its stage resharded
    when `reshard_after_forward`, a backward leaves it gathered."""
    gathered: set[int] = set()
    out = []
    for op in order:
        computes = not op.is_task and op.kind not in COPY
        out.append(computes and op.stage not in gathered)
        if computes:
            gathered.add(op.stage)
            if reshard_after_forward and op.kind == OpKind.F.value:
                gathered.discard(op.stage)
    return out


def shard_group(st: Setting, replicas: int = 1) -> int:
    """The GPUs a stage's state is sharded over at ZeRO 1 and up: data x context parallel (Megatron-Core's
    data-parallel group with context parallelism, torchtitan's dp_shard x cp), times the stage's
    replicas (Chimera's two pipelines)."""
    return st.layout.dp * st.layout.cp * replicas


def collective_seconds(st: Setting, stages: int, s: int, replicas: int = 1) -> float:
    """One all-gather of stage s's 16-bit parameters (or one reduce-scatter of its gradients: the same
    bytes and time) over its shard group, consecutive ranks t apart (schedc.layout's order)."""
    lay, g = st.layout, st.cluster.gpus_per_node
    group = shard_group(st, replicas)
    per_node = max(1, g // lay.tp) if lay.tp < g else 1
    size = st.model.width * stage_params(st.model, lay.tp, stages, s, lay)
    return st.hw.all_gather(size, group, min(group, per_node))


@dataclass(frozen=True, slots=True)
class Sharded:
    """The collectives of ZeRO level 2 or 3 on a schedule (simulate.Collectives): per stage, the seconds
    of one gather (= one reduce-scatter)."""

    level: int
    reshard_after_forward: bool
    seconds: tuple[float, ...]

    def per_op(self, schedule, ops) -> tuple[list[float], list[float]]:
        """Per op of `ops` (simulate's order: each device's program in turn), its gather ahead and its
        reduce-scatter behind (gathering(); the backward that finishes a weight gradient)."""
        split = schedule.split_backward or schedule.mixed_backward
        finish = _GRADIENTS if split else frozenset({OpKind.B.value})
        gathers = {}
        if self.level == 3:
            for order in schedule.orders:
                for op, gathers_here in zip(order, gathering(order, self.reshard_after_forward)):
                    if gathers_here:
                        gathers[id(op)] = self.seconds[op.stage]
        behind = [self.seconds[op.stage] if op.kind in finish and not op.is_task else 0.0 for op in ops]
        return [gathers.get(id(op), 0.0) for op in ops], behind


def sharded_collectives(st: Setting, schedule) -> Sharded | None:
    """The timed collectives of the layout's ZeRO level on the schedule, or None below level 2 or on a
    shard group of one GPU (nothing to gather or scatter)."""
    lay = st.layout
    if lay.sharding < 2 or lay.dp * lay.cp == 1:
        return None
    holders = stage_holders(schedule)
    seconds = tuple(collective_seconds(st, schedule.stages, s, len(holders.get(s, [0])))
                    for s in range(schedule.stages))
    return Sharded(lay.sharding, lay.reshard_after_forward, seconds)


# the ops that compute with a stage's parameters: each gathers them first under ZeRO 3 with resharding
_COMPUTING = (OpKind.F.value, OpKind.B.value, OpKind.I.value, OpKind.W.value, OpKind.R.value)
# the ops of an attention layer's forward (the K/V all-gather) and of its input gradient (its backward,
# a reduce-scatter of the gathered K/V's gradients) under context parallelism
_CONTEXT = ((OpKind.F.value, Opcode.ALL_GATHER.value), (OpKind.R.value, Opcode.ALL_GATHER.value),
            (OpKind.B.value, Opcode.REDUCE_SCATTER.value), (OpKind.I.value, Opcode.REDUCE_SCATTER.value))


def declared_collectives(st: Setting, schedule) -> tuple[Issued, ...]:
    """What the plan declares of ZeRO and context parallelism (Schedule.collectives), after the op that
    issues them, in this order:

        ZeRO 2 or 3    B (and W with a split backward) REDUCE_SCATTER: the microbatch's gradients, as Sharded times
        ZeRO 3, reshard_after_forward: every op computing with the stage (F, B, I, W, R) ALL_GATHER of its
                       parameters first (declared after it: one order per group is what the check needs)
        cp > 1         F and R ALL_GATHER of keys and values, B and I REDUCE_SCATTER of their gradients

    ZeRO's over the stage's shard group (its replicas with it: shard_group), context parallelism's over
    the op's own lane. One collective stands for an op's layers. ZeRO 3 without resharding gathers a
    stage once a step, at whichever op of it comes first (gathering()): not declared."""
    lay = st.layout
    out: list[Issued] = []
    if lay.sharding == 3 and lay.reshard_after_forward and lay.dp * lay.cp > 1:
        out += [Issued(kind, Opcode.ALL_GATHER.value, replicas=True) for kind in _COMPUTING]
    if lay.sharding >= 2 and lay.dp * lay.cp > 1:
        split = schedule.split_backward or schedule.mixed_backward
        out += [Issued(kind, Opcode.REDUCE_SCATTER.value, replicas=True)
                for kind in (_GRADIENTS if split else (OpKind.B.value,))]
    if lay.cp > 1:
        out += [Issued(kind, collective) for kind, collective in _CONTEXT]
    return tuple(out)
