"""schedc schedules as torch.distributed.pipelining schedule objects, in one line, no CSV file.

    from schedc.torch import schedule, stage_indices
    held = stage_indices("v_half", rank=pp_rank, p=4)             # the stages this rank must build
    stages = [PipelineStage(chunk(s), s, 8, device, group=pp_group) for s in held]
    pipe = schedule("v_half", stages, n_microbatches=8, loss_fn=loss_fn)
    pipe.step(tokens, target=labels, losses=losses)               # torch's own runtime runs it

The schedule (a library name or a .sched file, its params given as keywords) is compiled, checked
(deadlock, channels, memory bound) and exported as torch's compute_comms order, with the UNSHARD,
RESHARD and REDUCE_GRAD actions torch's runtime needs (schedc.interop.torch_comms); the result is
torch's `_PipelineScheduleRuntime` holding that order. This module imports torch; the compiler never
imports it.
"""
from __future__ import annotations

from .driver import compile_file
from .diagnostics import SchedError
from .interop.torch_comms import export_comms_csv
from .interop.torch_csv import export_csv
from .interop.torch_placement import rank_stages


class ScheduleError(ValueError):
    """A schedule that does not compile, or stages that do not fit it; the message says which and how."""


FORMATS = ("compute_comms", "compute_only")


def _count(name: str, value) -> int:
    if type(value) is not int or value < 1:
        raise ScheduleError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _checked(p, n_microbatches, params: dict, format: str = FORMATS[0]) -> None:
    """The arguments every entry point takes, refused by name before anything is compiled."""
    _count("p", p)
    _count("n_microbatches", n_microbatches)
    if format not in FORMATS:
        raise ScheduleError(f"format must be one of {', '.join(map(repr, FORMATS))}, got {format!r}")
    given = sorted({"p", "m"} & set(params))
    if given:
        raise ScheduleError(f"give the pipeline's size and microbatches as p= and n_microbatches=, not as the "
                            f"schedule's param{'s' * (len(given) > 1)} {', '.join(given)}")


def _compiled(file: str, p: int, n_microbatches: int, params: dict):
    defines = [f"p={p}", f"m={n_microbatches}", *(f"{k}={v}" for k, v in params.items())]
    try:
        result = compile_file(file, defines)
        if not result.ok:
            from .diagnostics import capped
            raise ScheduleError("\n".join(d.format(result.schedule.source) for d in capped(result.diagnostics)))
        export_csv(result.schedule)  # refuses what torch's format cannot hold
    except SchedError as exc:
        raise ScheduleError(exc.render()) from None
    return result


def stage_indices(file: str, rank: int, p: int, n_microbatches: int | None = None, **params) -> tuple[int, ...]:
    """The stage indices rank `rank` of a `p`-rank pipeline holds under FILE's placement (ascending);
    n_microbatches (default 2p) only matters to schedules whose placement depends on it."""
    m = 2 * p if n_microbatches is None and type(p) is int else n_microbatches
    _checked(p, m, params)
    if type(rank) is not int or not 0 <= rank < p:
        raise ScheduleError(f"rank must be an integer 0..{p - 1} (a rank of the {p}-rank pipeline), got {rank!r}")
    result = _compiled(file, p, m, params)
    return rank_stages(result.schedule.pipelines[0].placement, p)[rank]


def orders(file: str, p: int, n_microbatches: int, format: str = "compute_comms", **params) -> list[list[str]]:
    """Each rank's cells of FILE's order in torch's format ('compute_comms' or 'compute_only')."""
    _checked(p, n_microbatches, params, format)
    return _cells(_compiled(file, p, n_microbatches, params), format)


def _cells(result, format: str) -> list[list[str]]:
    text = export_comms_csv(result.plan) if format == "compute_comms" else export_csv(result.schedule)
    return [row.split(",") for row in text.splitlines()]


def schedule(file: str, stages, n_microbatches: int, loss_fn=None, *, p: int | None = None,
             format: str = "compute_comms", scale_grads: bool = True, **params):
    """torch's `_PipelineScheduleRuntime` running FILE's compiled order over `stages` (this rank's
    PipelineStages, or one). p defaults to the stages' group size; params (v=2, ...) are FILE's.
    format='compute_only' hands torch the compute cells and lets torch's own lowering add the rest.
    Raises ScheduleError naming the fault when FILE does not compile for these sizes or the stages
    are not the ones its placement gives this rank."""
    from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime
    stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
    if not stages or not all(hasattr(s, "stage_index") and hasattr(s, "group_size") for s in stages):
        raise ScheduleError(f"stages must be this rank's PipelineStage, or a non-empty list of them, got {stages!r}")
    p = stages[0].group_size if p is None else p
    _checked(p, n_microbatches, params, format)
    result = _compiled(file, p, n_microbatches, params)
    placement = result.schedule.pipelines[0].placement
    rank = stages[0].group_rank
    if stages[0].group_size != p or stages[0].num_stages != len(placement):
        raise ScheduleError(f"{result.schedule.name} with p={p} has {len(placement)} stages on {p} ranks; the "
                            f"PipelineStages say num_stages={stages[0].num_stages} on {stages[0].group_size} ranks")
    want = rank_stages(placement, p)[rank]
    have = tuple(sorted(stage.stage_index for stage in stages))
    if have != want:
        raise ScheduleError(f"{result.schedule.name} with p={p} puts stages {want} on rank {rank}, but this rank's "
                            f"PipelineStages are {have}: build them from schedc.torch.stage_indices("
                            f"{file!r}, rank={rank}, p={p})")
    actions = {r: [_Action.from_str(cell) for cell in row] for r, row in enumerate(_cells(result, format))}
    runtime = _PipelineScheduleRuntime(stages, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
    runtime._prepare_schedule_with_comms(actions, format=format)
    return runtime


__all__ = ["ScheduleError", "orders", "schedule", "stage_indices"]
