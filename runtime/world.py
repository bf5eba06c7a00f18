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
    """Join the process group and create every subgroup (sorted, identical on all ranks): one group
    per direction of every channel, one per gradient-sync group, one per data-parallel group."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    wait = timedelta(seconds=timeout)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=wait)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=wait)
    world = World(dist.get_rank(), dist.get_world_size(), plan.devices, dp, device)
    for src, dst in channels(plan):
        for replica in range(dp):
            pair = [replica * plan.devices + src, replica * plan.devices + dst]
            handle = dist.new_group(pair, timeout=wait)
            if replica == world.replica and world.rank in pair:
                world.channels[(src, dst)] = handle
    for group in sync_groups(plan):
        for replica in range(dp):
            ranks = [replica * plan.devices + r for r in group]
            handle = dist.new_group(ranks, timeout=wait)
            if replica == world.replica and world.rank in ranks:
                world.sync_groups[group] = handle
    if dp > 1:
        for plan_rank in range(plan.devices):
            ranks = [d * plan.devices + plan_rank for d in range(dp)]
            handle = dist.new_group(ranks, timeout=wait)
            if world.rank in ranks:
                world.dp_group = handle
    return world


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
