"""ZeRO stages 2 and 3 over the runtime's flat buffers (--zero 2, --zero 3; stage 1 is sharding.Shards).

With --dp D each stage's weights and gradients are one flat buffer each, padded to a multiple of D, and
data-parallel rank r owns the r-th 1/D of both (its optimizer steps that shard, as under stage 1):

    --zero 2  the gradients are reduce-scattered at the step's end (each rank receives its shard, summed
              over the replicas) instead of all-reduced; the full gradient buffer is the accumulation
              buffer of the step's microbatches: allocated at the stage's first backward, freed after the
              reduce-scatter. The updated weight shards are all-gathered after the optimizer's step.
    --zero 3  the weights are sharded too: a stage's full weights exist only while it computes. They are
              all-gathered from the shards before an op that reads them (F, B, I, W, R) and freed
              (resharded) after each op with --reshard-after-forward (FSDP2's reshard_after_forward),
              else at the step's end, after the optimizer's step (Llama 3's FSDP without resharding).

The buffers are freed by resizing their storage to nothing and re-allocated in place, so every
parameter (a view into its stage's buffer) and every tensor autograd saved of it reads the gathered
values again (the shards do not change within a step, so the gathered weights are the same bytes).

    stage weights [ w0 w1 w2 w3 w4 w5 | pad pad ]     D = 2: rank 0 keeps [w0..w3], rank 1 [w4 w5 pad pad]
    F(s): all-gather -> [ w0 .. w5 pad pad ] on both; after F (resharding): both keep their shard only
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from schedc.plan import Instr, Opcode

from ..execution.executor import ExecutionError
from .sharding import Shards

READS_WEIGHTS = frozenset({Opcode.F.value, Opcode.B.value, Opcode.I.value, Opcode.W.value, Opcode.R.value})
WRITES_GRADS = frozenset({Opcode.B.value, Opcode.I.value, Opcode.W.value})


class ZeroShards(Shards):
    """Stage 1's shards, plus the gradients' (--zero 2) and the weights' (--zero 3) freed between uses."""

    def __init__(self, stages: dict, dp: int, index: int, group, ranks: list[int], level: int,
                 reshard_after_forward: bool):
        super().__init__(stages, dp, index, group, ranks)
        self.level, self.reshard = level, reshard_after_forward and level == 3
        self.weights = {s: flat for s, (flat, _, _) in zip(stages, self.parts)}
        self.grads = {s: stage.flat_grad for s, stage in stages.items()}
        self.by_stage = {s: shard for s, (_, shard, _) in zip(stages, self.parts)}
        for shard in self.by_stage.values():
            shard.grad = torch.zeros_like(shard)  # its own: the reduce-scatter's output
        self.on_gather = None  # called (old, new) with a gathered buffer's storage (the saved-bytes meter's)
        self.pointers: dict[int, int | None] = {s: None for s in stages}
        self.shard_bytes = sum(_bytes(shard) for shard in self.by_stage.values())
        self.held_bytes = self.peak_held = sum(_bytes(flat) for flat in self.weights.values())
        self.grad_bytes = self.peak_grads = 0  # the whole gradient buffers held, now and at most
        for s in self.grads:
            _free(self.grads[s])
        if level == 3:
            for s in self.weights:
                self._release(s)
            self.peak_held = 0

    # -- the executor's hooks ------------------------------------------------------------------

    def before(self, instr: Instr) -> None:
        """Gather what the instruction's ops read: a stage's weights (--zero 3), its gradient buffer."""
        for unit in instr.units():
            if unit.stage not in self.weights:
                continue
            if self.level == 3 and unit.op in READS_WEIGHTS:
                self._gather(unit.stage)
            if unit.op in WRITES_GRADS or unit.op == Opcode.SYNC_GRAD:
                self._hold_grads(unit.stage)

    def after(self, instr: Instr) -> None:
        """With --reshard-after-forward, free the weights of every stage the instruction computed."""
        if self.reshard:
            for unit in instr.units():
                if unit.op in READS_WEIGHTS and unit.stage in self.weights:
                    self._release(unit.stage)

    def reduce_gradients(self) -> None:
        """Each rank's gradient shards, summed over the data-parallel ranks (a reduce-scatter)."""
        for s, flat in self.grads.items():
            self._hold_grads(s)  # a stage that computed nothing this step contributes zeros
            try:
                dist.reduce_scatter(self.by_stage[s].grad, list(flat.chunk(self.dp)), group=self.group)
            except Exception as exc:
                raise ExecutionError(f"the gradients' reduce-scatter over ranks {self.ranks} failed, one of "
                                     f"them is probably lost: {type(exc).__name__}") from exc

    @torch.no_grad()
    def gather_gradients(self) -> None:
        """Every stage's whole synced gradient into its buffer (--save-grads reads them whole)."""
        for s, flat in self.grads.items():
            dist.all_gather(list(flat.chunk(self.dp)), self.by_stage[s].grad, group=self.group)

    def after_step(self) -> None:
        """After the optimizer's step: the gradient buffers freed; the weights all-gathered (--zero 2) or
        left sharded until their next use (--zero 3)."""
        for flat in self.grads.values():
            _free(flat)
        self.grad_bytes = 0
        for shard in self.by_stage.values():
            shard.grad.zero_()
        if self.level == 3:
            for s in self.weights:
                self._release(s)
        else:
            self.gather()

    def parameter_bytes(self) -> int:
        """The most weight bytes this rank held at once: its shards (the optimizer's fp32 weights) and
        the gathered stages' whole buffers at their peak."""
        return self.shard_bytes + self.peak_held

    def gradient_bytes(self) -> int:
        """The most gradient bytes this rank held at once: its shards' and the whole buffers at their peak."""
        return sum(_bytes(shard.grad) for shard in self.by_stage.values()) + self.peak_grads

    # -- buffers -------------------------------------------------------------------------------

    def _hold_grads(self, s: int) -> None:
        flat = self.grads[s]
        if not _held(flat):
            _allocate(flat)
            self.grad_bytes += _bytes(flat)
            self.peak_grads = max(self.peak_grads, self.grad_bytes)

    @torch.no_grad()
    def _gather(self, s: int) -> None:
        flat = self.weights[s]
        if _held(flat):
            return
        _allocate(flat)
        try:
            dist.all_gather(list(flat.chunk(self.dp)), self.by_stage[s].detach(), group=self.group)
        except Exception as exc:
            raise ExecutionError(f"stage {s}'s weights' all-gather over ranks {self.ranks} failed, one of them "
                                 f"is probably lost: {type(exc).__name__}") from exc
        self.held_bytes += _bytes(flat)
        self.peak_held = max(self.peak_held, self.held_bytes)
        pointer = flat.untyped_storage().data_ptr()
        if self.on_gather is not None:
            self.on_gather(self.pointers[s], pointer)
        self.pointers[s] = pointer

    def _release(self, s: int) -> None:
        flat = self.weights[s]
        if _held(flat):
            self.held_bytes -= _bytes(flat)
            _free(flat)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _held(flat: torch.Tensor) -> bool:
    return flat.untyped_storage().nbytes() > 0


