"""The gradient comparison of `schedc run --compare-to-reference` (schedc/runtime/compare.py), on hand-made
dumps: relative differences per tensor, the worst per group and overall, names on one side only."""
from __future__ import annotations

import pytest
import torch

from schedc.runtime.compare import compare, compare_dumps, group_of
from schedc.runtime.model.train import write_grads, write_loss


def test_groups_are_names_up_to_their_first_layer_index():
    assert group_of("blocks.3.qkv.weight") == "blocks.3"
    assert group_of("model.layers.10.mlp.up_proj.weight") == "model.layers.10"
    assert group_of("embed.tok.weight") == "embed" and group_of("lm_head.weight") == "lm_head"


def test_differences_are_relative_per_tensor_and_the_worst_is_named():
    reference = {"blocks.0.a": torch.tensor([3.0, 4.0]), "blocks.0.b": torch.tensor([1.0, 0.0]),
                 "head.w": torch.tensor([10.0])}
    run = {"blocks.0.a": torch.tensor([3.0, 4.5]),   # ||(0, 0.5)|| / ||(3, 4)|| = 0.1
           "blocks.0.b": torch.tensor([1.0, 0.0]),   # 0
           "head.w": torch.tensor([10.2])}          # 0.02
    result = compare(run, 2.02, reference, 2.0)
    assert result.loss == pytest.approx(0.01)
    assert dict(result.groups) == pytest.approx({"blocks.0": 0.1, "head": 0.02})
    assert result.worst[0] == "blocks.0.a" and result.worst[1] == pytest.approx(0.1)
    assert result.within(0.1 + 1e-9) and not result.within(0.09)
    lines = result.lines(0.05)
    assert lines[0] == "loss      1.0e-02" and lines[-1] == "NOT within --tolerance 5.0e-02"
    assert "largest gradient difference 1.0e-01 (blocks.0.a), loss 1.0e-02" in lines


def test_a_parameter_on_one_side_only_or_of_another_shape_fails():
    reference = {"a": torch.ones(2), "b": torch.ones(2)}
    result = compare({"a": torch.ones(2), "c": torch.ones(2)}, 1.0, reference, 1.0)
    assert result.missing == ("b",) and result.extra == ("c",) and not result.within(1.0)
    assert "missing from the run: b" in result.lines(1.0)
    assert compare({"a": torch.ones(3), "b": torch.ones(2)}, 1.0, reference, 1.0).worst == ("a", float("inf"))


def test_dumps_written_by_the_runtime_read_back(tmp_path):
    write_grads(str(tmp_path / "run"), {"w": torch.tensor([1.0, 1.0])})
    write_loss(str(tmp_path / "run"), 1.5)
    write_grads(str(tmp_path / "ref"), {"w": torch.tensor([1.0, 1.0])})
    write_loss(str(tmp_path / "ref"), 1.5)
    result = compare_dumps(tmp_path / "run", tmp_path / "ref")
    assert result.loss == 0.0 and result.worst == ("w", 0.0) and result.within(1e-12)
