"""One torchrun rank of four: a pp x dp mesh of 2 x 2, each pipeline rank's stages wrapped with FSDP2's
fully_shard over its data-parallel pair (reshard_after_forward as the export was made for), torch's own
_PipelineScheduleRuntime running schedc's compute_comms CSV whose UNSHARD/RESHARD cells --zero 3's rule
placed; each replica trains on its own microbatches, and the gradients (FSDP2's reduce-scatter, the mean
over the replicas) are compared with one process's over both replicas' microbatches. Writes {case: max
relative error} for rank 0 to argv[2]; argv[1] is the CSV folder (tests/test_torch_runtime.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, schedules

from schedc.runtime.model.gpt import Stage, build_gpt, build_pieces, lm_loss, partition
from torch_runtime_worker import CFG, M, error

DP = 2


def batch(replica: int):
    g = torch.Generator().manual_seed(1 + replica)
    tokens = torch.randint(0, CFG.vocab, (M * CFG.mb_size, CFG.seq), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def reference(stages: int) -> dict[str, torch.Tensor]:
    """One process: the whole model over both replicas' microbatches, the loss averaged over all."""
    runs = [Stage(run) for run in partition(build_pieces(build_gpt, CFG, seed=0), stages)]
    total = 0
    for replica in range(DP):
        tokens, targets = batch(replica)
        for x, y in zip(tokens.chunk(M), targets.chunk(M)):
            for run in runs:
                x = run(x)
            total = total + lm_loss(x, y)
    (total / (M * DP)).backward()
    return {name: p.grad for run in runs for name, p in run.global_parameters()}


def run_case(csv: Path, held: tuple[int, ...], count: int, reshard: bool, mesh) -> float:
    from torch.distributed.fsdp import fully_shard
    runs = partition(build_pieces(build_gpt, CFG, seed=0), count)
    modules = []
    for s in held:
        module = Stage(runs[s])
        fully_shard(module, mesh=mesh["dp"], reshard_after_forward=reshard)
        modules.append(module)
    stages = [PipelineStage(mod, s, count, torch.device("cpu"), group=mesh.get_group("pp"))
              for mod, s in zip(modules, held)]
    pipe = schedules._PipelineScheduleRuntime(stages, M, loss_fn=lm_loss, scale_grads=True)
    pipe._load_csv(str(csv), format="compute_comms")
    tokens, targets = batch(mesh.get_local_rank("dp"))
    pipe.step(*((tokens,) if 0 in held else ()), target=targets if count - 1 in held else None, losses=[])
    return error(modules, reference(count))


def main() -> None:
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, DP), mesh_dim_names=("pp", "dp"))
    pp_rank = mesh.get_local_rank("pp")
    folder = Path(sys.argv[1])
    results = {}
    for info in sorted(folder.glob("*.placement.json")):
        stated = json.loads(info.read_text())
        name = info.name.split(".")[0]
        reshard = name.endswith("__reshard")
        held = tuple(stated["rank_stages"][pp_rank])
        results[name] = run_case(folder / f"{name}.csv", held, stated["stages"], reshard, mesh)
    if dist.get_rank() == 0:
        Path(sys.argv[2]).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
