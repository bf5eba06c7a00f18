"""K-FAC in one process, written apart from schedc/runtime/model/kfac.py, as the reference a PipeFisher plan's run
must reproduce.

The unpartitioned model is trained on the whole global batch of every step (the runtime's model, data
and seed), with SGD on gradients preconditioned by K-FAC (Martens & Grosse 2015) as the runtime
documents it, at the plan's staleness:

- per nn.Linear W (bias b): A = E[a aᵀ] with a = [input, 1], G = E[g gᵀ] with g the output gradient of
  the per-row loss, averaged over the rows of the microbatches the plan's curvature_A(s, *) /
  curvature_B(s, *) tasks name, taken in the first step of every cycle of K step programs; the factor
  kept is (1 - ρ) old + ρ new (ρ = 1 the first time);
- inverses (F + √λ I)⁻¹ by Cholesky, published at the end of the cycle's last step holding an
  inversion of the layer's stage, and used from the next step on (stale until the next publication);
  when the plan lags a replicated stage's inversion (its last step no later than the stage's last
  curvature step), at that step of the next cycle instead;
- the update of [W, b] is G⁻¹ ∇[W, b] A⁻¹ once inverses are published (plain gradient before), every
  other parameter (embeddings, LayerNorm) first-order.

How the plan computes a backward (B, or I + W apart, or B inside an overlapped F&B op) does not enter:
the factors are of the step's own inputs and output gradients, whichever op produced them; only the
plan's cycle, its named microbatches and where it places inversions do (plan_staleness).

`fresh=True` uses each step's own factors at once (no staleness) and `kfac=False` is plain SGD: the
tests use them to show that the comparison tells them apart.
"""
from __future__ import annotations

import torch
from torch import nn

from schedc.runtime.model.data import Dataset
from schedc.runtime.model.gpt import ModelConfig, Stage, build_gpt, build_pieces, lm_loss, partition


def plan_staleness(plan: dict) -> tuple[int, dict[int, int], dict[tuple[str, int], set[int]]]:
    """The plan's cycle K, per model stage the step (counted from the start of the cycle whose
    curvature it inverts) at whose end its inverses are published, and per (curvature kind, stage)
    the microbatches its tasks name (on any rank)."""
    programs = [rank["steps"] for rank in plan["ranks"]]
    cycle = len(programs[0])
    inversion: dict[int, int] = {}
    curvature: dict[int, int] = {}
    named: dict[tuple[str, int], set[int]] = {}
    for steps in programs:
        assert len(steps) == cycle, "every rank runs the same number of step programs"
        for k, step in enumerate(steps):
            for instr in step:
                if instr["op"] == "inversion":
                    inversion[instr["stage"]] = max(inversion.get(instr["stage"], 0), k)
                elif instr["op"] in ("curvature_A", "curvature_B"):
                    named.setdefault((instr["op"], instr["stage"]), set()).add(instr["mb"])
                    curvature[instr["stage"]] = max(curvature.get(instr["stage"], 0), k)
    if plan.get("replicas"):  # a lagged stage publishes in the next cycle
        inversion = {s: k + cycle * (k <= curvature[s]) for s, k in inversion.items()}
    return cycle, inversion, named


def _rows(x: torch.Tensor, mbs: set[int], mb_size: int) -> torch.Tensor:
    """The rows ([sequence, position] flattened) of the named microbatches of a [batch, seq, n] tensor."""
    keep = torch.cat([torch.arange(mb * mb_size, (mb + 1) * mb_size) for mb in sorted(mbs)])
    return x[keep].reshape(-1, x.shape[-1])


def _inverse(factor: torch.Tensor, damping: float) -> torch.Tensor:
    damped = factor + damping ** 0.5 * torch.eye(factor.shape[0], dtype=factor.dtype)
    return torch.cholesky_inverse(torch.linalg.cholesky(damped))


def train_reference(plan: dict, cfg: ModelConfig, seed: int, steps: int, lr: float, damping: float,
                    ema: float, kfac: bool = True, fresh: bool = False
                    ) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """Losses of every step and, per model stage, the state dict a runtime checkpoint holds for it."""
    microbatches, stages = plan["microbatches"], plan["stages"]
    cycle, inversion_step, named = plan_staleness(plan)
    pieces = build_pieces(build_gpt, cfg, seed)
    runs = partition(pieces, stages)
    model = Stage(pieces)
    stage_of = {m: s for s, run in enumerate(runs) for _, piece in run for m in piece.modules()
                if isinstance(m, nn.Linear)}
    data = Dataset(cfg.seq, cfg.vocab, seed, synthetic=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    factors: dict[nn.Linear, list] = {m: [None, None] for m in stage_of}
    published: dict[nn.Linear, tuple] = {}
    waiting: list[tuple[int, nn.Linear, tuple]] = []  # (step at whose end they are published, layer, inverses)
    seen: dict[nn.Linear, tuple] = {}  # layer -> (input, output) of this step's forward

    def keep(module, inputs, output):
        output.retain_grad()
        seen[module] = (inputs[0], output)

    hooks = [m.register_forward_hook(keep) for m in stage_of]
    losses = []
    for t in range(steps):
        batch = data.batch(t, microbatches, cfg.mb_size)
        optimizer.zero_grad()
        seen.clear()
        loss = lm_loss(model(batch.tokens), batch.targets)
        loss.backward()
        losses.append(loss.item())
        rows = batch.tokens.numel()  # the loss is the mean over rows (sequence positions)
        if kfac and (fresh or t % cycle == 0):
            for m, s in stage_of.items():
                x, y = seen[m]
                a = _rows(x.detach(), named[("curvature_A", s)], cfg.mb_size)
                if m.bias is not None:
                    a = torch.cat([a, torch.ones(a.shape[0], 1)], dim=1)
                g = _rows(y.grad * rows, named[("curvature_B", s)], cfg.mb_size)
                for which, new in ((0, a.T @ a / a.shape[0]), (1, g.T @ g / g.shape[0])):
                    old = factors[m][which]
                    factors[m][which] = new if old is None else (1 - ema) * old + ema * new
                inverses = (_inverse(factors[m][0], damping), _inverse(factors[m][1], damping))
                if fresh:
                    published[m] = inverses
                else:
                    waiting.append((t - t % cycle + inversion_step[s], m, inverses))
        for m, (a_inv, g_inv) in published.items():
            grad = m.weight.grad if m.bias is None else torch.cat([m.weight.grad, m.bias.grad[:, None]], 1)
            new = g_inv @ grad @ a_inv
            m.weight.grad = new[:, :m.in_features].contiguous()
            if m.bias is not None:
                m.bias.grad = new[:, -1].contiguous()
        for _, m, inverses in [w for w in waiting if w[0] == t]:
            published[m] = inverses
        waiting = [w for w in waiting if w[0] != t]
        optimizer.step()
    for hook in hooks:
        hook.remove()
    return losses, [{k: v.detach().clone() for k, v in Stage(run).state_dict().items()} for run in runs]
