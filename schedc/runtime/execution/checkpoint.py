# Checkpoints: every rank writes DIR/step-N/rank{r}.pt (to a temporary name, then renamed) and tells
# the others its SHA-256; rank 0 then points DIR/latest.json at step-N, with every rank file's checksum,
# the same way, and removes older steps, so a crash at any moment leaves the previous complete
# checkpoint in place. Resuming checks every rank's file against latest.json before any state is
# loaded: a missing or corrupt file is refused on every rank, naming it. Batches are a function of
# (seed, step), so the step count is the data position; RNG and optimizer state are saved with the
# weights, and so is `executor.task_state`, where user task handlers keep what must survive a restart.
from __future__ import annotations

import errno
import hashlib
import io
import json
import re
import os
import shutil
from dataclasses import fields
from pathlib import Path

import torch
import torch.distributed as dist
from ..errors import UserError


class CheckpointError(UserError):
    """A checkpoint that is missing, corrupt or belongs to another run, or a directory it cannot go to."""


def check_writable(directory: str) -> None:
    """Before step 0: --save DIR can be made and written (a probe file is written and removed)."""
    root = Path(directory)
    probe = root / f".schedc-probe-{os.getpid()}"
    try:
        if root.exists() and not root.is_dir():
            raise CheckpointError(f"--save {directory}: not a directory")
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"schedc")
    except OSError as exc:
        raise CheckpointError(f"--save {directory}: cannot write checkpoints there ({_why(exc)})") from None
    finally:
        _remove(probe)


def identity(plan_hash: str, world: int, opts) -> dict:
    """What a checkpoint belongs to: the plan, the world and its layout, the seed, how the optimizer
    state is kept, and the model (its sizes and its code): a run of another resumes nothing."""
    cfg = opts.model_config
    return {"plan": plan_hash, "world": world, "dp": opts.dp, "tp": opts.tp, "seed": opts.seed,
            "distributed_optimizer": bool(opts.distributed_optimizer and opts.dp > 1),
            "optimizer": opts.optimizer, "zero": getattr(opts, "zero", 0), "cp": getattr(opts, "cp", 1),
            "stage_layers": ",".join(map(str, opts.stage_layers)) if opts.stage_layers else "even",
            "account_for_embedding": bool(opts.account_for_embedding), "account_for_loss": bool(opts.account_for_loss),
            "model": {"code": opts.model_code or "gpt", **{f.name: getattr(cfg, f.name) for f in fields(cfg)
                                                             if f.name not in ("mb_size", "extra")}}}


def differences(made: dict, now: dict) -> list[str]:
    """What differs between a checkpoint's identity and this run's, in words (a key the checkpoint does
    not record, an older schedc's, is not compared)."""
    found = []
    for key, value in now.items():
        was = made.get(key)
        if was is None or was == value:
            continue
        if key == "model" and isinstance(was, dict):
            found += [f"model {k} {was[k]!r} (this run: {v!r})" for k, v in value.items() if k in was and was[k] != v]
        elif key == "plan":
            found.append(f"plan hash {str(was)[:12]} (this run: {str(value)[:12]}, another schedule or size)")
        else:
            found.append(f"{key} {was!r} (this run: {value!r})")
    return found


def check_same_run(directory: str, latest: dict, now: dict) -> None:
    """Before torchrun: --resume DIR's checkpoint is of this run's plan, model and layout, or refused
    naming everything that differs."""
    found = differences(latest, now)
    if found:
        raise CheckpointError(f"--resume {directory}: the checkpoint is of another run: it was made with "
                              + "; ".join(found))


def check_save_over(directory: str, resume: str | None, overwrite: bool) -> None:
    """--save DIR over a checkpoint already there (another run's, or this one's from the start) would
    replace it at the first save: refused unless --overwrite, or unless --resume continues it."""
    root = Path(directory)
    if overwrite or not (root / "latest.json").is_file():
        return
    if resume is not None and Path(resume).resolve() == root.resolve():
        return
    try:
        latest = json.loads((root / "latest.json").read_text())
        done = latest.get("steps_done", "?")
        what = f"{done} step{'' if done == 1 else 's'} done, plan hash {str(latest.get('plan', '?'))[:12]}"
    except (OSError, ValueError, AttributeError):
        what = "latest.json unreadable"
    raise CheckpointError(f"--save {directory}: the directory holds a checkpoint ({what}) that this run "
                          f"would replace: give --overwrite to replace it, --resume {directory} to continue it, "
                          "or another directory")


def save(directory: str, steps_done: int, executor, identity: dict) -> None:
    root = Path(directory)
    step_dir = root / f"step-{steps_done:08d}"
    name = f"rank{executor.rank}.pt"
    state = {"steps_done": steps_done, "identity": identity, "rng": torch.get_rng_state(),
             **cuda_rng(executor.world.device),
             "stages": {s: m.state_dict() for s, m in executor.stages.items()},
             "optimizer": executor.optimizer.state_dict(), "tasks": executor.task_state}
    if executor.shards is not None and executor.shards.level == 0:  # --dtype bf16-main's fp32 main weights
        state["main"] = [main.detach().cpu() for main in executor.shards.parameters()]
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    failure = None
    try:
        step_dir.mkdir(parents=True, exist_ok=True)
        _atomic_bytes(step_dir / name, data)
        if executor.rank == 0:
            _atomic_bytes(step_dir / MARKER, b"written by schedc's runtime: removed when a later step is saved\n")
    except OSError as exc:
        failure = f"--save {directory}: cannot write {step_dir.name}/{name} (rank {executor.rank}): {_why(exc)}"
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, (name, hashlib.sha256(data).hexdigest(), failure))  # also the barrier
    failures = [f for _, _, f in digests if f]
    if failures:
        _remove(step_dir / name)
        raise CheckpointError(failures[0] + (f" (and {len(failures) - 1} more ranks)" if len(failures) > 1 else ""))
    if executor.rank == 0:
        latest = {"dir": step_dir.name, "steps_done": steps_done, **identity,
                  "files": {n: digest for n, digest, _ in digests}}
        try:
            _atomic_bytes(root / "latest.json", (json.dumps(latest, indent=1) + "\n").encode())
        except OSError as exc:
            raise CheckpointError(f"--save {directory}: cannot write latest.json: {_why(exc)}") from None
        for old in sorted(root.glob("step-*")):
            if old.name != step_dir.name and is_checkpoint_step(old):
                shutil.rmtree(old, ignore_errors=True)


