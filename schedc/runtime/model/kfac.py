# K-FAC (Martens & Grosse 2015) as PipeFisher runs it: handlers for the plan's tasks curvature_A,
# curvature_B, inversion and precondition (schedc/schedules/pipefisher*.sched). Load with `--tasks
# schedc.runtime.kfac`.
#
# For every nn.Linear of a stage (layer j, in `named_modules` order), with a = [input, 1] (bias) and g
# the output gradient of the per-row loss, per step cycle of K step programs:
#   F of (s, i) in the cycle's first step      keeps a, B keeps g (only for microbatches the plan names)
#   curvature_A(s, i) / curvature_B(s, i)      adds a aᵀ / g gᵀ to the stage's running sums (part q of
#                                              Q handles layers j ≡ q mod Q)
#   end of the step of a stage's last curvature  sums all-reduced over the stage's replicas (Chimera),
#                                              then A ← (1-ρ) A + ρ ΣaaT/n (ρ = 1 the first time)
#   inversion(s)                               (A + √λ I)⁻¹ and (G + √λ I)⁻¹ by Cholesky; replica r of R
#                                              inverts units u = 2j + (0 for A, 1 for G) with u ≡ r mod R
#                                              (PipeFisher's partition-aware inversion), part q of Q those
#                                              with (u // R) ≡ q mod Q
#   end of the step of a stage's last inversion  inverses all-reduced over the replicas, then published
#                                              (a replicated stage whose last inversion comes no later
#                                              than its last curvature inverts the previous refresh's
#                                              factors: the fill lagged it; none in the first cycle)
#   precondition(s)                            ∇W ← G⁻¹ ∇W A⁻¹ with the published inverses (the newest,
#                                              stale across the cycle as in the paper); before SYNC_GRAD,
#                                              which is fine since it is linear and replicas share inverses
# Other parameters (LayerNorm, embeddings) stay first-order. All exchanges run in the optimizer's
# step pre-hook, at the end of the step on every rank of a replica group in ascending stage order, so
# they never wait inside a step. Data parallelism (--dp > 1) keeps factors per data-parallel replica.
#
# Tensor parallelism (--tp t, with or without --sequence-parallel): a column- or row-parallel layer's
# factors are those of the whole layer it was cut from. Each curvature task gathers, over the tensor
# group, the pieces its rank holds (a row-parallel input's features and a column-parallel output's, in
# the weight's blocks; under sequence parallelism a column-parallel input's and a row-parallel output's
# rows), so every tensor rank folds and inverts the whole factors, as one process does; precondition
# gathers the whole ∇[W, b], transforms it and keeps its rank's cut (a sequence-parallel row-parallel
# bias, whose gradient the ranks hold in parts summed at the end of the step, keeps 1/t of it).
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from schedc.plan import Instr, Opcode

from ..execution.tasks import register_setup, register_task
from .tensor_parallel import PARTIAL, ColumnParallelLinear, RowParallelLinear, Split, TensorGroup, cut, join

CURVATURE = ("curvature_A", "curvature_B")
KFAC_TASKS = frozenset({*CURVATURE, "inversion", "precondition"})
DAMPING = 1e-2
EMA = 1.0  # weight of the newest curvature; 1 keeps only the latest refresh


# -- the math, shared with the tests ---------------------------------------------------------------

