# Tests of the runtime's placed recomputation (R) and activation offload (O, L), schedc/runtime/execution/placed.py,
# in one process: an offloaded forward's saved storages leave the device at O (the saved-bytes meter
# sees them go) and come back at L, the backward then exact to the bit; a backward before L is refused;
# R draws its forward's dropout masks again (the plain order's gradients to the bit, and not without the
# saved RNG state); plans whose placed ops the runtime cannot run are refused before any process starts.
# The runs on 2 and 4 ranks against the one-process reference, and their measured memory, are in
# test_runtime_memory.py's launches.
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from schedc.costmodel.activations import RUNTIME_GPT, stage_bytes
from schedc.plan import load_plan
from schedc.plan.write import write_plan
from schedc.runtime.__main__ import main as runtime_main
from test_runtime import _dump, plans  # noqa: F401 (plans: the session's compiled plans)
from test_runtime_memory import compile_fixture, input_bytes, offload_kept, runtime_sizes, walked_peak

SMALL = ["--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]


def _blocks():
    """Two GPT blocks as a middle stage, from one seed, and an input and output gradient for them."""
    from schedc.runtime.model.gpt import ModelConfig, Stage, build_gpt
    torch.manual_seed(0)
    stage = Stage(build_gpt(ModelConfig(layers=2, hidden=32, heads=2, seq=16, vocab=256, mb_size=2))[1:-1])
    return stage, torch.randn(2, 16, 32), torch.randn(2, 16, 32)


def _offloaded_forward(stage, x0):
    """The stage's forward as an offloaded F runs it: under the meter (state (1, 0)), its saved tensors
    in a Store that keeps the input's storage on the device."""
    from schedc.runtime.execution.memory import SavedBytes
    from schedc.runtime.execution.placed import Store, _unpack
    meter = SavedBytes({p.untyped_storage().data_ptr() for p in stage.parameters()})
    x = x0.clone().requires_grad_()
    store = Store((1, 0), {p.untyped_storage().data_ptr() for p in stage.parameters()})
    with meter.recording((1, 0)), torch.autograd.graph.saved_tensors_hooks(store.pack, _unpack):
        y = stage(x)
    store.kept.add(x.untyped_storage().data_ptr())
    return meter, store, x, y


def test_an_offloaded_state_leaves_the_device_at_o_and_comes_back_at_l():
    """O: the meter's live bytes fall to the input's alone (the storages are freed, not only copied);
    L: back to what the forward saved; the backward's gradients equal a plain run's to the bit."""
    from schedc.runtime.execution.placed import Copier
    stage, x0, grad = _blocks()
    x = x0.clone().requires_grad_()
    stage(x).backward(grad)
    want = [p.grad.clone() for p in stage.parameters()] + [x.grad]
    stage.zero_grad()
    meter, store, x, y = _offloaded_forward(stage, x0)
    saved = meter.live_bytes
    assert saved == meter.per_state[(1, 0)] > 10 * x0.numel() * 4
    copier = Copier(torch.device("cpu"), 1)
    store.offload(copier)
    assert meter.live_bytes == x0.numel() * 4  # the input: the leaf the input gradient lands on
    assert sum(host.numel() for host, _, _ in store.moved) == saved - x0.numel() * 4
    meter.add((1, 0), store.reload(copier))
    assert meter.live_bytes == saved and meter.peak_bytes == saved
    y.backward(grad)
    got = [p.grad for p in stage.parameters()] + [x.grad]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    meter.release((1, 0))
    assert meter.live_bytes == 0


def test_a_backward_before_the_reload_is_refused():
    from schedc.runtime.execution.placed import Copier, OffloadError
    stage, x0, grad = _blocks()
    _, store, _, y = _offloaded_forward(stage, x0)
    store.offload(Copier(torch.device("cpu"), 1))
    with pytest.raises(OffloadError, match="the backward of stage 1 microbatch 0 reads a saved tensor that O "
                                           "moved to host memory and no L brought back"):
        y.backward(grad)


class Noisy(nn.Module):
    """x + dropout(gelu(W x)), dropping half."""

    def __init__(self, width: int):
        super().__init__()
        self.fc, self.drop = nn.Linear(width, width), nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.nn.functional.gelu(self.fc(x)))


def dropout_model(cfg):
    """--model-code test_runtime_placed:dropout_model: an embedding, cfg.layers Noisy blocks, a head."""
    blocks = [(f"blocks.{i}", Noisy(cfg.hidden)) for i in range(cfg.layers)]
    return [("embed", nn.Embedding(cfg.vocab, cfg.hidden)), *blocks, ("head", nn.Linear(cfg.hidden, cfg.vocab))]


def _run(plan: Path, out: Path, *options: str) -> tuple[float, dict]:
    code = runtime_main([str(plan), *SMALL, "--model-code", "test_runtime_placed:dropout_model", "--steps", "1",
                         "--quiet", "--save-grads", str(out), *options])
    assert code == 0
    return _dump(out)


