# The process world: which plan rank and data-parallel replica this process is, the torch.distributed
# process group (gloo on CPU, NCCL on CUDA) and every subgroup, created up front in one order on all
# ranks. World rank = replica * plan devices + plan rank, so each replica's pipeline is contiguous.
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from schedc.plan import SENDS, Opcode, Plan


class WorldError(ValueError):
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

    @property
    def plan_rank(self) -> int:
        return self.rank % self.devices

    @property
    def replica(self) -> int:
        return self.rank // self.devices

    def global_rank(self, plan_rank: int) -> int:
        return self.replica * self.devices + plan_rank


def check_size(plan: Plan, dp: int, env: Env) -> None:
    need = plan.devices * dp
    if env.size != need:
        raise WorldError(f"the plan is for {plan.devices} devices; with --dp {dp} it needs {need} "
                         f"processes, but {env.size} were started (torchrun --nproc-per-node {need})")


def pick_device(choice: str, env: Env) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise WorldError("--device cuda, but CUDA is not available here")
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)


def start(plan: Plan, dp: int, env: Env, device: torch.device, timeout: float) -> World:
    """Join the process group (unless this process has joined it already: a process that runs several
    plans keeps it) and create every subgroup of the plan (sorted, identical on all ranks): one group
    per direction of every channel, one per gradient-sync group, one per data-parallel group."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    wait = timedelta(seconds=timeout)
    if dist.is_initialized():
        pass
    elif "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=wait)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=wait)
    world = World(dist.get_rank(), dist.get_world_size(), plan.devices, dp, device)
    for pair in channels(plan):
        _add_group(world.channels, pair, _per_replica(world, list(pair), wait))
    for group in sync_groups(plan):
        _add_group(world.sync_groups, group, _per_replica(world, list(group), wait))
    if dp > 1:
        for plan_rank in range(plan.devices):
            ranks = [d * plan.devices + plan_rank for d in range(dp)]
            handle = dist.new_group(ranks, timeout=wait)
            world.dp_group = handle if world.rank in ranks else world.dp_group
    return world


def _per_replica(world: World, plan_ranks: list[int], wait: timedelta):
    """One group of `plan_ranks` in every data-parallel replica (all ranks take part in creating
    each); the handle of this rank's, or None if it is not a member."""
    mine = None
    for replica in range(world.dp):
        ranks = [replica * world.devices + r for r in plan_ranks]
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