def layer_input(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Rows of a = [x, 1] (the 1 for the bias), as float64-free float32 [rows, in (+1)]."""
    a = x.detach().reshape(-1, x.shape[-1]).float()
    if module.bias is not None:
        a = torch.cat([a, a.new_ones(a.shape[0], 1)], dim=1)
    return a


def damped_inverse(factor: torch.Tensor, damping: float) -> torch.Tensor:
    """(F + √λ I)⁻¹ by Cholesky."""
    eye = torch.eye(factor.shape[0], dtype=factor.dtype, device=factor.device)
    return torch.cholesky_inverse(torch.linalg.cholesky(factor + damping ** 0.5 * eye))


def weight_grad(module: nn.Linear) -> torch.Tensor:
    """∇[W, b] as one [out, in (+1)] matrix."""
    grad = module.weight.grad
    return grad if module.bias is None else torch.cat([grad, module.bias.grad[:, None]], dim=1)


def precondition_layer(module: nn.Linear, a_inv: torch.Tensor, g_inv: torch.Tensor) -> None:
    """∇[W, b] ← G⁻¹ ∇[W, b] A⁻¹, in place (the grads are views into the stage's flat gradient)."""
    new = g_inv @ weight_grad(module) @ a_inv
    module.weight.grad.copy_(new[:, :module.weight.shape[1]])
    if module.bias is not None:
        module.bias.grad.copy_(new[:, -1])


# -- tensor parallelism: a cut layer's pieces gathered into the whole layer's --------------------------

LAYERS = (nn.Linear, ColumnParallelLinear, RowParallelLinear)


@dataclass(frozen=True, slots=True)
class Pieces:
    """How a K-FAC layer's input a and output gradient g are held over the tensor group: their rows cut
    (sequence shards) and/or their features cut (`Split` along the last dim); none of it for a whole
    nn.Linear."""

    a_rows: bool = False
    a_features: Split | None = None
    g_rows: bool = False
    g_features: Split | None = None


def pieces_of(layer: nn.Module, tp: TensorGroup) -> Pieces:
    sequence = tp.sequence_parallel and tp.size > 1
    if isinstance(layer, ColumnParallelLinear):
        return Pieces(a_rows=sequence, g_features=Split(-1, layer.tensor_splits["weight"].blocks))
    if isinstance(layer, RowParallelLinear):
        return Pieces(a_features=Split(-1), g_rows=sequence)
    return Pieces()


def _gather(x: torch.Tensor, tp: TensorGroup, split: Split | None, rows: bool) -> torch.Tensor:
    """The whole [rows, features] matrix from every tensor rank's piece (collective over the group)."""
    for dim, wanted in ((-1, split), (0, rows)):
        if wanted and tp.size > 1:
            parts = [torch.empty_like(x) for _ in range(tp.size)]
            dist.all_gather(parts, x.contiguous(), group=tp.group)
            x = join(parts, split) if dim == -1 else torch.cat(parts, dim=0)
    return x


def whole_rows(layer: nn.Module, which: int, x: torch.Tensor, tp: TensorGroup) -> torch.Tensor:
    """The captured rows of a (which 0, with its bias column) or g (1) as the whole layer's."""
    pieces = pieces_of(layer, tp)
    if which == 0:
        return layer_input(layer, _gather(x, tp, pieces.a_features, pieces.a_rows))
    return _gather(x, tp, pieces.g_features, pieces.g_rows)


def factor_sizes(layer: nn.Module, tp: TensorGroup) -> tuple[int, int]:
    """The whole layer's A and G sizes: its input features (+1 for the bias) and its outputs."""
    out, features = layer.weight.shape
    if isinstance(layer, ColumnParallelLinear):
        out *= tp.size
    elif isinstance(layer, RowParallelLinear):
        features *= tp.size
    return features + (layer.bias is not None), out


def precondition_cut(layer: nn.Module, a_inv: torch.Tensor, g_inv: torch.Tensor, tp: TensorGroup) -> None:
    """precondition_layer for a layer cut over the tensor group: the whole ∇[W, b] gathered, transformed,
    and this rank's cut of it written back in place."""
    weight_split = layer.tensor_splits["weight"]
    bias_split = layer.tensor_splits.get("bias") if layer.bias is not None else None
    grad = _gather(layer.weight.grad, tp, Split(weight_split.dim, weight_split.blocks), False)
    if layer.bias is not None:
        bias = layer.bias.grad
        if isinstance(bias_split, Split):
            bias = _gather(bias[:, None], tp, Split(0, bias_split.blocks), False)[:, 0]
        elif bias_split == PARTIAL:
            bias = bias.clone()
            dist.all_reduce(bias, group=tp.group)
        grad = torch.cat([grad, bias[:, None]], dim=1)
    new = g_inv @ grad @ a_inv
    features = grad.shape[1] - (layer.bias is not None)
    layer.weight.grad.copy_(cut(new[:, :features], weight_split, tp))
    if layer.bias is not None:
        bias = new[:, -1]
        layer.bias.grad.copy_(cut(bias, bias_split, tp) if isinstance(bias_split, Split)
                              else bias / tp.size if bias_split == PARTIAL else bias)


# -- per-rank state ----------------------------------------------------------------------------------

@dataclass
class StageFactors:
    layers: list[nn.Linear]
    group: tuple[int, ...]               # plan ranks holding this model stage (sorted)
    replica: int                         # this rank's position among them
    sums: list[list[torch.Tensor | None]] = field(default_factory=list)   # [j][0 A, 1 G] running sums
    rows: list[list[int]] = field(default_factory=list)
    factors: list[list[torch.Tensor | None]] = field(default_factory=list)
    staged: list[list[torch.Tensor | None]] = field(default_factory=list)  # inverses being computed
    inverses: list[list[torch.Tensor | None]] = field(default_factory=list)  # published

    def __post_init__(self):
        n = len(self.layers)
        self.sums, self.rows = [[None, None] for _ in range(n)], [[0, 0] for _ in range(n)]
        self.factors = [[None, None] for _ in range(n)]
        self.staged = [[None, None] for _ in range(n)]
        self.inverses = [[None, None] for _ in range(n)]


class Kfac:
    """K-FAC state of one rank: its stages' factors, the captured inputs and gradients, the hooks."""

    def __init__(self, executor, damping: float = DAMPING, ema: float = EMA):
        self.executor, self.damping, self.ema = executor, damping, ema
        plan = executor.plan
        self.cycle = len(plan.ranks[executor.world.plan_rank])
        self.wanted = {(i.op, i.stage, i.mb) for step in plan.ranks[executor.world.plan_rank]
                       for i in step if i.op in CURVATURE}
        self.factor_step = _last_step(plan, CURVATURE)
        self.inverse_step = _last_step(plan, ("inversion",))
        self.stages = {s: StageFactors([m for m in stage.modules() if isinstance(m, LAYERS)],
                                       *_replica_position(plan, s, executor.world.plan_rank))
                       for s, stage in executor.stages.items()}
        self.captured: dict[tuple[str, int, int, int], torch.Tensor] = {}
        for s, factors in self.stages.items():
            for j, layer in enumerate(factors.layers):
                layer.register_forward_hook(self._forward_hook(s, j))
        self.lagged = {s for s, factors in self.stages.items() if len(factors.group) > 1
                       and self.inverse_step.get(s, -1) <= self.factor_step.get(s, -1)}
        executor.optimizer.register_step_pre_hook(lambda *_: self.end_of_step())

    @property
    def tp(self) -> TensorGroup:
        return self.executor.tp  # set up after the executor is built

    # capture ------------------------------------------------------------------------------------

    def _capturing(self, kind: str, s: int) -> int | None:
        instr = self.executor.current
        if instr is None or instr.stage != s or self.executor.step_no % self.cycle:
            return None
        if instr.op != Opcode.F:  # a backward's recomputation (--recompute) runs the forward hooks again
            return None
        return instr.mb if (kind, s, instr.mb) in self.wanted else None

    def _forward_hook(self, s: int, j: int):
        def hook(module, inputs, output):
            mb = self._capturing("curvature_A", s)
            if mb is not None:
                self.captured[("A", s, mb, j)] = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float()
            mb = self._capturing("curvature_B", s)
            if mb is not None and output.requires_grad:
                output.register_hook(self._grad_hook(s, mb, j))
        return hook

    def _grad_hook(self, s: int, mb: int, j: int):
        def hook(grad):
            self.captured[("G", s, mb, j)] = grad.detach().reshape(-1, grad.shape[-1]).float()
        return hook

    # tasks --------------------------------------------------------------------------------------

    def curvature(self, instr: Instr, which: int) -> None:
        factors = self.stages[instr.stage]
        parts = instr.parts or 1
        for j in range(instr.part or 0, len(factors.layers), parts):
            x = self.captured.pop(("AG"[which], instr.stage, instr.mb, j), None)
            if x is None:
                raise RuntimeError(f"no captured {'input' if which == 0 else 'output gradient'} of layer "
                                   f"{j} for microbatch {instr.mb}: curvature tasks run in the cycle of "
                                   "the step whose microbatches they name")
            x = whole_rows(factors.layers[j], which, x, self.tp)
            if which == 1:  # the output gradient of the per-row loss
                x = x * (x.shape[0] / self.executor.scale)
            total = factors.sums[j][which]
            factors.sums[j][which] = x.T @ x if total is None else total.addmm_(x.T, x)
            factors.rows[j][which] += x.shape[0]

    def inversion(self, instr: Instr) -> None:
        factors = self.stages[instr.stage]
        if len(factors.group) == 1:
            self._fold(factors)
        replicas, parts, part = len(factors.group), instr.parts or 1, instr.part or 0
        for u in range(2 * len(factors.layers)):
            j, which = divmod(u, 2)
            if u % replicas != factors.replica or (u // replicas) % parts != part:
                continue
            if factors.factors[j][which] is None:
                if instr.stage in self.lagged:
                    continue  # the first cycle: no refresh folded yet
                raise RuntimeError(f"inversion of stage {instr.stage} before any curvature of it")
            factors.staged[j][which] = damped_inverse(factors.factors[j][which], self.damping)

    def precondition(self, instr: Instr) -> None:
        factors = self.stages[instr.stage]
        parts, part = instr.parts or 1, instr.part or 0
        for j in range(part, len(factors.layers), parts):
            a_inv, g_inv = factors.inverses[j]
            layer = factors.layers[j]
            if a_inv is None or g_inv is None or layer.weight.grad is None:
                continue
            if isinstance(layer, nn.Linear):
                precondition_layer(layer, a_inv, g_inv)
            else:
                precondition_cut(layer, a_inv, g_inv, self.tp)

    # end of step: exchanges ---------------------------------------------------------------------

    def end_of_step(self) -> None:
        k = self.executor.step_no % self.cycle
        for s in sorted(self.stages):
            factors = self.stages[s]
            publish, lagged = self.inverse_step.get(s) == k, s in self.lagged
            if publish and lagged:  # the previous refresh's, before this one folds
                self._publish(factors)
            if len(factors.group) > 1 and self.factor_step.get(s) == k:
                self._all_reduce_sums(factors)
                self._fold(factors)
            if publish and not lagged:
                self._publish(factors)

    def _publish(self, factors: StageFactors) -> None:
        """The staged inverses (all-reduced over the replicas) become the ones preconditioning uses;
        nothing while no refresh has been folded (a lagged stage's first cycle)."""
        if all(pair[0] is None for pair in factors.factors):
            return
        if len(factors.group) > 1:
            self._all_reduce_staged(factors)
        factors.inverses = [list(pair) for pair in factors.staged]
        factors.staged = [[None, None] for _ in factors.layers]

    def _group(self, factors: StageFactors):
        return self.executor.world.sync_groups[factors.group]

    def _all_reduce_sums(self, factors: StageFactors) -> None:
        for j, layer in enumerate(factors.layers):
            for which in (0, 1):
                size = factor_sizes(layer, self.tp)[which]
                total = factors.sums[j][which]
                if total is None:
                    total = factors.sums[j][which] = torch.zeros(size, size, device=layer.weight.device)
                rows = torch.tensor([float(factors.rows[j][which])], device=total.device)
                dist.all_reduce(total, group=self._group(factors))
                dist.all_reduce(rows, group=self._group(factors))
                factors.rows[j][which] = int(rows.item())

    def _all_reduce_staged(self, factors: StageFactors) -> None:
        for j, layer in enumerate(factors.layers):
            for which in (0, 1):
                size = factor_sizes(layer, self.tp)[which]
                mine = factors.staged[j][which]
                buffer = mine if mine is not None else torch.zeros(size, size, device=layer.weight.device)
                dist.all_reduce(buffer, group=self._group(factors))
                factors.staged[j][which] = buffer

    def _fold(self, factors: StageFactors) -> None:
        """Running sums -> factors (EMA), once per refresh."""
        for j in range(len(factors.layers)):
            for which in (0, 1):
                total, rows = factors.sums[j][which], factors.rows[j][which]
                if total is None or rows == 0:
                    continue
                new = total / rows
                old = factors.factors[j][which]
                factors.factors[j][which] = new if old is None else (1 - self.ema) * old + self.ema * new
                factors.sums[j][which], factors.rows[j][which] = None, 0


def _last_step(plan, kinds) -> dict[int, int]:
    """Model stage -> the last step of the cycle holding one of `kinds` for it, on any rank."""
    last: dict[int, int] = {}
    for steps in plan.ranks:
        for k, step in enumerate(steps):
            for instr in step:
                if instr.op in kinds:
                    last[instr.stage] = max(last.get(instr.stage, 0), k)
    return last


def _replica_position(plan, stage: int, rank: int) -> tuple[tuple[int, ...], int]:
    """The sorted plan ranks holding `stage` in this rank's replica group, and this rank's index."""
    pipes = plan.meta["pipelines"]
    mine = [k for k, pipe in enumerate(pipes) if pipe["placement"][stage] == rank]
    group = next((g for g in plan.meta.get("replicas", []) if mine and mine[0] in g), mine)
    ranks = sorted({pipes[k]["placement"][stage] for k in group})
    return tuple(ranks), ranks.index(rank)


# -- registration ------------------------------------------------------------------------------------

def _state(executor) -> Kfac:
    return executor.kfac


@register_setup
def attach(executor) -> None:
    """Give the executor K-FAC state when its plan has K-FAC tasks."""
    ops = {i.op for steps in executor.plan.ranks for step in steps for i in step}
    if ops & KFAC_TASKS:
        executor.kfac = Kfac(executor)


@register_task("curvature_A")
def curvature_a(executor, instr: Instr) -> None:
    _state(executor).curvature(instr, 0)


@register_task("curvature_B")
def curvature_b(executor, instr: Instr) -> None:
    _state(executor).curvature(instr, 1)


@register_task("inversion")
def inversion(executor, instr: Instr) -> None:
    _state(executor).inversion(instr)


@register_task("precondition")
def precondition(executor, instr: Instr) -> None:
    _state(executor).precondition(instr)
