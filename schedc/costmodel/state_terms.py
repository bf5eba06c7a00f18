"""Each device's training state in bytes, term by term: the weights it keeps whole, the stages ZeRO 3
gathers, the gradients and the optimizer's state. bytes.held_bytes gives their sum (16 bytes a
parameter for a 16-bit model); this splits that sum by what holds it and follows the model's own
width, so an fp32 model (the runtime's) is predicted in the bytes the runtime allocates:

    term             ZeRO 0        1               2                        3
    weights          w P           w P'            w P'                     w P'/k
    gathered         0             0               0                        w P' of its stages (in use)
    gradients        w P           w P'            w P'/k + w P' in use     w P'/k + w P' in use
    optimizer_state  8 P (+4 P)    12 P'/k         12 P'/k                  8 P'/k (+4 P'/k)

with w the model's bytes a value (2 for bf16, 4 for fp32), k the GPUs a stage's state is sharded over
(bytes.shards: d x cp), P' a stage's parameters padded to a multiple of k (the flat buffers' equal
shards), AdamW's two fp32 moments (8 bytes) and an fp32 master weight (4 bytes) wherever the weights
are 16-bit or sharded at level 1 or 2 (the shard the optimizer steps is its own fp32 copy; at level 3
an fp32 model's weight shard is that copy). "In use" is
bytes.in_use_bytes' rule: one stage's gradients whole until they are reduce-scattered, and at level 3
every stage the device holds gathered (one stage per device: that stage). The fp32 gradients of a
16-bit model's optimizer step (bytes.held_bytes' second part) are not state and are not here.
"""
from __future__ import annotations

import math

from ..layout import Layout
from .bytes import (expert_shards, in_use_bytes, layer_params, shards, stage_expert_params, stage_holders,
                    stage_params)
from .hardware import DDP_BUCKET_BYTES_PER_PARAM, stage_layers
from .specs import ModelSpec

TERMS = ("weights", "gathered", "gradients", "optimizer_state")
MASTER_BYTES = 4  # an fp32 copy of a weight the optimizer steps
MOMENT_BYTES = 8  # AdamW's two fp32 moments
FP32 = 4


def padded(params: float, k: int) -> float:
    """`params` rounded up to a multiple of k where it is a whole count (a flat buffer's equal shards).

    >>> padded(7, 2), padded(8, 2), padded(7.5, 2)
    (8, 8, 7.5)
    """
    return math.ceil(params / k) * k if float(params).is_integer() and k > 1 else params


def sharded_terms(params: float, level: int, k: int, width: int) -> dict[str, float]:
    """The state of `params` parameters at ZeRO `level` sharded k ways, before what is in use (a
    level 2 or 3 stage's whole gradients, level 3's gathered weights: in_use).

    >>> sharded_terms(8, 1, 2, 2)
    {'weights': 16, 'gathered': 0.0, 'gradients': 16, 'optimizer_state': 48.0}
    >>> sharded_terms(8, 0, 1, 4)
    {'weights': 32, 'gathered': 0.0, 'gradients': 32, 'optimizer_state': 64}
    """
    if level == 0:
        master = MASTER_BYTES if width < FP32 else 0
        return {"weights": width * params, "gathered": 0.0, "gradients": width * params,
                "optimizer_state": (MOMENT_BYTES + master) * params}
    whole = padded(params, k)
    shard = whole / k
    if level == 3:  # the weights' shard is what is gathered; at fp32 it is the one the optimizer steps
        master = MASTER_BYTES if width < FP32 else 0
        return {"weights": width * shard, "gathered": 0.0, "gradients": width * shard,
                "optimizer_state": (MOMENT_BYTES + master) * shard}
    return {"weights": width * whole, "gathered": 0.0, "gradients": width * (whole if level == 1 else shard),
            "optimizer_state": (MASTER_BYTES + MOMENT_BYTES) * shard}


def in_use(m: ModelSpec, lay: Layout, stages: int, params: list[float]) -> dict[str, float]:
    """What a device's stages (`params`: each one's, padded) hold whole while they compute at level 2
    or 3: bytes.in_use_bytes at the model's width, its gathered weights apart from its gradients."""
    if lay.sharding < 2:
        return {"gathered": 0.0, "gradients": 0.0}
    block = (layer_params(m, lay.tp), stage_layers(m, stages, lay)[0]) if stages == 1 else None
    scale = m.width / 2  # in_use_bytes counts 16-bit values
    gradients = in_use_bytes(2, params, block, lay.reshard_after_forward)
    gathered = in_use_bytes(3, params, block, lay.reshard_after_forward) - gradients if lay.sharding == 3 else 0.0
    return {"gathered": scale * gathered, "gradients": scale * gradients}


def state_terms(m: ModelSpec, lay: Layout, schedule) -> list[dict[str, float]]:
    """Per device, its stages' state by term (TERMS); their sum is bytes.held_bytes' first part for a
    16-bit model (up to the padding of each stage to a multiple of its shards)."""
    holders = stage_holders(schedule)
    per_stage = {}
    for s in sorted(holders):
        params, k = stage_params(m, lay.tp, schedule.stages, s, lay), shards(lay, holders, s)
        experts = stage_expert_params(m, lay, schedule.stages, s)
        dense = sharded_terms(params - experts, lay.sharding, k, m.width)
        routed = sharded_terms(experts, lay.sharding, expert_shards(lay, k), m.width)
        if lay.overlap_grad_reduce and not lay.sharding:  # torch DDP's buckets: a second copy of the gradients
            dense["gradients"] += m.width / 2 * DDP_BUCKET_BYTES_PER_PARAM * params
        per_stage[s] = ({t: dense[t] + routed[t] for t in TERMS}, padded(params, k) if lay.sharding else params)
    out = []
    for d in range(schedule.devices):
        mine = [s for s in sorted(holders) if d in holders[s]]
        terms = {t: sum(per_stage[s][0][t] for s in mine) for t in TERMS}
        used = in_use(m, lay, schedule.stages, [per_stage[s][1] for s in mine])
        out.append({t: terms[t] + used.get(t, 0.0) for t in TERMS})
    return out
