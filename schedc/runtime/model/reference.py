# The reference run (--reference): the unpartitioned model in this one process on the whole global
# batch (all microbatches of all data-parallel replicas), same model, data and seed as the plan's run.
# Its loss and first-step gradients are what every schedule must reproduce.
from __future__ import annotations

import time

import torch

from schedc.plan import Plan

from .train import (
    autocast, global_microbatches, load_loss, make_dataset, make_optimizer, matmul_precision, model_pieces,
    log_step,
    set_learning_rate, tokens_per_step, write_grads, write_loss)
from ..execution.executor import clip_coefficient
from ..execution.executor import attach_flat_grads
from .gpt import Stage
from ..process.world import Env, WorldError


def run_reference(plan: Plan, opts) -> int:
    if Env.read().size > 1:
        raise WorldError("--reference runs in one process: start it with `python -m schedc.runtime "
                         "plan.json --reference`, not under torchrun")
    pieces = model_pieces(opts)
    device = torch.device("cuda" if opts.device != "cpu" and torch.cuda.is_available() else "cpu")
    matmul_precision(opts, device)
    model = Stage(pieces).to(device)
    attach_flat_grads(model)
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], opts)
    dataset = make_dataset(opts)
    count = global_microbatches(plan, opts.dp)
    opts.first_step = 0
    loss_fn = load_loss(opts)
    for step in range(opts.steps):
        begin = time.perf_counter()
        batch = dataset.batch(step, count, opts.model_config.mb_size)
        with autocast(opts, device):
            loss = loss_fn(model(batch.tokens.to(device)), batch.targets.to(device))
        loss.backward()
        if opts.clip_grad is not None:
            model.flat_grad.mul_(clip_coefficient(model.flat_grad.float().square().sum(), opts.clip_grad))
        if step == 0 and opts.save_grads:
            write_grads(opts.save_grads, {n: p.grad.detach().cpu().clone()
                                          for n, p in model.global_parameters()})
            write_loss(opts.save_grads, loss.item())
        set_learning_rate(optimizer, opts, step)
        optimizer.step()
        model.flat_grad.zero_()
        log_step(opts, step, loss.item(), time.perf_counter() - begin, tokens_per_step(plan, opts))
    return 0
