# What a run builds from its options, shared by the pipelined run and the reference: the model's
# pieces and their partition, the optimizer, the dataset, and the gradient/loss dumps.
from __future__ import annotations

import json
from pathlib import Path

import torch

from schedc.plan import Plan

from .data import Dataset, load_dataset
from .model import build_pieces, load_builder, partition


def model_runs(opts, stages: int) -> tuple[list, list[list]]:
    """All pieces of the model (built from --seed) and their partition into `stages` runs."""
    pieces = build_pieces(load_builder(opts.model), opts.model_config, opts.seed)
    return pieces, partition(pieces, stages)


def make_optimizer(params: list, opts) -> torch.optim.Optimizer:
    """The fused implementation where this torch has one for the device (one kernel for all params),
    else the default; the reference run builds its optimizer the same way."""
    kind = torch.optim.SGD if opts.optimizer == "sgd" else torch.optim.AdamW
    try:
        return kind(params, lr=opts.lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return kind(params, lr=opts.lr)


def make_dataset(opts) -> Dataset:
    """The run's data: the user's (--data), else byte-level text or random tokens (--synthetic)."""
    cfg = opts.model_config
    if opts.data:
        return load_dataset(opts.data, cfg, opts.seed)
    return Dataset(cfg.seq, cfg.vocab, opts.seed, opts.synthetic)


def global_microbatches(plan: Plan, dp: int) -> int:
    return plan.meta["microbatches"] * dp


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
