# The process world: which plan rank, data-parallel replica, context rank and tensor rank this process
# is, the torch.distributed process group (gloo on CPU, NCCL on CUDA) and every subgroup, created up front
# in one order on all ranks. The world rank of a coordinate is schedc.layout's rank_at (tensor innermost,
# then context, then data, then pipeline; with --cp 1 Megatron-LM's order, the cost model's too), so a
# tensor group is t consecutive ranks; channels and gradient-sync groups join the ranks of one (replica,
# context rank, tensor rank), the gradient-averaging group those of one (plan rank, tensor rank), tensor
# groups those of one (plan rank, replica, context rank), context groups those of one (plan rank,
# replica, tensor rank).
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from schedc.layout import Coordinates, coordinates, rank_at
from schedc.plan import SENDS, Opcode, Plan
from ..errors import UserError


class WorldError(UserError):
    """A plan or option that does not fit the processes torchrun started."""


@dataclass(frozen=True, slots=True)
class Env:
    """What torchrun tells a process; a plain `python -m` run is rank 0 of a world of 1."""

    rank: int
    size: int
    local_rank: int

    @classmethod
    def read(cls) -> Env:
        get = os.environ.get
        return cls(int(get("RANK", 0)), int(get("WORLD_SIZE", 1)), int(get("LOCAL_RANK", 0)))


@dataclass(slots=True)
class World:
    rank: int
    size: int
    devices: int
    dp: int
    device: torch.device
    sync_groups: dict[tuple[int, ...], object] = field(default_factory=dict)
    dp_group: object | None = None
    channels: dict[tuple[int, int], object] = field(default_factory=dict)  # (src, dst) plan ranks
    tp: int = 1
    tensor_group: object | None = None  # this rank's tensor-parallel group (None for --tp 1)
    cp: int = 1
    context_group: object | None = None  # this rank's context-parallel group (None for --cp 1)
    ep: int = 1
    expert_group: object | None = None  # this rank's expert-parallel group (None for --ep 1)
    expert_data_group: object | None = None  # the ranks holding its experts (None where only it does)

    @property
    def coordinates(self) -> Coordinates:
        return coordinates(self.rank, self.tp, self.dp, self.cp)

    @property
    def plan_rank(self) -> int:
        return self.coordinates.pipeline

    @property
    def replica(self) -> int:
        return self.coordinates.data

    @property
    def tensor(self) -> int:
        return self.coordinates.tensor

    @property
    def context(self) -> int:
        return self.coordinates.context

    @property
    def lane(self) -> int:
        """This rank's place among its stage's d x cp data and context ranks (data-major): the expert
        group is the ep consecutive lanes holding it, its index there the rank's expert block."""
        return self.replica * self.cp + self.context

    def global_rank(self, plan_rank: int) -> int:
        """The rank of `plan_rank` in this rank's replica, context and tensor lane."""
        return rank_at(plan_rank, self.replica, self.tensor, self.tp, self.dp, self.context, self.cp)

    def dp_ranks(self) -> list[int]:
        """The ranks of this rank's gradient-averaging group: its plan rank and tensor rank in every replica
        (and context rank: the context ranks' gradients are parts of one sequence's)."""
        return [rank_at(self.plan_rank, d, self.tensor, self.tp, self.dp, c, self.cp)
                for d in range(self.dp) for c in range(self.cp)]

    def expert_data_ranks(self) -> list[int]:
        """The ranks holding this rank's experts: its plan and tensor rank in the lanes ep apart."""
        return [rank_at(self.plan_rank, j // self.cp, self.tensor, self.tp, self.dp, j % self.cp, self.cp)
                for j in range(self.lane % self.ep, self.dp * self.cp, self.ep)]


def world_words(dp: int, tp: int, cp: int = 1) -> str:
    """How the processes of a run are counted, in the options' words (for messages)."""
    if cp > 1:
        return f"with --tp {tp}, --cp {cp} and --dp {dp} (t x cp x p x d)"
    return f"with --dp {dp}" if tp == 1 else f"with --tp {tp} and --dp {dp} (t x p x d)"


def check_size(plan: Plan, dp: int, env: Env, tp: int = 1, cp: int = 1) -> None:
    need = plan.devices * dp * tp * cp
    if env.size != need:
        raise WorldError(f"the plan is for {plan.devices} devices; {world_words(dp, tp, cp)} it "
                         f"needs {need} processes, but {env.size} were started (torchrun --nproc-per-node "
                         f"{need}, or schedc run --nproc {need})")


def pick_device(choice: str, env: Env) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise WorldError("--device cuda, but CUDA is not available here")
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)


