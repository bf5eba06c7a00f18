# The executor: interprets one rank's step programs through a method table, one handler per op.
#
# Tensors in flight live in `tensors[(kind, stage, mb)]`: F of stage s puts its output under
# ("F", s, mb), B/I of stage s its input gradient under ("B", s, mb); the consumer (F of s+1, B of s-1,
# or a SEND) pops it, so an activation is dropped at its last use. RECV_* puts a pending irecv there,
# waited for right before the consumer; SEND_* posts an isend, dropped once complete and waited for
# before STEP at the latest. The saved state of (stage, mb) for backward lives in `saved` from F to
# its last use (B, W, or a user task, possibly of the next step: see lifetimes.py). OVERLAP_F_B runs
# its forward and backward as one instruction: in sequence on CPU, on two CUDA streams on a GPU
# (schedc/runtime/execution/overlap.py). Placed recomputation (R) and offload (O, L), and the forwards they
# follow, run through schedc/runtime/execution/placed.py.
from __future__ import annotations

import os
import re
import signal
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import torch
import torch.distributed as dist

from schedc.ops import DECLARED, OpKind, carries, fed_by, link_ends, peer_stage
from schedc.plan import Instr, Opcode, Plan

from .clocks import HOST
from .chunks import SequenceChunks
from .lifetimes import freed_by, plan_lifetimes, release_sent
from .memory import SavedBytes
from ..model.gpt import Stage, lm_loss
from ..model.precision import gradient
from .overlap import CudaStreams, run_overlapped
from .placed import Placed
from .tasks import setup_tasks, task_handler
from ..model.tensor_parallel import (Messages, Split, TensorGroup, global_splits, input_half,
                                    sync_partial_gradients)
from ..process.world import World

@lru_cache(maxsize=1)
def split_backward() -> tuple[Callable, Callable] | None:
    """The input-gradient / weight-gradient halves of backward, as torch's zero-bubble schedules split
    them; None on a torch without them (W then runs backward again for the weights). Imported at the
    first I: torch.distributed.pipelining brings dynamo and DTensor, ~2 s of every rank's start."""
    try:
        from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    except ImportError:
        return None
    return stage_backward_input, stage_backward_weight


class ExecutionError(RuntimeError):
    """An instruction failed; the message names instruction, rank and step."""


@dataclass(slots=True)
class Pending:
    """An irecv in flight and the buffer it fills."""

    work: Any
    buffer: torch.Tensor
    peer: int
    shape: torch.Size | None = None  # the boundary tensor's, where the buffer holds a 1/t slice of it


@dataclass(slots=True)
class Saved:
    """What backward of (stage, mb) needs: the stage input (a leaf) and output (or scaled loss)."""

    x: torch.Tensor
    y: torch.Tensor
    grad: torch.Tensor | None = None  # output gradient, from I to W
    groups: list | None = None  # intermediate gradients for W (split backward)
    head: torch.Tensor | None = None  # stage 0 split: its first piece's output, x a detached copy of it
    stream: Any = None  # the CUDA stream F ran on (its backward's kernels run there too); None on CPU


