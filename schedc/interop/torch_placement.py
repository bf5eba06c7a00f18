"""Which stage each rank holds, stated for torch and torchtitan and checked against a CSV's cells.

torch's `_PipelineScheduleRuntime` infers a CSV's stage-to-rank map from its cells; torchtitan builds
the stages a rank holds from `parallelism.pipeline_parallel_schedule` alone (V-shaped for
ZBVZeroBubble and DualPipeV, looped for the rest, one stage for the single-stage schedules), and
nothing cross-checks the two. The three placements:

    single  p stages, stage s on rank s                       torchtitan: "1F1B" (any single-stage name)
    loop    v·p stages, stage s on rank s % p (v >= 2)        torchtitan: "Interleaved1F1B"
    v       2p stages, rank r holds r and 2p - 1 - r          torchtitan: "ZBVZeroBubble"

`schedc export` writes them beside the CSV (FILE.placement.json, `sidecar`); `schedc check FILE.csv
--placement NAME` refuses cells that contradict one (`check_placement`).
"""
from __future__ import annotations

from pathlib import Path

from ..diagnostics import Diagnostic, Span, error
from ..text import plural
from ..ir import Schedule
from .torch_csv import MAX_SHOWN

STYLES = ("single", "loop", "v")
TORCHTITAN = {"single": "1F1B", "loop": "Interleaved1F1B", "v": "ZBVZeroBubble"}
RULE = {"single": "stage s on rank s", "loop": "stage s on rank s % p", "v": "rank r holds stages r and 2p-1-r"}


def stage_ranks(style: str, ranks: int, stages: int) -> tuple[int, ...] | str:
    """The rank of each stage under `style`, or why `stages` stages cannot be placed that way on `ranks`."""
    if style == "single":
        return tuple(range(stages)) if stages == ranks else f"the single placement needs p = {ranks} stages"
    if style == "loop":
        if stages % ranks or stages < 2 * ranks:
            return f"the loop placement needs a multiple of p = {ranks} stages, at least {2 * ranks}"
        return tuple(s % ranks for s in range(stages))
    if stages != 2 * ranks:
        return f"the v placement needs 2p = {2 * ranks} stages"
    return tuple(s if s < ranks else 2 * ranks - 1 - s for s in range(stages))


def rank_stages(placement: tuple[int, ...], ranks: int) -> list[tuple[int, ...]]:
    """The stages each rank holds, ascending: rank_stages((0, 1, 1, 0), 2) == [(0, 3), (1, 2)]."""
    return [tuple(s for s, r in enumerate(placement) if r == rank) for rank in range(ranks)]


def style_of(placement: tuple[int, ...], ranks: int) -> str | None:
    """The placement's name, or None for one torchtitan cannot build (any other map)."""
    for style in STYLES:
        if stage_ranks(style, ranks, len(placement)) == placement:
            return style
    return None


def sidecar(schedule: Schedule, csv_path: str, fmt: str) -> dict:
    """What FILE.placement.json states: the format, the sizes, each rank's stages, the placement's name
    and the torchtitan settings that build those stages."""
    placement = schedule.pipelines[0].placement
    ranks = schedule.devices
    style = style_of(placement, ranks)
    out = {"format": fmt, "schedule": schedule.name, "params": dict(schedule.params), "ranks": ranks,
           "stages": len(placement), "microbatches": schedule.microbatches, "placement": style,
           "rank_stages": [list(held) for held in rank_stages(placement, ranks)]}
    if style is None:
        out["torchtitan"] = None
        return out
    titan = {"pipeline_parallel_schedule": TORCHTITAN[style], "pipeline_parallel_schedule_csv": Path(csv_path).name}
    per_rank = len(placement) // ranks
    if per_rank not in (1, 2):
        titan["pipeline_parallel_layers_per_stage"] = (
            f"set so that (n_layers + first_stage_less_layers + last_stage_less_layers) / layers_per_stage "
            f"= {len(placement)} stages")
    if fmt == "compute_comms":
        titan["note"] = ("torchtitan loads a CSV as compute_only; load this one with "
                         "_load_csv(path, format='compute_comms') or use schedc.torch.schedule")
    out["torchtitan"] = titan
    return out


def sidecar_path(csv_path: str) -> Path:
    """x.csv -> x.placement.json, beside it."""
    path = Path(csv_path)
    return path.with_name(f"{path.stem}.placement.json")


def describe(placement: tuple[int, ...], ranks: int) -> str:
    """One line for the export's report: the placement and the torchtitan value that builds it."""
    style = style_of(placement, ranks)
    if style is None:
        return "placement: its own (not one torchtitan builds); see rank_stages"
    return f"placement: {style} ({RULE[style]}); torchtitan: pipeline_parallel_schedule = \"{TORCHTITAN[style]}\""


def check_placement(schedule: Schedule, style: str) -> list[Diagnostic]:
    """Each stage a rank runs against the stated placement, at the first of its cells (a CSV) or at the
    pipeline's declaration; sizes the placement cannot hold are one error."""
    ranks = schedule.devices
    stages = schedule.pipelines[0].stages
    expected = stage_ranks(style, ranks, stages)
    if isinstance(expected, str):
        return [error(f"--placement {style}: {expected}; this schedule has {stages} stages on {ranks} ranks",
                      schedule.pipelines[0].span or Span(1, 1, 1, 2))]
    placement = schedule.pipelines[0].placement
    if not str(schedule.source.path).endswith(".csv"):  # a declared placement: one error a stage, at it
        return [error(f"stage {s} is on rank {placement[s]}, but the {style} placement ({RULE[style]}) puts it on "
                      f"rank {expected[s]}", schedule.pipelines[0].span) for s in range(stages)
                if placement[s] != expected[s]][:MAX_SHOWN]
    off: dict[tuple[int, int], list] = {}  # (rank, stage) -> its ops, in the row's order
    for rank, order in enumerate(schedule.orders):
        for op in order:
            if 0 <= op.stage < stages and expected[op.stage] != rank:
                off.setdefault((rank, op.stage), []).append(op)
    return [error(f"{ops[0].stage}{ops[0].kind}{ops[0].mb} runs stage {stage} on rank {rank} ({plural(len(ops), 'cell')} "
                  f"of it there, the first here), but the {style} placement ({RULE[style]}) puts it on rank "
                  f"{expected[stage]}", ops[0].span) for (rank, stage), ops in off.items()][:MAX_SHOWN]
