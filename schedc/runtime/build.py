# What a run builds from its options, shared by the pipelined run and the reference: the model's
# pieces and their partition, the optimizer, the dataset, and the gradient/loss dumps.
from __future__ import annotations

import json
import math
from contextlib import nullcontext
from pathlib import Path

import torch

from schedc.plan import Plan

from .data import Dataset, load_dataset
from .model import ModelError, build_pieces, lm_loss, load_builder, partition
from .plugins import load_function


def model_pieces(opts) -> list:
    """All pieces of the model, built from --seed."""
    return build_pieces(load_builder(opts.model_code), opts.model_config, opts.seed)


def model_runs(opts, stages: int) -> tuple[list, list[list]]:
    """All pieces of the model, their weights not yet made (init.py: a rank materializes its own), and
    their partition into `stages` runs (--stage-layers, --account-for-embedding, --account-for-loss)."""
    pieces = build_pieces(load_builder(opts.model_code), opts.model_config, opts.seed, materialize=False)
    return pieces, partition(pieces, stages, opts.stage_layers, opts.account_for_embedding, opts.account_for_loss)


def make_optimizer(params: list, opts) -> torch.optim.Optimizer:
    """The fused implementation where this torch has one for the device (one kernel for all params),
    else the default; the reference run builds its optimizer the same way."""
    kind = torch.optim.SGD if opts.optimizer == "sgd" else torch.optim.AdamW
    try:
        return kind(params, lr=opts.lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return kind(params, lr=opts.lr)


def learning_rate(opts, step: int) -> float:
    """--lr at `step` (0 the first): linear warm-up over --lr-warmup-steps W, reaching --lr at step
    W - 1, then a cosine from there down to 0 at step --lr-decay-steps (no decay without it).

    >>> from types import SimpleNamespace
    >>> o = SimpleNamespace(lr=1.0, lr_warmup_steps=2, lr_decay_steps=4)
    >>> [round(learning_rate(o, k), 6) for k in range(6)]
    [0.5, 1.0, 0.75, 0.25, 0.0, 0.0]
    """
    warmup, decay = opts.lr_warmup_steps, opts.lr_decay_steps
    if step < warmup:
        return opts.lr * (step + 1) / warmup
    if decay is None:
        return opts.lr
    peak = max(warmup - 1, 0)
    done = min(1.0, (step - peak) / (decay - peak))
    return opts.lr * 0.5 * (1 + math.cos(math.pi * done))


def set_learning_rate(optimizer: torch.optim.Optimizer, opts, step: int) -> None:
    if opts.lr_warmup_steps or opts.lr_decay_steps is not None:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(opts, step)


def clip_coefficient(square_sum: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What the gradients are multiplied by to bring their global norm to `max_norm` at most (torch's
    clip_grad_norm_ rule: max_norm / (norm + 1e-6), at most 1)."""
    return (max_norm / (square_sum.sqrt() + 1e-6)).clamp(max=1.0)


def autocast(opts, device: torch.device):
    """The forward's (and a recomputation's) autocast context: bf16 with --dtype bf16."""
    if opts.dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def matmul_precision(opts, device: torch.device) -> None:
    """On CUDA, fp32 matrix products in TF32 unless --tf32 off (the reference and the ranks alike); under
    --dtype bf16 the products are bf16 and the setting is left alone. Nothing changes on CPU."""
    if device.type == "cuda" and opts.dtype == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = opts.tf32 == "on"


def load_loss(opts):
    """--loss 'pkg.mod:fn', else the cross entropy over the tokens."""
    return lm_loss if opts.loss is None else load_function(opts.loss, "--loss", ModelError)


def make_dataset(opts) -> Dataset:
    """The run's data: the user's (--data), else byte-level text or random tokens (--synthetic)."""
    cfg = opts.model_config
    if opts.data:
        return load_dataset(opts.data, cfg, opts.seed)
    return Dataset(cfg.seq, cfg.vocab, opts.seed, opts.synthetic)


def global_microbatches(plan: Plan, dp: int) -> int:
    """The step's microbatches over every replica (a chunked plan's units are k to a microbatch)."""
    return plan.meta["microbatches"] // plan.meta.get("chunks", 1) * dp


def tokens_per_step(plan: Plan, opts) -> int:
    return global_microbatches(plan, opts.dp) * opts.model_config.mb_size * opts.model_config.seq


def write_grads(directory: str, grads: dict[str, torch.Tensor]) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "grads.pt.tmp"
    torch.save(dict(sorted(grads.items())), tmp)
    tmp.replace(out / "grads.pt")


def write_loss(directory: str, loss: float) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "loss.json.tmp"
    tmp.write_text(json.dumps({"loss": loss}) + "\n")
    tmp.replace(out / "loss.json")


def write_sent(directory: str, sent: list[int]) -> None:
    """DIR/sent.json: the bytes of pipeline messages each global rank sent in the first step."""
    out = Path(directory)
    tmp = out / "sent.json.tmp"
    tmp.write_text(json.dumps({"bytes_sent": sent}) + "\n")
    tmp.replace(out / "sent.json")


def log_step(opts, step: int, loss: float, seconds: float, tokens: int, extra: dict | None = None) -> None:
    """Rank 0's per-step line, and its JSON line in --metrics-out (truncated at the first step), with
    `extra` fields (the pipelined run's peak saved bytes)."""
    if not opts.quiet:
        print(step_line(step, loss, seconds, tokens), flush=True)
    if opts.metrics_out:
        record = {"step": step, "loss": loss, "seconds": seconds, "tokens_per_s": tokens / seconds, **(extra or {})}
        with open(opts.metrics_out, "a" if step > opts.first_step else "w") as handle:
            handle.write(json.dumps(record) + "\n")


def step_line(step: int, loss: float, seconds: float, tokens: int) -> str:
    return (f"step {step:5d}  loss {loss:.6f}  time {seconds * 1e3:8.1f} ms  "
            f"{tokens / seconds:10.0f} tokens/s")
