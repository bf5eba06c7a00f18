# The CPU side of the runtime's CUDA-only settings: TF32 for fp32 products (model/train.matmul_precision, on by
# default, --tf32 off for full fp32, untouched on CPU and under bf16) and the GPU's generator state in a
# checkpoint (checkpoint.cuda_rng: nothing on CPU); sent buffers released in completion order (what
# NCCL reorders). What only a GPU shows is left to scripts/gpu_check.sh.
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from schedc.runtime.model.train import matmul_precision
from schedc.runtime.execution.checkpoint import cuda_rng
from schedc.runtime.process.options import parse_options


@pytest.fixture
def flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_tf32_is_on_by_default_for_fp32_on_cuda(flags):
    assert parse_options(["plan.json"]).tf32 == "on"
    cuda = torch.device("cuda", 0)  # a device value: nothing is allocated on it
    matmul_precision(SimpleNamespace(dtype="fp32", tf32="on"), cuda)
    assert flags() == (True, True)
    matmul_precision(SimpleNamespace(dtype="fp32", tf32="off"), cuda)
    assert flags() == (False, False)
    matmul_precision(SimpleNamespace(dtype="bf16", tf32="on"), cuda)  # bf16 products: left as they were
    matmul_precision(SimpleNamespace(dtype="fp32", tf32="on"), torch.device("cpu"))  # nothing on CPU
    assert flags() == (False, False)


def test_a_cpu_checkpoint_keeps_no_gpu_generator():
    assert cuda_rng(torch.device("cpu")) == {}


class Work:
    def __init__(self, done: bool):
        self.done = done

    def is_completed(self) -> bool:
        return self.done


def test_sent_buffers_are_released_in_completion_order():
    """A send behind one still in flight is released once it completes (it used to wait for the queue's
    front): the completed are waited for in queue order, the rest kept, oldest first."""
    from collections import deque
    from schedc.runtime.execution.lifetimes import release_sent
    sends = deque([(Work(False), "a", 1), (Work(True), "b", 2), (Work(False), "c", 1), (Work(True), "d", 3)])
    freed = []
    left = release_sent(sends, lambda work, buffer, peer: freed.append((buffer, peer)))
    assert freed == [("b", 2), ("d", 3)]
    assert [buffer for _, buffer, _ in left] == ["a", "c"]
    left[0][0].done = True
    assert [b for _, b, _ in release_sent(left, lambda *entry: None)] == ["c"]
