# The reference run (--reference): the unpartitioned model in this one process on the whole global
# batch (all microbatches of all data-parallel replicas), same model, data and seed as the plan's run.
# Its loss and first-step gradients are what every schedule must reproduce.
from __future__ import annotations

import time

import torch

from schedc.plan import Plan

from .train import (
    autocast, global_microbatches, load_loss, make_dataset, make_optimizer, matmul_precision, model_pieces,
    set_learning_rate, tokens_per_step, write_grads, write_loss)
from .readings import log_step
from ..execution.executor import clip_coefficient
from ..execution.executor import attach_flat_grads
from . import precision
from .gpt import Stage
from .gpt2_names import saved_layout
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
    main = precision.MainParams({0: model}) if opts.dtype == precision.MAIN else None
    params = main.parameters() if main else [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, opts)
    dataset = make_dataset(opts)
    count = global_microbatches(plan, opts.dp)
    opts.first_step = 0
    loss_fn = load_loss(opts)
    for step in range(opts.steps):
        begin = time.perf_counter()
        batch = dataset.batch(step, count, opts.model_config.mb_size)
        if main is not None:
            loss = _by_microbatch(model, batch, count, loss_fn, device)
        else:
            with autocast(opts, device):
                loss = loss_fn(model(batch.tokens.to(device)), batch.targets.to(device))
            loss.backward()
        if opts.clip_grad is not None:
            model.flat_grad.mul_(clip_coefficient(model.flat_grad.float().square().sum(), opts.clip_grad))
        if step == 0 and opts.save_grads:
            layout = saved_layout(opts.model_config, opts.model_code)  # a GPT-2's under its own names
            write_grads(opts.save_grads, layout({n: precision.gradient(p).detach().cpu().clone()
                                                 for n, p in model.global_parameters()}))
            write_loss(opts.save_grads, loss.item())
        set_learning_rate(optimizer, opts, step)
        optimizer.step()
        if main is not None:
            main.after_step()
        model.flat_grad.zero_()
        log_step(opts, step, loss.item(), time.perf_counter() - begin, tokens_per_step(plan, opts))
    return 0


def _by_microbatch(model: Stage, batch, count: int, loss_fn, device: torch.device) -> torch.Tensor:
    """--dtype bf16-main: the pipeline's arithmetic in one process: each microbatch's forward and
    backward of its loss times 1/count on the bf16 model, its bf16 gradients added into the fp32 main
    gradients in microbatch order; the step's loss, the sum of the scaled losses."""
    scale, total = 1.0 / count, torch.zeros((), device=device)
    for mb in range(count):
        tokens, targets = batch.microbatch(mb)
        loss = loss_fn(model(tokens.to(device)), targets.to(device))
        total += loss.detach()
        (loss * scale).backward()
        precision.fold(model)
    return total * scale
