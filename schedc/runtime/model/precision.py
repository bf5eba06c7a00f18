# --dtype bf16-main: Megatron-LM's mixed precision. The stages' weights are bf16 (the model converted
# whole, as Megatron's Float16Module does), so activations, pipeline messages and tensor-parallel
# collectives are bf16 with no autocast; the optimizer steps fp32 main copies of the weights and keeps
# its state in fp32; each backward's bf16 weight gradients are added into an fp32 gradient buffer
# (Megatron's main_grad), which the data-parallel reduction, the clipping and --save-grads read; after
# the step the main weights are cast back into the bf16 ones. NeMo's bf16 recipe states the same
# choices: params_dtype and pipeline_dtype bf16, autocast off, grad_reduce_in_fp32 on.
#
#     bf16 weights w16 --F/B--> bf16 grads g16 --after each B/W--> main_grad (fp32) += g16, g16 freed
#     optimizer: w32 -= update(main_grad)   (w32 fp32; AdamW's moments fp32)   then w16 = bf16(w32)
#
# The main weights start as fp32 of the bf16 weights (Megatron's `param.detach().clone().float()`), so
# the one-process reference, doing the same per microbatch, starts from the same numbers.
from __future__ import annotations

import copy

import torch
from torch import nn

from schedc.ops import OpKind

from .init import placeholder

MAIN = "bf16-main"  # the --dtype choice
GRAD_KINDS = (OpKind.B, OpKind.W)  # the ops that leave weight gradients


def check_task(name: str, dtype: str) -> None:
    """A plan's user task under --dtype bf16-main: refused (a task reads .grad, kept in main_grad here)."""
    if dtype == MAIN:
        from schedc.plan import PlanError
        raise PlanError(f"--dtype bf16-main does not compose with the plan's task {name} yet (a task reads .grad, "
                        "which bf16-main keeps in fp32 main_grad); use --dtype bf16")


def gradient(param: nn.Parameter) -> torch.Tensor | None:
    """The gradient a reader of a parameter's gradient sees: its fp32 main gradient under --dtype
    bf16-main (its .grad is then empty between backwards), else .grad."""
    main = getattr(param, "main_grad", None)
    return param.grad if main is None else main


class MainParams:
    """Every held stage converted to bf16, with one fp32 flat main copy of its trainable weights (the
    optimizer's parameter) whose gradient is the stage's flat_grad (fp32, made by attach_flat_grads
    before the conversion: each weight's main_grad a view into it). Shaped as sharding.Shards, so the
    executor calls it where it calls the distributed optimizer: level 0, no sharding."""

    level = 0

    def __init__(self, stages: dict):
        self.stages = stages
        self.parts: list[tuple[list[nn.Parameter], nn.Parameter]] = []
        for stage in stages.values():
            params = [p for p in stage.parameters() if p.requires_grad]
            for p in params:
                p.main_grad, p.grad = p.grad, None
            stage.to(torch.bfloat16)
            flat = torch.cat([p.detach().reshape(-1).float() for p in params]) if params else torch.zeros(0)
            main = nn.Parameter(flat)
            main.grad = stage.flat_grad[:flat.numel()]
            self.parts.append((params, main))

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer steps: the fp32 main weights, one flat tensor per stage."""
        return [main for _, main in self.parts]

    def before(self, instr) -> None:
        """Nothing before an instruction."""

    def after(self, instr) -> None:
        """After a backward or weight-gradient instruction: its stage's bf16 gradients into main_grad."""
        for unit in instr.units():
            if unit.op in GRAD_KINDS:
                fold(self.stages[unit.stage])

    @torch.no_grad()
    def after_step(self) -> None:
        """The updated main weights cast into the bf16 weights."""
        for params, main in self.parts:
            offset = 0
            for p in params:
                p.copy_(main[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    @torch.no_grad()
    def refresh(self, saved: list[torch.Tensor] | None = None) -> None:
        """After a checkpoint's load: the main weights it saved, else (an older checkpoint) fp32 of the
        bf16 weights just loaded."""
        for index, (params, main) in enumerate(self.parts):
            if saved is not None:
                main.copy_(saved[index])
            elif params:
                main.copy_(torch.cat([p.detach().reshape(-1).float() for p in params]))


@torch.no_grad()
def fold(stage: nn.Module) -> None:
    """Each weight's bf16 gradient added into its fp32 main gradient, then freed (the next backward
    makes a fresh one)."""
    for p in stage.parameters():
        if p.grad is not None and getattr(p, "main_grad", None) is not None:
            p.main_grad.add_(p.grad)
            p.grad = None


def boundary_shapes(runs: list[list], cfg) -> list[tuple[torch.Size, torch.dtype]]:
    """Shape and dtype of each stage's output for one microbatch with the pieces in bf16, found on the
    meta device (no weights, no arithmetic); where a piece cannot run on meta, on host copies with empty
    weights. Nothing is autocast, so what a stage returns here is what it sends."""
    try:
        return _trace(runs, cfg, lambda module: copy.deepcopy(module).to("meta"), "meta")
    except (NotImplementedError, RuntimeError):
        return _trace(runs, cfg, lambda module: copy.deepcopy(placeholder(module)), "cpu")


def _trace(runs: list[list], cfg, copied, device: str) -> list:
    x = torch.zeros(cfg.mb_size, cfg.seq, dtype=torch.long, device=device)
    shapes = []
    with torch.no_grad():
        for run in runs[:-1]:
            for _, module in run:
                x = copied(module).to(torch.bfloat16)(x)
            shapes.append((x.shape, x.dtype))
    return shapes