class Executor:
    def __init__(self, plan: Plan, world: World, stages: dict[int, Stage], shapes: list,
                 optimizer: torch.optim.Optimizer, ignore_tasks: bool = False):
        self.chunks = SequenceChunks.of(plan)  # a chunked plan's units: runtime/execution/chunks.py
        self.plan, self.world, self.stages, self.shapes = plan, world, stages, self.chunks.message_shapes(shapes)
        self.optimizer = optimizer
        self.last = plan.meta["stages"] - 1
        self.microbatches = plan.meta["microbatches"]
        self.scale = 1.0 / (self.microbatches * world.dp)
        self.table: dict[str, Callable[[Instr], None]] = {
            Opcode.F: self.forward, Opcode.B: self.backward,
            Opcode.I: self.backward_input, Opcode.W: self.backward_weight,
            Opcode.SEND_F: self.send, Opcode.SEND_B: self.send,
            Opcode.RECV_F: self.recv, Opcode.RECV_B: self.recv,
            Opcode.SYNC_GRAD: self.sync_grad, Opcode.STEP: self.step_end,
            Opcode.OVERLAP_F_B: self.overlap, **dict.fromkeys(DECLARED, self.declared)}
        self.placed = Placed(self, list(plan.ranks[world.plan_rank]))  # R, O and L (placed.py)
        self.table.update(self.placed.table)
        self.programs = self.compile(plan.ranks[world.plan_rank], ignore_tasks)
        # stage 0 has no input gradient; where its backward is split, I still computes the gradients
        # inside the stage (tasks between I and W read them, e.g. K-FAC's curvature_B), down to the
        # output of its first piece (the embedding), which W then carries into that piece's weights
        self.split_first = any(instr.op == Opcode.I and instr.stage == 0
                               for program in plan.ranks[world.plan_rank] for instr in program)
        self.tensors: dict[tuple[str, int, int], torch.Tensor | Pending] = {}
        self.saved: dict[tuple[int, int], Saved] = {}  # also read by user tasks
        self.task_state: dict = {}  # free for user task handlers
        self.sends: deque[tuple[Any, torch.Tensor, int]] = deque()  # isends in flight (work, buffer, peer), oldest first
        self.loss_sum = torch.zeros((), device=world.device)
        self.events: list[tuple[int, int, int, int, int]] = []
        self.batch = None
        self.step_no = 0
        self.before_update: Callable[[Executor], None] | None = None
        self.shards = None  # the distributed optimizer's (sharding.Shards): the weights all-gathered after a step
        self.buckets = None  # --overlap-grad-reduce's (buckets.GradBuckets)
        self.fault: tuple[int, str] | None = None  # (step, "kill" | "hang"), for fault tests
        self.current: Instr | None = None
        self.started = 0.0
        self.waiting_on: int | None = None
        self.wait_ns = 0
        self.waited_until = 0  # when the instruction's last blocking receive was through (perf_counter_ns)
        self.clock = HOST  # clocks.DeviceClock() where measured on CUDA: events read at each step's end
        self.record_until = 1 << 62  # steps from here on are not timed (bounded memory)
        self.streams = CudaStreams() if world.device.type == "cuda" else None  # for OVERLAP_F_B
        self.loss_fn = lm_loss  # the last stage's; vocab_parallel_loss where its logits are split
        self.tp = TensorGroup()  # this rank's tensor-parallel group (--tp)
        self.messages = Messages(self.tp)  # how boundary tensors cross between stages under --tp
        self.sent_bytes = 0  # pipeline message bytes this rank has sent (--save-grads writes the first step's)
        self.meter: SavedBytes | None = None  # measures saved activations when set (runtime/execution/memory.py)
        self.autocast: Callable = nullcontext  # --dtype bf16: the forward's autocast
        self.clip_grad: float | None = None  # --clip-grad: the global norm the gradients are brought to
        self.clip_stages: list[int] = []  # the stages whose gradients this rank counts in the norm (once each)
        self.set_lr: Callable[[int], None] | None = None  # --lr-warmup-steps, --lr-decay-steps
        self.tied = None  # a tied embedding's pair on this rank (model/tied.py: TiedEmbeddings)
        setup_tasks(self)  # task modules attach their state and hooks (schedc/runtime/execution/tasks.py)

    # -- program ---------------------------------------------------------------------------------

    def compile(self, programs: tuple[tuple[Instr, ...], ...], ignore_tasks: bool) -> list[list[tuple]]:
        """Bind each instruction to its handler, with the (stage, mb) whose saved state is dropped after
        it (None for none)."""
        self.lifetimes = plan_lifetimes(list(programs))
        return [[(self.table.get(instr.op) or self._task(instr.op, ignore_tasks), instr,
                  freed_by(instr) if index in self.lifetimes.frees[k] else None)
                 for index, instr in enumerate(program)]
                for k, program in enumerate(programs)]

    def _task(self, name: str, ignore_tasks: bool) -> Callable[[Instr], None]:
        handler = task_handler(name, ignore_tasks)
        return lambda instr: handler(self, instr)

    @property
    def rank(self) -> int:
        return self.world.rank

    def run_step(self, step: int, batch) -> None:
        self.step_no, self.batch = step, batch
        program = self.programs[step % len(self.programs)]
        fault_at = len(program) // 2 if self.fault and self.fault[0] == step else -1
        recording = step < self.record_until
        clock = self.clock if recording else HOST  # device events where measured on CUDA (clocks.py)
        clock.begin_step()
        marks = []
        if self.meter is not None:
            self.meter.new_step(batch)
        for index, (handler, instr, freed) in enumerate(program):
            if index == fault_at:
                self._inject_fault(instr)
            self.current, self.started, self.wait_ns = instr, time.monotonic(), 0
            start = clock.mark()
            try:
                if self.shards is not None:  # ZeRO-3 gathers a stage's weights before its ops (zero.py)
                    self.shards.before(instr)
                handler(instr)
                if self.shards is not None:
                    self.shards.after(instr)
                if self.buckets is not None:  # --overlap-grad-reduce: the buckets this instruction completes
                    self.buckets.after(step % len(self.programs), index)
            except Exception as exc:
                raise ExecutionError(f"while executing {instr} (rank {self.rank}, step {step}): "
                                     f"{_describe(exc)}") from exc
            if freed is not None:
                self.saved.pop(freed, None)
                if self.meter is not None:
                    self.meter.release(freed)
            marks.append((index, start, clock.mark(), self.wait_ns, self.waited_until))
        self.current = None
        if recording:
            self.events.extend(clock.events(step, marks))

    def _inject_fault(self, instr: Instr) -> None:
        """--fault-kill: die at once; --fault-stop: be stopped (SIGSTOP); --fault-hang: stop making
        progress, as a stuck rank would."""
        if self.fault[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault[1] == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        self.current, self.started = instr, time.monotonic()
        while True:
            time.sleep(3600)

    # -- compute ---------------------------------------------------------------------------------

    def take(self, key: tuple[str, int, int]) -> torch.Tensor:
        """Pop a tensor in flight, waiting for its receive if it is still pending."""
        value = self.tensors.pop(key, None)
        if value is None:
            raise ExecutionError(f"no {key[0]} tensor of stage {key[1]} mb {key[2]} on this rank: "
                                 "its producer or RECV has not run (the plan is out of order)")
        if isinstance(value, Pending):
            begin, self.waiting_on = time.perf_counter_ns(), value.peer
            try:
                value.work.wait()
            except Exception as exc:
                raise ExecutionError(f"receive from rank {value.peer} failed, rank {value.peer} is "
                                     f"probably lost: {_describe(exc)}") from exc
            self.waited_until = time.perf_counter_ns()
            self.wait_ns += self.waited_until - begin
            self.waiting_on = None
            return value.buffer if value.shape is None else self.messages.arrived(value.buffer, value.shape)
        return value

    def forward(self, instr: Instr) -> None:
        """F, under the saved-bytes meter when there is one (placed.py: recomputed or offloaded where
        the plan places an R or an O for it)."""
        with self.autocast():
            if self.meter is None:
                return self.placed.forward(instr)
            with self.meter.recording((instr.stage, instr.mb)):
                self.placed.forward(instr)

    def _forward(self, instr: Instr, kept: torch.Tensor | None = None) -> None:
        """kept: R's rerun (placed.py) from the input its F kept; the F alone counts the loss and sends."""
        s, mb = instr.stage, instr.mb
        head, start = None, 0
        if s == 0:
            x = (self._data(mb)[0] if kept is None else kept).to(self.world.device, non_blocking=True)
            if self.split_first and len(self.stages[s].pieces) > 1:
                head = self.stages[s].pieces[0](x)
                if head.is_floating_point() and head.requires_grad:
                    x, start = head.detach().requires_grad_(), 1
                else:  # nothing to differentiate at the boundary: W does the whole backward
                    head = None
        else:
            x = (self.take((*fed_by(instr.op, s), mb)) if kept is None else kept).requires_grad_()
        with self.chunks.forward(s, mb, x.shape[1]):
            y = self.stages[s](x, start)
        if s == self.last:
            targets = self._data(mb)[1]
            loss = self.loss_fn(y, targets.to(self.world.device, non_blocking=True))
            if kept is None:
                self.loss_sum += loss.detach()
            y = loss * self.scale
        elif kept is None:
            self.tensors[("F", s, mb)] = y.detach()
        self.saved[(s, mb)] = Saved(x, y, head=head, stream=self.streams.current() if self.streams else None)

    def _data(self, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of this replica's microbatch (or unit) mb."""
        return self.chunks.data(self.batch, self.world.replica * (self.microbatches // self.chunks.chunks), mb)

    def _grad_out(self, s: int, mb: int) -> torch.Tensor | None:
        return None if s == self.last else self.take((*fed_by(OpKind.B, s), mb))

    def backward(self, instr: Instr) -> None:
        s, mb = instr.stage, instr.mb
        saved = self.saved[(s, mb)]
        torch.autograd.backward(*self.chunks.backward_roots(s, mb, saved.y, self._grad_out(s, mb)))
        if s > 0:
            self.tensors[("B", s, mb)] = saved.x.grad
        self._into_head(saved)

    def backward_input(self, instr: Instr) -> None:
        """The input gradient only; W later computes the weight gradients from the intermediate
        gradients kept here (torch.distributed.pipelining's split), without a second full pass."""
        s, mb = instr.stage, instr.mb
        saved = self.saved[(s, mb)]
        saved.grad = self._grad_out(s, mb)
        if s == 0 and saved.head is None:
            return  # no input gradient to send: W does the whole backward
        halves = split_backward()
        with input_half():  # sequence-parallel linears keep their gathered input for W
            if halves is None:
                (grad_x,) = torch.autograd.grad(saved.y, saved.x, saved.grad, retain_graph=True)
            else:
                grads = None if saved.grad is None else [saved.grad]
                (grad_x,), saved.groups = halves[0]([saved.y], grads, [saved.x], self._params(s))
        if s > 0:
            self.tensors[("B", s, mb)] = grad_x
        else:  # kept for W, which carries it into the first piece
            saved.x.grad = grad_x

    def backward_weight(self, instr: Instr) -> None:
        saved = self.saved[(instr.stage, instr.mb)]
        if saved.groups is not None:
            split_backward()[1](self._params(instr.stage), saved.groups)
        else:
            torch.autograd.backward(saved.y, saved.grad, inputs=self._params(instr.stage))
        self._into_head(saved)

    def _into_head(self, saved: Saved) -> None:
        """Stage 0 split at its first piece: the gradient of the piece's output into its weights."""
        if saved.head is not None:
            torch.autograd.backward(saved.head, saved.x.grad)

    def overlap(self, instr: Instr) -> None:
        """OVERLAP_F_B: both halves, timed as this one instruction (run_overlapped: on CUDA on two
        streams, else in the plan's order)."""
        try:
            run_overlapped(self, instr)
        finally:
            self.current = instr

    def inputs(self, half: Instr) -> list[torch.Tensor]:
        """The tensors a compute instruction of this rank reads that an earlier instruction made: its
        input in flight (received or local) and, for a backward, the saved state of its forward."""
        found = []
        producer = fed_by(half.op, half.stage)
        if producer is not None:
            value = self.tensors.get((*producer, half.mb))
            found += [] if value is None else [value.buffer if isinstance(value, Pending) else value]
        saved = self.saved.get((half.stage, half.mb)) if half.op != OpKind.F else None
        if saved is not None:
            found += [t for t in (saved.x, saved.y, saved.grad) if t is not None]
        return found

    def _params(self, stage: int) -> list[torch.nn.Parameter]:
        return [p for p in self.stages[stage].parameters() if p.requires_grad]

    # -- communication ---------------------------------------------------------------------------

    def send(self, instr: Instr) -> None:
        kind = carries(instr.op)
        tensor = self.tensors.pop((kind, instr.stage, instr.mb), None)
        if tensor is None:
            raise ExecutionError(f"nothing to send: {kind} of stage {instr.stage} mb {instr.mb} "
                                 "was not computed on this rank before")
        tensor = self.messages.outgoing(tensor)
        self._check_message(instr, kind, tensor)
        self.sent_bytes += tensor.numel() * tensor.element_size()
        group = self.world.channels[(self.world.plan_rank, instr.peer)]
        peer = self.world.global_rank(instr.peer)
        self.sends.append((dist.isend(tensor, peer, group=group), tensor, peer))
        self.sends = release_sent(self.sends, self._wait_sent)  # drop what has gone already

    def _check_message(self, instr: Instr, kind: str, tensor: torch.Tensor) -> None:
        """The message against the receiver's buffer (the boundary traced before step 0), on the host with
        no synchronization: a point-to-point transfer checks no byte count (NCCL), so a mismatch would
        be read as wrong values or hang."""
        shape, dtype = self.shapes[min(link_ends(instr.op, instr.stage))]
        wire = self.messages.wire_shape(shape)
        if tensor.dtype != dtype or tensor.shape != wire:
            into = peer_stage(instr.op, instr.stage)
            what = "output" if instr.op == Opcode.SEND_F else "input gradient"
            raise ExecutionError(f"stage {instr.stage}'s {what} for microbatch {instr.mb} is {_form(tensor.dtype, tensor.shape)}, "
                                 f"but stage {into} expects {_form(dtype, wire)} (the boundary traced before "
                                 "step 0): a stage must return the same dtype and shape for every microbatch")

    def _wait_sent(self, work: Any, _buffer: torch.Tensor, peer: int) -> None:
        try:
            work.wait()
        except Exception as exc:
            raise ExecutionError(f"send to rank {peer} failed, rank {peer} is probably lost: {_describe(exc)}") from exc

    def recv(self, instr: Instr) -> None:
        kind = carries(instr.op)
        shape, dtype = self.shapes[min(link_ends(instr.op, instr.stage))]  # the earlier stage's output
        buffer = torch.empty(self.messages.wire_shape(shape), dtype=dtype, device=self.world.device)
        peer = self.world.global_rank(instr.peer)
        group = self.world.channels[(instr.peer, self.world.plan_rank)]
        self.tensors[(kind, instr.stage, instr.mb)] = Pending(dist.irecv(buffer, peer, group=group),
                                                              buffer, peer, shape)

    def declared(self, instr: Instr) -> None:
        """ALL_TO_ALL, ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE: a collective the op before it issues inside
        itself (an MoE layer's dispatch and combine run in the stage's module, in this order); the plan
        declares it for the channel check, and there is nothing to run for it here."""

    def sync_grad(self, instr: Instr) -> None:
        group = tuple(sorted(instr.group))
        ranks = [self.world.global_rank(r) for r in group]
        self._all_reduce(self.stages[instr.stage].flat_grad, self.world.sync_groups[group], ranks)

    def _all_reduce(self, tensor: torch.Tensor, group: Any, ranks: list[int]) -> None:
        try:
            dist.all_reduce(tensor, group=group)
        except Exception as exc:
            raise ExecutionError(f"all-reduce over ranks {ranks} failed, one of them is probably "
                                 f"lost: {_describe(exc)}") from exc

    def step_end(self, instr: Instr) -> None:
        """Wait for sends, all-reduce over data parallelism, optimizer step, zero the gradients."""
        for sent in self.sends:
            self._wait_sent(*sent)
        self.sends.clear()
        self._check_drained()
        sync_partial_gradients(self.stages.values(), self.tp)  # sequence-parallel layer norms' parts
        if self.tied is not None:  # a tied embedding's two gradients summed (model/tied.py)
            self.tied.sum_gradients()
        if self.shards is not None and self.shards.level >= 2:  # reduce-scattered (zero.py)
            self.shards.reduce_gradients()
        elif self.buckets is not None:  # issued as each stage's gradients were final (buckets.py)
            self.buckets.wait()
        elif self.world.dp_group is not None:
            ranks = self.world.dp_ranks()
            for stage in self.stages.values():  # with --ep the routed experts' apart (exchanges.py)
                self._all_reduce(getattr(stage, "dense_grad", stage.flat_grad), self.world.dp_group, ranks)
                if getattr(stage, "expert_grad", None) is not None and self.world.expert_data_group is not None:
                    self._all_reduce(stage.expert_grad, self.world.expert_data_group, self.world.expert_data_ranks())
        if self.clip_grad is not None:
            self._clip()
        if self.before_update is not None:
            self.before_update(self)
        if self.set_lr is not None:
            self.set_lr(self.step_no)
        self.optimizer.step()
        if self.shards is not None:
            self.shards.after_step()
        if self.shards is None or self.shards.level < 2:  # level 2 and 3 free the buffers instead
            for stage in self.stages.values():
                stage.flat_grad.zero_()

    def _clip(self) -> None:
        """--clip-grad: the global norm over every stage once (its replicas and data-parallel copies hold
        the same synced gradients; under --tp a split weight's shards each once, a replicated one on
        tensor rank 0; a tied embedding's copy not at all), summed over all ranks; every gradient scaled by
        clip_coefficient."""
        square = torch.zeros((), dtype=torch.float32, device=self.world.device)
        copies = {id(p) for p in self.tied.copies} if self.tied is not None else set()  # counted as the embedding
        for s in self.clip_stages:
            if self.tp.size == 1 and not copies:
                square += self.stages[s].flat_grad.float().square().sum()
                continue
            for _, param, split in global_splits(self.stages[s]):
                if gradient(param) is not None and id(param) not in copies and (isinstance(split, Split) or self.tp.rank == 0):
                    square += gradient(param).float().square().sum()
        self._all_reduce(square, None, list(range(self.world.size)))
        factor = clip_coefficient(square, self.clip_grad)
        for stage in self.stages.values():
            stage.flat_grad.mul_(factor.to(stage.flat_grad.dtype))

    def _check_drained(self) -> None:
        carried = self.lifetimes.carried[self.step_no % len(self.programs)]
        if self.tensors or not carried.issuperset(self.saved):
            left = [f"{k[0]}{k[1]}.{k[2]}" for k in self.tensors] + \
                [f"F{s}.{m}" for s, m in self.saved if (s, m) not in carried]
            raise ExecutionError(f"the step program ends with tensors never consumed: {', '.join(left)}")

    def take_loss(self) -> torch.Tensor:
        """This rank's sum of microbatch losses for the step just run, then reset."""
        loss, self.loss_sum = self.loss_sum, torch.zeros((), device=self.world.device)
        return loss


def attach_flat_grads(stage: Stage, multiple: int = 1) -> None:
    """Give a stage one flat gradient buffer with every parameter's .grad a view into it, so gradient
    sync is one all-reduce and accumulation writes in place; its length a multiple of `multiple`
    (zeros after the gradients: the distributed optimizer's equal shards)."""
    params = [p for p in stage.parameters() if p.requires_grad]
    flat, views = flat_views(params, multiple, _grad_dtype(params))
    for p, view in zip(params, views):
        p.grad = view
    stage.flat_grad = flat


def flat_views(params: list, multiple: int, dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One zeroed flat buffer for `params`, its length a multiple of `multiple`, and a view into it
    shaped as each parameter, in order (the gradients' buffer; the distributed optimizer's weights)."""
    device = params[0].device if params else torch.device("cpu")
    total = sum(p.numel() for p in params)
    flat = torch.zeros(-(-total // multiple) * multiple, dtype=dtype, device=device)
    views, offset = [], 0
    for p in params:
        views.append(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    return flat, views


def _grad_dtype(params: list) -> torch.dtype:
    return params[0].dtype if params else torch.float32


def _describe(exc: BaseException) -> str:
    """One line: our own errors as they are, library errors as `Type: first sentence`."""
    if isinstance(exc, ExecutionError):
        return str(exc)
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip())  # gloo's "[file.cc:123] " prefix
    first = re.split(r"(?<=[.!?])\s|\n", text, maxsplit=1)[0]
    return f"{type(exc).__name__}: {first}"


def _form(dtype: torch.dtype, shape: torch.Size) -> str:
    return f"{str(dtype).removeprefix('torch.')} {list(shape)}"


def clip_coefficient(square_sum: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What the gradients are multiplied by to bring their global norm to `max_norm` at most (torch's
    clip_grad_norm_ rule: max_norm / (norm + 1e-6), at most 1)."""
    return (max_norm / (square_sum.sqrt() + 1e-6)).clamp(max=1.0)