def start(plan: Plan, dp: int, env: Env, device: torch.device, timeout: float, tp: int = 1, cp: int = 1,
          ep: int = 1) -> World:
    """Join the process group (unless this process has joined it already: a process that runs several
    plans keeps it) and create every subgroup of the plan (sorted, identical on all ranks): one group
    per direction of every channel and per gradient-sync group in each (replica, tensor rank), one per
    data-parallel group, one per tensor group."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    wait = timedelta(seconds=timeout)
    if dist.is_initialized():
        pass
    elif "MASTER_ADDR" in os.environ:  # on CUDA bound to this rank's GPU: communicators are made eagerly
        dist.init_process_group(backend, timeout=wait, **({"device_id": device} if device.type == "cuda" else {}))
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=wait)
    world = World(dist.get_rank(), dist.get_world_size(), plan.devices, dp, device, tp=tp, cp=cp, ep=ep)
    for pair in channels(plan):
        _add_group(world.channels, pair, _per_lane(world, list(pair), wait))
    for group in sync_groups(plan):
        _add_group(world.sync_groups, group, _per_lane(world, list(group), wait))
    lanes = [(p, k) for p in range(plan.devices) for k in range(tp)]
    if dp * cp > 1:  # the gradients' all-reduce: every replica's and context rank's
        world.dp_group = _mine(world, [[rank_at(p, d, k, tp, dp, c, cp) for d in range(dp) for c in range(cp)]
                                       for p, k in lanes], wait)
    if tp > 1:
        world.tensor_group = _mine(world, [[rank_at(p, d, k, tp, dp, c, cp) for k in range(tp)]
                                           for p in range(plan.devices) for d in range(dp) for c in range(cp)], wait)
    if cp > 1:
        world.context_group = _mine(world, [[rank_at(p, d, k, tp, dp, c, cp) for c in range(cp)]
                                            for p, k in lanes for d in range(dp)], wait)
    if ep > 1:
        _expert_groups(world, lanes, wait)
    return world


def _expert_groups(world: World, lanes: list[tuple[int, int]], wait: timedelta) -> None:
    """Per (plan rank, tensor rank), its d x cp ranks in lane order cut into expert groups of ep
    consecutive ones, and the expert-data-parallel groups of the ranks ep apart (Megatron-Core's)."""
    d, c, t, ep = world.dp, world.cp, world.tp, world.ep
    ranks = [[rank_at(p, j // c, k, t, d, j % c, c) for j in range(d * c)] for p, k in lanes]
    world.expert_group = _mine(world, [line[i:i + ep] for line in ranks for i in range(0, d * c, ep)], wait)
    if d * c > ep:
        world.expert_data_group = _mine(world, [line[i::ep] for line in ranks for i in range(ep)], wait)


def warm_up(world: World) -> None:
    """One element over each direction of every channel this rank is in, before step 0: on NCCL each
    channel's communicator is made (and its buffers allocated) here, not at the first message of step 0
    after the caching allocator has reserved the device's memory. Every rank takes its channels in the
    one sorted order of (sender, receiver), so a pairwise set-up never waits in a cycle."""
    works = []
    for sender, receiver in sorted(world.channels):
        group, token = world.channels[(sender, receiver)], torch.zeros(1, device=world.device)
        if sender == world.plan_rank:
            works.append(dist.isend(token, world.global_rank(receiver), group=group))
        else:
            works.append(dist.irecv(token, world.global_rank(sender), group=group))
    for work in works:
        work.wait()


def _per_lane(world: World, plan_ranks: list[int], wait: timedelta):
    """One group of `plan_ranks` in every (data-parallel replica, context rank, tensor rank) (all ranks
    take part in creating each); the handle of this rank's, or None if it is not a member."""
    return _mine(world, [[rank_at(r, d, k, world.tp, world.dp, c, world.cp) for r in plan_ranks]
                         for d in range(world.dp) for c in range(world.cp) for k in range(world.tp)], wait)


def _mine(world: World, groups: list[list[int]], wait: timedelta):
    """Create every group (on all ranks, in order); the handle of the one holding this rank, or None."""
    mine = None
    for ranks in groups:
        handle = dist.new_group(ranks, timeout=wait)
        if world.rank in ranks:
            mine = handle
    return mine


def _add_group(table: dict, key, handle) -> None:
    if handle is not None:
        table[key] = handle


def channels(plan: Plan) -> list[tuple[int, int]]:
    """Ordered (sender, receiver) pairs of plan ranks. Each direction gets its own group, so on NCCL
    (one stream per communicator) a posted receive never holds up a send the other way."""
    pairs = {(rank, i.peer) for rank, steps in enumerate(plan.ranks) for step in steps for i in step
             if i.op in SENDS and i.peer is not None}
    return sorted(pairs)


def sync_groups(plan: Plan) -> list[tuple[int, ...]]:
    groups = {tuple(sorted(i.group)) for steps in plan.ranks for step in steps for i in step
              if i.op == Opcode.SYNC_GRAD and i.group}
    return sorted(groups)


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
