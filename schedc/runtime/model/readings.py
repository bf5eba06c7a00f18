# When a run reads its loss (--log-every): the read is a world all-reduce and one host read, the step's
# only wait for the device, so it happens every N steps, at the last, and where nothing asks for the
# loss never; a read's line gives the mean time of the steps since the read before.
from __future__ import annotations

import time


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