def _free(flat: torch.Tensor) -> None:
    flat.untyped_storage().resize_(0)


def _allocate(flat: torch.Tensor) -> None:
    """A freed buffer's storage back, zeroed (a held one is left as it is)."""
    if not _held(flat):
        flat.untyped_storage().resize_(_bytes(flat))
        flat.zero_()


def state_bytes(stages: dict, shards, optimizer) -> dict[str, int]:
    """This rank's training state by term, each at its most over the run, in the cost model's terms
    (schedc/costmodel/state_terms.py): the weights it keeps (whole, or its shards under --zero 3),
    the stages --zero 3 gathered, the gradients (whole buffers and reduce-scattered shards), the
    optimizer's state (AdamW's moments, and the fp32 shards it steps where those are copies), and
    AdamW's step counters apart (one fp32 scalar a tensor it steps, which no term predicts)."""
    counters = moments = 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                counters += _bytes(value) if key == "step" else 0
                moments += 0 if key == "step" else _bytes(value)
    if shards is None:
        weights = sum(_bytes(p) for stage in stages.values() for p in stage.parameters())
        return {"weights": weights, "gathered": 0, "optimizer_state": moments, "step_counters": counters,
                "gradients": sum(_bytes(stage.flat_grad) for stage in stages.values())}
    copies = sum(_bytes(shard) for shard in shards.parameters())
    whole = sum(_bytes(flat) for flat, _, _ in shards.parts)
    gradients = shards.gradient_bytes() if shards.level >= 2 else sum(_bytes(s.flat_grad) for s in stages.values())
    if shards.level == 3:
        return {"weights": copies, "gathered": shards.peak_held, "gradients": gradients,
                "optimizer_state": moments, "step_counters": counters}
    return {"weights": whole, "gathered": 0, "gradients": gradients, "optimizer_state": copies + moments,
            "step_counters": counters}
