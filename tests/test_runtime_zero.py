# Tests of ZeRO stages 2 and 3 in the runtime (schedc/runtime/model/zero.py): the gradients and the losses of
# three AdamW steps against the one-process reference, under 1F1B, ZB-H1 and interleaved 1F1B at d = 2,
# both resharding modes; the measured parameter bytes against hand arithmetic over the GPT's parameter
# counts; the options refused before any process starts.
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from schedc.runtime.__main__ import main as runtime_main
from schedc.runtime.process.options import OptionError, parse_options
from schedc.runtime.model.sharding import flatten_weights
from test_runtime import _dump, launch_plans, plans  # noqa: F401 (fixtures)
from test_runtime_training import TOLERANCE, _errors, _losses, _reference

HIDDEN, VOCAB, SEQ = 32, 256, 16
MODEL = ["--layers", "4", "--hidden", str(HIDDEN), "--heads", "2", "--seq", str(SEQ), "--mb-size", "2"]
BLOCK = 12 * HIDDEN ** 2 + 13 * HIDDEN  # qkv, proj, fc, out (weights and biases) and two layer norms
EMBED = (VOCAB + SEQ) * HIDDEN          # token and learned position tables
HEAD = 2 * HIDDEN + VOCAB * HIDDEN      # the final layer norm and the output projection
# weights per stage held by each plan rank, from the split of 4 layers (hand arithmetic)
HELD = {"1f1b": [[EMBED + 2 * BLOCK], [2 * BLOCK + HEAD]],
        "zb_h1": [[EMBED + 2 * BLOCK], [2 * BLOCK + HEAD]],
        "interleaved_1f1b": [[EMBED + BLOCK, BLOCK], [BLOCK, BLOCK + HEAD]]}
PARAMS = {"1f1b": {"p": 2, "m": 4}, "zb_h1": {"p": 2, "m": 4}, "interleaved_1f1b": {"p": 2, "v": 2, "m": 4}}
MODES = {"zero2": ["--zero", "2"], "zero3": ["--zero", "3"],
         "zero3_kept": ["--zero", "3", "--no-reshard-after-forward"]}