def test_r_draws_its_forwards_dropout_masks_again(plans, tmp_path, monkeypatch):  # noqa: F811
    """Interleaved 1F1B over two stages on one device, dropout in every block: with R placed before
    each backward (each F run without a graph) the loss and gradients are the plain order's to the
    bit, in fp32 and under bf16 autocast; R without the forward's RNG state draws other masks, R
    without its autocast runs in fp32 (each caught here)."""
    from schedc.runtime.execution import recompute
    errors = {}
    for dtype in ("fp32", "bf16"):
        options = ["--dtype", dtype]
        want = _run(plans("interleaved_1f1b", p=1, v=2, m=4), tmp_path / f"plain_{dtype}", *options)
        got = _run(plans("interleaved_1f1b_recompute", p=1, v=2, m=4), tmp_path / f"placed_{dtype}", *options)
        assert got[0] == want[0] and sorted(got[1]) == sorted(want[1])
        assert all(torch.equal(got[1][name], grad) for name, grad in want[1].items()), dtype
    restored = recompute.RunState.restored
    for field, dtype in (("rng", "fp32"), ("autocast", "bf16")):  # each left as it is at R
        monkeypatch.setattr(recompute.RunState, "restored", lambda state, field=field: restored(without(state, field)))
        other = _run(plans("interleaved_1f1b_recompute", p=1, v=2, m=4), tmp_path / f"no_{field}", "--dtype", dtype)
        want = _dump(tmp_path / f"plain_{dtype}")
        assert other[0] == want[0]  # the F counts the loss
        errors[field] = max(((other[1][n] - g).norm() / g.norm()).item() for n, g in want[1].items())
    assert errors["rng"] > 1e-2 and errors["autocast"] > 1e-4, errors


def without(state, field: str):
    """The RunState with the RNG or autocast state of the moment in place of the forward's."""
    if field == "rng":
        state.rng = torch.get_rng_state()
    else:
        state.autocast = ("cpu", torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    return state


def _one_device(tmp_path: Path, fixture: str) -> tuple[Path, dict]:
    """A fixture's plan run on one device against the one-process reference (loss and every gradient
    within rel 1e-5); the plan and the run's measured memory."""
    plan = compile_fixture(tmp_path, fixture)
    options = [*SMALL, "--steps", "1", "--quiet"]
    assert runtime_main([str(plan), *options, "--save-grads", str(tmp_path / "got"),
                         "--report-out", str(tmp_path / "report.json")]) == 0
    assert runtime_main([str(plan), "--reference", *options, "--save-grads", str(tmp_path / "ref")]) == 0
    (loss, grads), (ref_loss, ref_grads) = _dump(tmp_path / "got"), _dump(tmp_path / "ref")
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    assert max(((grads[n] - r).norm() / r.norm()).item() for n, r in ref_grads.items()) <= 1e-5
    return plan, json.loads((tmp_path / "report.json").read_text())["memory"]


def test_offload_on_one_device_gives_the_reference_and_frees_at_o(tmp_path):
    """Two stages on one device (tests/fixtures/offload/one_device.sched), every forward offloaded, one
    stage's input the other's output: the reference's loss and gradients; the measured peak of saved
    bytes is the walk's over the program, each state's full bytes those of schedc/costmodel/activations.py's
    table for the runtime's GPT."""
    plan, memory = _one_device(tmp_path, "tests/fixtures/offload/one_device.sched")
    full = {s: stage_bytes(runtime_sizes(SMALL), RUNTIME_GPT, 1, s == 0, s == 1) for s in range(2)}
    want = walked_peak(load_plan(plan).ranks[0][0], full, {s: offload_kept(SMALL, s, 1) for s in range(2)})
    assert memory["ranks"][0]["peak_saved_bytes"] == want < 2 * (full[0] + full[1])  # without O: all 4 states


def test_r_before_a_split_backward_gives_the_reference(tmp_path):
    """Two stages on one device with I and W (tests/fixtures/recompute/split_one_device.sched): R
    rebuilds the graph that I and then W read, stage 0's first piece run apart as a split backward
    runs it; the reference's loss and gradients; the peak is the walk's (each F keeps its input, R
    rebuilds one state, W frees it)."""
    plan, memory = _one_device(tmp_path, "tests/fixtures/recompute/split_one_device.sched")
    full = {s: stage_bytes(runtime_sizes(SMALL), RUNTIME_GPT, 1, s == 0, s == 1) for s in range(2)}
    want = walked_peak(load_plan(plan).ranks[0][0], full, {s: input_bytes(SMALL, s) for s in range(2)})
    assert memory["ranks"][0]["peak_saved_bytes"] == want == full[1] + 2 * input_bytes(SMALL, 0) + input_bytes(SMALL, 1)


REFUSED = {"drop_reload": "B stage=0 mb=1 pipe=0 comes before the L of its stage and microbatch",
           "unknown_op": "the plan uses task 'Z', which has no handler here",
           "recompute_full": "the plan places recomputation (R) or offload (O, L), which run with --recompute none"}


@pytest.mark.parametrize("edit", sorted(REFUSED))
def test_placed_ops_the_runtime_cannot_run_are_refused(plans, tmp_path, capsys, monkeypatch, edit):  # noqa: F811
    """Before any process starts: a backward whose L is gone, an op the runtime does not know in
    place of an O, a placed plan with --recompute full."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    plan = load_plan(plans("offload_1f1b", p=2, m=4))
    program = list(plan.ranks[0][0])
    at = {i.op: n for n, i in enumerate(program) if i.mb == 1 and i.op in ("O", "L")}
    if edit in ("drop_reload", "unknown_op"):
        del program[at["L"]]
    if edit == "unknown_op":
        program[at["O"]] = program[at["O"]]._replace(op="Z")
    write_plan(replace(plan, ranks=((tuple(program),), plan.ranks[1])), tmp_path)
    extra = ["--recompute", "full"] if edit == "recompute_full" else []
    assert runtime_main([str(tmp_path / "plan.json"), *SMALL, *extra]) == 1
    assert REFUSED[edit] in capsys.readouterr().err
