# Tests of the per-rank GPU memory check (runtime/process/device_memory.py, launch._check_gpus): the arithmetic
# against hand sums for a 1F1B plan, and `schedc run`'s refusal or acceptance on CUDA ranks, where the
# GPU's memory is set here (this machine has none).
from __future__ import annotations

import pytest

import schedc.runtime.process.device_memory as device_memory
import schedc.runtime.process.launch as launch
from schedc.plan import load_plan
from schedc.runtime.process.device_memory import device_refusal, in_flight, largest_rank, layer_parameters, rank_bytes
from schedc.runtime.process.options import parse_options
from schedc.runtime.model.train import held_stages
from test_runtime import plans  # noqa: F401 (fixture)

BIG = ["--layers", "32", "--hidden", "1024", "--heads", "16", "--seq", "16", "--mb-size", "1", "--vocab", "256"]


def test_in_flight_follows_the_one_f_one_b_warm_up(plans):  # noqa: F811
    plan = load_plan(plans("1f1b", p=4, m=8))
    first = [i for step in plan.ranks[0][:1] for i in step]
    last = [i for step in plan.ranks[3][:1] for i in step]
    assert (in_flight(first, 0), in_flight(last, 3)) == (4, 1)  # p - s microbatches (Narayanan et al. 2021)


def test_rank_bytes_by_hand(plans):  # noqa: F811
    path = plans("1f1b", p=4, m=8)
    plan, opts = load_plan(path), parse_options([str(path), *BIG])
    cfg = opts.model_config
    layer = 12 * 1024 ** 2 + 13 * 1024
    assert layer_parameters(1024) == layer == 12_596_224
    per_mb = 8 * 16 * 4 * 16 * 1024  # 8 layers x 16 tokens x 16 fp32 values of h
    first = 16 * (8 * layer + (256 + 16) * 1024) + 4 * per_mb  # AdamW: 16 bytes a weight; 4 in flight
    last = 16 * (8 * layer + (256 + 2) * 1024) + 1 * per_mb
    assert rank_bytes(plan, 0, [0], cfg, opts) == first == 1_650_327_552
    assert rank_bytes(plan, 3, [3], cfg, opts) == last == 1_624_932_352
    assert largest_rank(plan, cfg, opts, held_stages) == (first, 0)
    sgd = parse_options([str(path), *BIG, "--optimizer", "sgd"])
    assert rank_bytes(plan, 0, [0], cfg, sgd) == 8 * (8 * layer + (256 + 16) * 1024) + 4 * per_mb


def test_device_refusal_names_the_largest_rank(plans):  # noqa: F811
    path = plans("1f1b", p=4, m=8)
    plan, opts = load_plan(path), parse_options([str(path), *BIG])
    assert device_refusal(plan, opts.model_config, opts, held_stages, 2 ** 31) is None
    refused = device_refusal(plan, opts.model_config, opts, held_stages, 2 ** 30)
    assert refused.startswith("rank 0 would keep about 1.54 GiB on its GPU") and "the GPU's 1 GiB" in refused


@pytest.fixture
def cuda_ranks(monkeypatch):
    """Ranks on CUDA with a GPU of `memory` bytes (set by the test)."""
    monkeypatch.setattr(launch, "_runs_on_cuda", lambda opts: True)

    def with_gpu(memory: int) -> None:
        monkeypatch.setattr(device_memory, "gpu_memory", lambda: memory)
    return with_gpu


def test_run_checks_each_rank_against_its_gpu(plans, cuda_ranks):  # noqa: F811
    cuda_ranks(2 ** 30)
    with pytest.raises(launch.LaunchError, match="rank 0 would keep about 1.54 GiB on its GPU"):
        launch.check_launch(plans("1f1b", p=4, m=8), None, BIG, [])
    cuda_ranks(80 * 2 ** 30)
    launch.check_launch(plans("1f1b", p=4, m=8), None, BIG, [])


def test_a_run_too_large_for_this_host_fits_on_gpus(plans, cuda_ranks):  # noqa: F811
    """--seq 100000 is refused on CPU ranks (the whole job in this host's memory, test_runtime.py) but
    fits 80 GiB GPUs: each rank keeps its two layers' activations and no s x s scores."""
    options = ["--seq", "100000", "--steps", "1"]
    cuda_ranks(80 * 2 ** 30)
    launch.check_launch(plans("1f1b", p=2, m=4), None, options, [])
    cuda_ranks(None)  # no GPU on this machine: the ranks' machines check their own
    launch.check_launch(plans("1f1b", p=2, m=4), None, options, [])
