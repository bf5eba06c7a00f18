# Checkpoints: every rank writes DIR/step-N/rank{r}.pt (to a temporary name, then renamed); after a
# barrier rank 0 points DIR/latest.json at step-N the same way and removes older steps, so a crash at any
# moment leaves the previous complete checkpoint in place. Batches are a function of (seed, step), so
# the step count is the data position; RNG and optimizer state are saved with the weights, and so is
# `executor.task_state`, where user task handlers keep what must survive a restart.
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist


class CheckpointError(ValueError):
    """A checkpoint that is missing or belongs to another run."""


def save(directory: str, steps_done: int, executor, identity: dict) -> None:
    root = Path(directory)
    step_dir = root / f"step-{steps_done:08d}"
    step_dir.mkdir(parents=True, exist_ok=True)
    state = {"steps_done": steps_done, "identity": identity, "rng": torch.get_rng_state(),
             "stages": {s: m.state_dict() for s, m in executor.stages.items()},
             "optimizer": executor.optimizer.state_dict(), "tasks": executor.task_state}
    _atomic_save(state, step_dir / f"rank{executor.rank}.pt")
    dist.barrier()
    if executor.rank == 0:
        _atomic_text(root / "latest.json", json.dumps({"dir": step_dir.name, "steps_done": steps_done,
                                                       **identity}, indent=1))
        for old in sorted(root.glob("step-*")):
            if old.name != step_dir.name:
                shutil.rmtree(old, ignore_errors=True)


def load(directory: str, executor, identity: dict) -> int:
    """Restore this rank's state from the latest checkpoint; return the number of steps done."""
    root = Path(directory)
    try:
        latest = json.loads((root / "latest.json").read_text())
        state = torch.load(root / latest["dir"] / f"rank{executor.rank}.pt", weights_only=False)
    except (OSError, KeyError, ValueError) as exc:
        raise CheckpointError(f"--resume {directory}: no readable checkpoint ({exc})") from None
    for key, value in identity.items():
        if state["identity"].get(key) != value:
            was, now = state["identity"].get(key), value
            if key == "plan":
                was, now = f"hash {str(was)[:12]}", f"hash {now[:12]}"
            raise CheckpointError(f"--resume {directory}: the checkpoint was made with {key} {was}, "
                                  f"this run has {key} {now}")
    for stage, module in executor.stages.items():
        module.load_state_dict(state["stages"][stage])
    executor.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    executor.task_state.update(state.get("tasks", {}))
    return state["steps_done"]


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
