# Tests of the executor's check of each pipeline message at SEND (executor.py _check_message): a stage
# whose output differs in dtype or shape from the receiver's buffer is named with its microbatch and
# both forms, on gloo, before the message leaves (a point-to-point transfer would not notice).
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from test_runtime import ENV, LAUNCH_LIMIT, plans  # noqa: F401 (fixture)
from schedc.runtime.process.launch import torchrun_command


class Widening(nn.Module):
    """Returns float64 while training (the boundary is traced under no_grad as float32): what CUDA
    autocast's fp32 norms do to a stage traced in bf16 on the host."""

    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        y = self.lin(x)
        return y.double() if torch.is_grad_enabled() else y


class Truncating(Widening):
    """Drops the last position while training: a shape the receiver does not expect."""

    def forward(self, x):
        y = self.lin(x)
        return y[:, :-1] if torch.is_grad_enabled() else y


def _model(cfg, first):
    """An embedding, `first` then plain linear layers (cfg.layers in all), a head: on two stages the
    first stage ends in `first`."""
    middle = [(f"mid{i}", first(8) if i == 0 else nn.Linear(8, 8)) for i in range(cfg.layers)]
    return [("embed", nn.Embedding(cfg.vocab, 8)), *middle, ("head", nn.Linear(8, cfg.vocab))]


def widening_model(cfg):
    return _model(cfg, Widening)


def truncating_model(cfg):
    return _model(cfg, Truncating)


@pytest.mark.slow
@pytest.mark.parametrize("builder,message", [
    ("widening_model", "stage 0's output for microbatch 0 is float64 [2, 8, 8], but stage 1 expects float32 [2, 8, 8]"),
    ("truncating_model", "stage 0's output for microbatch 0 is float32 [2, 7, 8], but stage 1 expects float32 [2, 8, 8]"),
])
def test_a_message_of_the_wrong_form_is_refused_at_send(plans, builder, message):  # noqa: F811
    command = torchrun_command(plans("gpipe", p=2, m=4), 2, [
        "--model-code", f"test_runtime_send_check:{builder}", "--layers", "2", "--seq", "8", "--vocab", "50", "--synthetic",
        "--mb-size", "2", "--optimizer", "sgd", "--steps", "1", "--quiet", "--timeout", "30"])
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=LAUNCH_LIMIT)
    assert run.returncode != 0
    assert message in run.stderr + run.stdout, run.stderr
    assert "Traceback" not in run.stderr