def expected_parameter_bytes(counts: list[int], d: int, mode: str) -> int:
    """A rank's peak weight bytes (fp32): every stage padded to a multiple of d; its 1/d shards (the
    optimizer's weights), plus the whole stages (ZeRO-2), the largest one stage while it computes
    (ZeRO-3 resharding after each op), or all of them to the step's end (ZeRO-3 without)."""
    padded = [-(-n // d) * d for n in counts]
    shards = sum(n // d for n in padded)
    held = max(padded) if mode == "zero3" else sum(padded)
    return 4 * (shards + held)


@pytest.mark.slow
def test_zero_2_and_3_give_the_reference(plans, tmp_path):  # noqa: F811
    """One 4-rank launch (p = 2, d = 2), nine runs of three AdamW steps: ZeRO-2, ZeRO-3 resharding after
    every op and ZeRO-3 keeping the weights to the step's end, each under 1F1B, ZB-H1 and interleaved
    1F1B. The first step's gradients (gathered whole from the reduce-scattered shards) and all three
    losses (the second and third after the sharded AdamW's updates) are the reference's, rel <= 1e-5;
    each rank's measured peak parameter bytes are the hand arithmetic's to the byte."""
    jobs, names = [], []
    for schedule, params in PARAMS.items():
        for mode, options in MODES.items():
            name = f"{schedule}_{mode}"
            names.append((name, schedule, mode))
            jobs.append((plans(schedule, **params), [*MODEL, *options, "--dp", "2", "--steps", "3", "--quiet",
                                                     "--save-grads", str(tmp_path / name), "--report-out",
                                                     str(tmp_path / f"{name}.json"), "--metrics-out",
                                                     str(tmp_path / name / "metrics.jsonl")]))
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr
    for name, schedule, mode in names:
        want, want_losses = _reference(tmp_path, name, plans(schedule, **PARAMS[schedule]),
                                       [*MODEL, "--steps", "3"], 2)
        loss, grads = _errors(_dump(tmp_path / name), want)
        assert loss <= TOLERANCE and grads <= TOLERANCE, (name, loss, grads)
        assert _losses(tmp_path / name / "metrics.jsonl") == pytest.approx(want_losses, rel=TOLERANCE), name
        ranks = json.loads((tmp_path / f"{name}.json").read_text())["memory"]["ranks"]
        measured = [rank["parameter_bytes"] for rank in ranks]
        want_bytes = [expected_parameter_bytes(HELD[schedule][rank["plan_rank"]], 2, mode) for rank in ranks]
        assert sorted(rank["plan_rank"] for rank in ranks) == [0, 0, 1, 1]
        assert measured == want_bytes, (name, measured, want_bytes)


def test_the_hand_counts_are_the_models():
    """The counts the byte test is held to are those of the GPT the runtime builds (2 layers: embedding,
    two blocks, head)."""
    from schedc.runtime.model.train import model_pieces
    opts = parse_options(["plan.json", *MODEL])
    pieces = dict(model_pieces(opts))
    count = {name: sum(p.numel() for p in piece.parameters()) for name, piece in pieces.items()}
    assert (count["embed"], count["blocks.0"], count["head"]) == (EMBED, BLOCK, HEAD)


def test_a_stage_is_flattened_into_equal_padded_shards():
    """Three weights of 3, 2 and 2 elements, d = 2: one buffer of 8 (one zero of padding), each weight a
    view into it, so the shards are [w0 w0 w0 w1] and [w1 w2 w2 0]."""
    stage = torch.nn.ParameterList([torch.nn.Parameter(torch.tensor(v)) for v in
                                    ([1.0, 2.0, 3.0], [4.0, 5.0], [6.0, 7.0])])
    flat = flatten_weights(stage, 2)
    assert flat.tolist() == [1, 2, 3, 4, 5, 6, 7, 0]
    assert [c.tolist() for c in flat.chunk(2)] == [[1, 2, 3, 4], [5, 6, 7, 0]]
    flat[4] = 50.0
    assert stage[1].tolist() == [4.0, 50.0]  # a view: the gathered buffer is what the weights read
    assert expected_parameter_bytes([7, 4], 2, "zero3") == 4 * (4 + 2 + 8)


@pytest.mark.parametrize("options,message", [
    (["--dp", "2", "--reshard-after-forward"], "give --zero 3 (got --zero 0)"),
    (["--dp", "2", "--zero", "2", "--no-reshard-after-forward"], "give --zero 3 (got --zero 2)"),
    (["--zero", "3"], "--zero 3 shards over the data-parallel ranks: give --dp 2 or more"),
    (["--dp", "2", "--zero", "2", "--distributed-optimizer"], "--distributed-optimizer is --zero 1"),
    (["--dp", "2", "--zero", "3", "--clip-grad", "1"], "--zero 3 does not compose with --clip-grad yet"),
    (["--dp", "2", "--zero", "2", "--save", "ckpt"], "--zero 2 does not compose with --save yet"),
])
def test_zero_options_that_do_not_compose_are_refused(options, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_options(["plan.json", *MODEL, *options])


def test_the_distributed_optimizer_is_zero_1(capsys):
    opts = parse_options(["plan.json", *MODEL, "--dp", "2", "--distributed-optimizer"])
    assert (opts.zero, opts.distributed_optimizer, opts.reshard_after_forward) == (1, True, False)
    opts = parse_options(["plan.json", *MODEL, "--dp", "2", "--zero", "3"])
    assert (opts.zero, opts.distributed_optimizer, opts.reshard_after_forward) == (3, False, True)
    assert runtime_main(["plan.json", *MODEL, "--reshard-after-forward"]) == 2
    assert "--reshard-after-forward" in capsys.readouterr().err


def _memory_benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_vs_model.py"
    spec = importlib.util.spec_from_file_location("memory_vs_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_state_bytes_by_term_are_the_cost_models(plans, tmp_path):  # noqa: F811
    """One 4-rank launch (1F1B, p = 2, d = 2, two AdamW steps), --zero 0, 1, 2, 3 and 3 without
    resharding, the runtime's GPT and its Llama-family decoder in fp32: every rank's measured weights,
    gathered stage, gradients and optimizer state (the report's state_bytes) are
    schedc/costmodel/state_terms.py's to the byte; with the measured peak of saved activations and
    AdamW's step counters, the total is within 2 % of the prediction (the activations the simulated
    microbatches in flight times the activation table's bytes of one)."""
    bench = _memory_benchmark()
    plan = plans("1f1b", **bench.ZERO_PLAN)
    cases = [(family, level) for family in ("gpt", "llama") for level in bench.ZERO]
    jobs = [(plan, [*bench.zero_flags(family, level, tmp_path), "--quiet", "--report-out",
                    str(tmp_path / f"{family}_{level}.json")]) for family, level in cases]
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr
    for family, level in cases:
        report = json.loads((tmp_path / f"{family}_{level}.json").read_text())
        rows = bench.zero_rows(family, level, report, bench.predicted_state(family, level, plan))
        assert len(rows) == 4 * 7
        state = [(got, want) for _, _, term, got, want in rows if term in bench.ZERO_TERMS]
        assert all(got == want for got, want in state), (family, level, rows)
        assert bench.zero_ok(rows), (family, level, rows)
