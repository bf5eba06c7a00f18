# When a run reads its loss (--log-every): the read is a world all-reduce and one host read, the step's
# only wait for the device, so it happens every N steps, at the last, and where nothing asks for the
# loss never; a read's line gives the mean time of the steps since the read before.
from __future__ import annotations

import json
import time
from pathlib import Path


def logged(opts, step: int, first: int) -> bool:
    """Whether the loss is read after `step`: every --log-every steps and at the last, where a line or
    --metrics-out takes it, and at the first with --save-grads (its loss.json); the same on every rank
    (the read is collective). Between reads the losses stay on the device, unread."""
    if step == first and opts.save_grads:
        return True
    if opts.quiet and not opts.metrics_out:
        return False
    return (step + 1 - first) % opts.log_every == 0 or step + 1 == opts.steps


class Window:
    """The steps since the last read: `mean(step)` their mean seconds at a read after `step`, `restart`
    once the read's bookkeeping (its line, a checkpoint) is done."""

    def __init__(self, first: int):
        self.begin, self.since = time.perf_counter(), first

    def mean(self, step: int) -> float:
        return (time.perf_counter() - self.begin) / (step + 1 - self.since)

    def restart(self, step: int) -> None:
        self.begin, self.since = time.perf_counter(), step + 1


def log_step(opts, step: int, loss: float, seconds: float, tokens: int, extra: dict | None = None) -> None:
    """Rank 0's per-step line, and its JSON line in --metrics-out (truncated at the first line), with
    `extra` fields (the pipelined run's peak saved bytes)."""
    if not opts.quiet:
        print(step_line(step, loss, seconds, tokens), flush=True)
    if opts.metrics_out:
        record = {"step": step, "loss": loss, "seconds": seconds, "tokens_per_s": tokens / seconds, **(extra or {})}
        Path(opts.metrics_out).parent.mkdir(parents=True, exist_ok=True)  # a missing folder is made, as for every output
        with open(opts.metrics_out, "a" if getattr(opts, "metrics_begun", False) else "w") as handle:
            handle.write(json.dumps(record) + "\n")
        opts.metrics_begun = True  # the run's first line truncates the file (with --log-every, not step 0's)


def step_line(step: int, loss: float, seconds: float, tokens: int) -> str:
    return (f"step {step:5d}  loss {loss:.6f}  time {seconds * 1e3:8.1f} ms  "
            f"{tokens / seconds:10.0f} tokens/s")