MARKER = "schedc-checkpoint"  # in every step folder schedc writes: it prunes only folders that have it
STEP_NAME = re.compile(r"step-\d{8}")


def is_checkpoint_step(folder: Path) -> bool:
    """A step folder schedc wrote (its name step-NNNNNNNN and its marker inside): the only kind of
    folder a save removes; a user's `step-plots/` beside the checkpoints stays."""
    return bool(STEP_NAME.fullmatch(folder.name)) and (folder / MARKER).is_file()


def check_resumable(directory: str, world: int | None = None, ranks=None) -> dict:
    """latest.json of --resume DIR, with the files of `ranks` (default: all `world`) present and
    matching their checksums; CheckpointError naming the first that is not."""
    root = Path(directory)
    try:
        latest = json.loads((root / "latest.json").read_text())
        step, files = latest["dir"], latest.get("files")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"--resume {directory}: no readable checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(files, dict) or not isinstance(step, str):
        raise CheckpointError(f"--resume {directory}: latest.json lists no checksums (made by an older schedc?)")
    if world is not None and latest.get("world") not in (None, world):
        raise CheckpointError(f"--resume {directory}: the checkpoint was made with world {latest.get('world')}, "
                              f"this run has world {world}")
    for rank in (range(world) if ranks is None else ranks):
        name = f"rank{rank}.pt"
        path = root / step / name
        if name not in files:
            raise CheckpointError(f"--resume {directory}: latest.json has no checksum for {step}/{name}")
        try:
            digest = _sha256(path)
        except OSError as exc:
            raise CheckpointError(f"--resume {directory}: {step}/{name} is missing or unreadable ({_why(exc)})") from None
        if digest != files[name]:
            raise CheckpointError(f"--resume {directory}: {step}/{name} is corrupt (its SHA-256 is not the one "
                                  "latest.json recorded)")
    return latest


def check_same_optimizer(directory: str, latest: dict, opts) -> None:
    """A checkpoint's optimizer state is whole or a rank's shard (--distributed-optimizer): it resumes only
    a run that keeps it the same way."""
    sharded = bool(opts.distributed_optimizer and opts.dp > 1)
    if bool(latest.get("distributed_optimizer", False)) != sharded:
        made = "with" if latest.get("distributed_optimizer") else "without"
        raise CheckpointError(f"--resume {directory}: the checkpoint was made {made} --distributed-optimizer "
                              f"(each rank's optimizer state {'a shard' if made == 'with' else 'whole'}); give "
                              f"the same to resume it")


def check_steps_left(directory: str, steps_done: int, steps: int) -> None:
    """--steps counts the run's steps from the first, not those after the checkpoint: one at or below
    the steps done would run nothing."""
    if steps_done >= steps:
        raise CheckpointError(f"--resume {directory}: the checkpoint has {steps_done} steps done, and --steps "
                              f"{steps} counts the run's steps from the first: nothing is left to run (give "
                              f"--steps {steps_done + 1} or more to go on)")


def load(directory: str, executor, identity: dict) -> int:
    """Restore this rank's state from the latest checkpoint; return the number of steps done. Every
    rank checks its own file, and all learn of any failure, so a missing rank1.pt is named by rank 0."""
    failure = None
    try:
        latest = check_resumable(directory, ranks=[executor.rank])
    except CheckpointError as exc:
        failure = str(exc)
    verdicts = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, failure)
    failed = next((v for v in verdicts if v), None)
    if failed:
        raise CheckpointError(failed)
    root = Path(directory)
    try:
        # onto the host, whatever GPU saved it: load_state_dict copies to this rank's device
        state = torch.load(root / latest["dir"] / f"rank{executor.rank}.pt", map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"--resume {directory}: cannot load rank{executor.rank}.pt ({exc})") from None
    found = differences(state["identity"], identity)
    if found:
        raise CheckpointError(f"--resume {directory}: the checkpoint is of another run: it was made with "
                              + "; ".join(found))
    for stage, module in executor.stages.items():
        module.load_state_dict(state["stages"][stage])
    if executor.shards is not None and executor.shards.level == 0:  # bf16-main: the main weights it saved
        executor.shards.refresh(state.get("main"))
    elif executor.shards is not None:  # the distributed optimizer's shards: from the weights just loaded
        executor.shards.refresh()
    executor.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and executor.world.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"], executor.world.device)
    executor.task_state.update(state.get("tasks", {}))
    return state["steps_done"]


def _atomic_bytes(path: Path, data: bytes) -> None:
    """Write path through a temporary file renamed over it; the temporary is removed if writing fails."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        tmp.replace(path)
    finally:
        _remove(tmp)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _why(exc: OSError) -> str:
    return "no space left on the device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def cuda_rng(device: torch.device) -> dict:
    """{"cuda_rng": the generator state of this rank's GPU} on CUDA (dropout draws there), else {}."""
    return {"cuda_rng": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {}
