# The host waits for the device once per step at most: the loss stays on the device between reads
# (--log-every), no .item() per microbatch, no world all-reduce on a step whose loss nobody reads.
# Counted on CPU by wrapping torch.Tensor.item and torch.distributed.all_reduce over a one-rank run;
# per step = (calls over 6 steps - calls over 3 steps) / 3, so start-up's own calls cancel.
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from schedc.runtime.__main__ import main as runtime_main
from test_runtime import plans  # noqa: F401 (fixture)

SMALL = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--mb-size", "1", "--synthetic"]


def _calls(monkeypatch, plan, steps: int, options: list[str]) -> dict[str, int]:
    counts = {"item": 0, "all_reduce": 0}
    item, all_reduce = torch.Tensor.item, dist.all_reduce

    def counted_item(self):
        counts["item"] += 1
        return item(self)

    def counted_all_reduce(*args, **kwargs):
        counts["all_reduce"] += 1
        return all_reduce(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "item", counted_item)
        patch.setattr(dist, "all_reduce", counted_all_reduce)
        assert runtime_main([str(plan), *SMALL, "--steps", str(steps), *options]) == 0
    return counts


@pytest.mark.parametrize("options,per_step", [
    ([], 1),  # the default: every step's loss read, one all-reduce and one read
    (["--quiet"], 0),  # nobody reads it: no synchronization at all
    (["--log-every", "3"], 1 / 3),
    (["--quiet", "--metrics-out", "{tmp}/metrics.jsonl", "--log-every", "3"], 2 / 3),  # + the memory peak's
])
def test_the_loss_is_read_once_per_logged_step(plans, tmp_path, monkeypatch, options, per_step):  # noqa: F811
    plan = plans("1f1b", p=1, m=4)
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    short, long = (_calls(monkeypatch, plan, n, options) for n in (3, 6))
    assert (long["all_reduce"] - short["all_reduce"]) / 3 == per_step
    assert (long["item"] - short["item"]) / 3 == per_step


def test_metrics_lines_are_the_logged_steps_with_their_windows_mean_time(plans, tmp_path):  # noqa: F811
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("a stale line\n")
    assert runtime_main([str(plans("1f1b", p=1, m=4)), *SMALL, "--steps", "7", "--quiet", "--log-every", "3",
                         "--metrics-out", str(metrics)]) == 0
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 5, 6]
    assert all(line["seconds"] > 0 and line["tokens_per_s"] == pytest.approx(8 * 4 / line["seconds"]) for line in lines)


def test_a_batch_pinned_for_the_gpu_keeps_its_rows(monkeypatch):
    """On CUDA the step's batch is pinned (train.py; on CPU it is passed as made); pinning copies
    each tensor once, the already pinned kept. Counted with a stand-in pin_memory (no GPU here)."""
    from schedc.runtime.model.data import Batch, Dataset
    batch = Dataset(8, 256, 0, True).batch(0, 2, 3)
    pinned_ids = set()

    def pin(self):
        copy = self.clone()
        pinned_ids.add(id(copy))
        return copy
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: id(self) in pinned_ids)
    once = batch.pinned()
    assert isinstance(once, Batch) and once.size == 3 and len(pinned_ids) == 2
    assert torch.equal(once.tokens, batch.tokens) and torch.equal(once.targets, batch.targets)
    again = once.pinned()
    assert again.tokens is once.tokens and again.targets is once.targets and len(pinned_ids) == 2
