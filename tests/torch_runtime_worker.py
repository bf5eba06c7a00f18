"""One torchrun rank: every exportable library schedule run by torch's own _PipelineScheduleRuntime
from schedc's CSVs (compute_only and compute_comms, scale_grads True and False, FSDP2 for some), from
schedc.torch.schedule, and torch's own schedule class as a control, each step's gradients compared with
one process's. Writes {case: max relative error} for rank 0 to argv[2]; argv[1] is the CSV folder
(written by tests/test_torch_runtime.py with `schedc export`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, schedules

from schedc.runtime.model.gpt import ModelConfig, Stage, build_gpt, build_pieces, lm_loss, partition

CFG = ModelConfig(layers=8, hidden=16, heads=2, seq=8, vocab=32, mb_size=2)
M = 4
CONTROLS = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
            "looped_bfs": "ScheduleLoopedBFS", "interleaved_zb": "ScheduleInterleavedZeroBubble",
            "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
FSDP = ("1f1b", "zbv", "interleaved_zb", "dualpipev")


def batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, CFG.vocab, (M * CFG.mb_size, CFG.seq), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def reference(stages: int, scale: bool) -> dict[str, torch.Tensor]:
    """One process: the whole model over the m microbatches, the loss summed (or averaged)."""
    runs = [Stage(run) for run in partition(build_pieces(build_gpt, CFG, seed=0), stages)]
    tokens, targets = batch()
    total = 0
    for x, y in zip(tokens.chunk(M), targets.chunk(M)):
        for run in runs:
            x = run(x)
        total = total + lm_loss(x, y)
    (total / M if scale else total).backward()
    return {name: p.grad for run in runs for name, p in run.global_parameters()}


def held_stages(held: tuple[int, ...], count: int, mesh):
    """Fresh copies of this rank's stages (seed 0), each wrapped with fully_shard over `mesh` if given."""
    runs = partition(build_pieces(build_gpt, CFG, seed=0), count)
    modules = []
    for s in held:
        module = Stage(runs[s])
        if mesh is not None:
            from torch.distributed.fsdp import fully_shard
            fully_shard(module, mesh=mesh)
        modules.append(module)
    return modules, [PipelineStage(mod, s, count, torch.device("cpu")) for mod, s in zip(modules, held)]


def error(modules, want: dict) -> float:
    worst = 0.0
    for module in modules:
        for name, p in module.global_parameters():
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            ref = want[name]
            worst = max(worst, float((grad - ref).abs().max() / ref.abs().max().clamp_min(1e-12)))
    return worst


def run_case(build, held, count, scale, mesh=None) -> float:
    modules, stages = held_stages(held, count, mesh)
    pipe = build(stages, scale)
    tokens, targets = batch()
    args = (tokens,) if 0 in held else ()
    pipe.step(*args, target=targets if count - 1 in held else None, losses=[])
    return error(modules, reference(count, scale))


def main() -> None:
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    dp_mesh = init_device_mesh("cpu", (p, 1), mesh_dim_names=("pp", "dp"))["dp"]
    import schedc.torch as st
    folder = Path(sys.argv[1])
    results = {}
    for info in sorted(folder.glob("*.placement.json")):
        stated = json.loads(info.read_text())
        name, fmt = info.name.split("__")[0], stated["format"]
        count = stated["stages"]
        held = tuple(stated["rank_stages"][rank])
        csv = folder / f"{info.name.split('.')[0]}.csv"
        for scale in (True, False):
            for fsdp in (False, True) if name in FSDP else (False,):
                def build(stages, scale, csv=csv, fmt=fmt):
                    pipe = schedules._PipelineScheduleRuntime(stages, M, loss_fn=lm_loss, scale_grads=scale)
                    pipe._load_csv(str(csv), format=fmt)
                    return pipe
                results[f"{name}/{fmt}/scale={scale}/fsdp={fsdp}"] = run_case(build, held, count, scale,
                                                                                  dp_mesh if fsdp else None)
        if fmt == "compute_comms":
            for scale in (True, False):
                results[f"{name}/schedc.torch/scale={scale}"] = run_case(
                    lambda stages, scale, name=name: st.schedule(name, stages, M, lm_loss, scale_grads=scale),
                    held, count, scale)
            if name in CONTROLS:
                cls = getattr(schedules, CONTROLS[name])
                single = issubclass(cls, schedules.PipelineScheduleSingle)
                results[f"{name}/torch {CONTROLS[name]}"] = run_case(
                    lambda stages, scale: cls(stages[0] if single else stages, M, loss_fn=lm_loss), held, count, True)
    if rank == 0:
        Path(sys.argv[2]).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
