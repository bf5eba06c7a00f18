"""The cluster-scale cost model: op costs, message times and memory of a GPT training step from a model,
a cluster and a (tensor, pipeline, data) parallel layout (costmodel/specs.py). The simulator stays the one
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

from .bytes import device_bytes, device_memory, held_bytes, layer_activation_bytes, layer_params, stage_params, working_bytes
from .hardware import Hardware, Part, Setting, link_times, message_times, rank_of, stage_layers, tp_in_node
from .prediction import Prediction, Tail, model_flops, predict, step_tails, tails
from .stages import StageCosts, costs_problem, layer_parts, stage_costs

__all__ = ["Hardware", "Part", "Prediction", "Setting", "StageCosts", "Tail", "layer_parts", "costs_problem", "device_bytes", "device_memory",
           "held_bytes",
           "layer_activation_bytes", "layer_params", "link_times", "message_times", "model_flops", "predict",
           "rank_of", "stage_costs", "stage_layers", "stage_params", "step_tails", "tails", "tp_in_node",
           "working_bytes"]
