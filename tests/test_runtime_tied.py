# Tests of tied word embeddings in the runtime (schedc/runtime/model/tied.py): a tiny tied Llama's
# config.json (Llama 3.2's form: tie_word_embeddings, rope_scaling llama3) and a tiny GPT-2's (tied by
# default: LayerNorm, learned positions, GeLU, biases). One stage holding both ends holds one tensor;
# across stages the last stage's output layer is a copy that starts equal and takes the same summed
# gradient. Under torchrun: 1F1B, ZB-H1, interleaved 1F1B (p = 2) and DualPipeV (its V puts the first
# and last stage on rank 0), t = 1 and 2, ZeRO 2 and 3 at d = 2, --clip-grad: each run's first-step loss
# and gradients (the tied weight under the embedding's one name) and the losses of 3 AdamW steps equal
# the one-process reference's (rel <= 1e-5): after a step the copies being apart would show. A tiny
# Mistral with a sliding window of 6 at seq 16 runs in the same launches.
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from schedc.plan import load_plan
from schedc.runtime.__main__ import main as runtime_main
from schedc.runtime.model.gpt import Stage, build_pieces, build_model, partition
from schedc.runtime.model.tied import EMBEDDING, OUTPUT, embedding_ranks, is_tied
from schedc.runtime.process.options import parse_options
from test_runtime import _dump, launch_plans, plans  # noqa: F401 (fixtures)
from test_runtime_memory import relative_errors

REPO = Path(__file__).resolve().parents[1]
TIED_LLAMA = REPO / "tests/data/hf/tiny-llama-tied/config.json"
TINY_GPT2 = REPO / "tests/data/hf/tiny-gpt2/config.json"
WINDOWED = REPO / "tests/data/hf/tiny-mistral-window/config.json"  # sliding_window 6 < seq 16 (spans.py)
TOLERANCE = 1e-5
STEPS = 3


def model(config: Path) -> list[str]:
    return ["--model", str(config), "--seq", "16", "--mb-size", "2"]


def config_of(plan: Path, config: Path):
    return parse_options([str(plan), *model(config)]).model_config


def test_one_stage_holds_one_tensor_and_two_stages_a_copy_that_starts_equal(plans):  # noqa: F811
    cfg = config_of(plans("1f1b", p=2, m=4), TIED_LLAMA)
    assert cfg.tied_embeddings and cfg.family == "llama"
    pieces = build_pieces(build_model, cfg, seed=3)
    whole = Stage(pieces)
    names = [name for name, _ in whole.global_parameters()]
    assert EMBEDDING in names and OUTPUT not in names  # the one-process model: one tensor, one name
    assert whole.pieces[-1].lm_head.weight is whole.pieces[0].embed_tokens.weight
    assert sum(p.numel() for p in whole.parameters()) == sum(p.numel() for _, p in whole.global_parameters())
    first, last = (Stage(run) for run in partition(build_pieces(build_model, cfg, seed=3), 2))
    embedding = dict(first.global_parameters())[EMBEDDING]
    copy = dict(last.global_parameters())[OUTPUT]
    assert copy is not embedding and torch.equal(copy, embedding)
    assert 0.015 < embedding.std().item() < 0.025  # N(0, 0.02), Hugging Face's initializer_range


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_each_stages_weights_are_the_cost_models(plans, stages):  # noqa: F811
    """The runtime's stages hold what costmodel.stage_params counts, as Megatron-LM holds them: at p = 1
    the tied weight once (201,280 = 4 layers of 46,208 + 256 x 64 + 64), past it the last stage's copy
    too (108,864 = 2 layers + the final norm + the 16,384-weight copy)."""
    from schedc.costmodel import stage_params
    from schedc.costmodel.modelspec import load_model_spec
    spec = load_model_spec(str(TIED_LLAMA), 16)
    runs = partition(build_pieces(build_model, config_of(plans("1f1b", p=2, m=4), TIED_LLAMA), seed=0), stages)
    held = [sum(p.numel() for p in Stage(run).parameters()) for run in runs]
    assert held == [stage_params(spec, 1, stages, s) for s in range(stages)]
    assert held[-1] == {1: 4 * 46208 + 256 * 64 + 64, 2: 2 * 46208 + 64 + 256 * 64, 4: 46208 + 64 + 256 * 64}[stages]


def test_the_embedding_group_is_the_end_stages_ranks(plans):  # noqa: F811
    """1F1B and interleaved 1F1B: ranks 0 and 1 (the last stage on rank 1); DualPipeV's V: rank 0
    alone; Chimera's two pipelines refused by name."""
    assert embedding_ranks(load_plan(plans("1f1b", p=2, m=4))) == [0, 1]
    assert embedding_ranks(load_plan(plans("interleaved_1f1b", p=2, v=2, m=4))) == [0, 1]
    assert embedding_ranks(load_plan(plans("dualpipev", p=2, m=5))) == [0]
    with pytest.raises(ValueError, match="several pipelines"):
        embedding_ranks(load_plan(plans("chimera", p=2, m=4)))
    untied = build_pieces(build_model, config_of(plans("1f1b", p=2, m=4), REPO / "tests/data/hf/tiny-llama/config.json"),
                          seed=0, materialize=False)
    assert not is_tied(partition(untied, 2))


def test_a_tied_gpt2_config_builds_the_decoder_with_learned_positions(plans):  # noqa: F811
    cfg = config_of(plans("1f1b", p=2, m=4), TINY_GPT2)
    assert (cfg.tied_embeddings, cfg.positions, cfg.mlp, cfg.norm, cfg.bias, cfg.max_positions) == (
        True, "learned", "gelu", "layernorm", "all", 64)
    names = [name for name, _ in Stage(build_pieces(build_model, cfg, seed=0)).global_parameters()]
    assert names[:2] == [EMBEDDING, "model.embed_positions.weight"] and OUTPUT not in names


@pytest.mark.parametrize("schedule,params,options,message", [
    ("chimera", {"p": 2, "m": 4}, [], "tied embeddings: the plan has several pipelines"),
    ("pipefisher_1f1b", {"p": 2, "m": 4}, ["--tasks", "schedc.runtime.kfac"], "tied embeddings with K-FAC's tasks")])
def test_what_would_move_the_copy_apart_is_refused_before_launch(plans, schedule, params, options,  # noqa: F811
                                                                  message):
    from click.testing import CliRunner
    from schedc.cli import main
    result = CliRunner().invoke(main, ["run", str(plans(schedule, **params)), *model(TIED_LLAMA), *options])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
@pytest.mark.parametrize("changes", [{"tied_embeddings": True}, {"window": 6}, {"tied_embeddings": True, "window": 6}])
def test_tied_and_windowed_stages_save_the_activation_tables_bytes(changes, mode):
    """Tying the output layer to the embedding and a sliding window (its mask a buffer of the layers)
    change nothing a forward saves: two stages' saved-tensor meter equals the untied, unwindowed
    decoder's rows of schedc/costmodel/activations.py to the byte."""
    from schedc.costmodel.activations import Sizes, runtime_decoder, stage_bytes
    from schedc.runtime.model.gpt import ModelConfig
    from test_runtime_decoder import LLAMA, stages_saved_bytes
    cfg = ModelConfig(**{**LLAMA, **changes})
    sizes, facts = Sizes(16, 2, 64, 4, 96, 256, 2), runtime_decoder("swiglu", "rmsnorm", "rope")
    for s, first, last, saved in stages_saved_bytes(cfg, mode):
        assert saved == stage_bytes(sizes, facts, 1, first, last, recompute=mode), s


# -- under torchrun ------------------------------------------------------------------------------------

def _reference(plan: Path, config: Path, directory: Path, dp: int = 1, *options: str) -> tuple:
    meta = load_plan(plan).meta
    count = meta["microbatches"] // meta.get("chunks", 1) * dp  # the batch: the reference's whole step
    out = directory / "_".join(["ref", config.parent.name, str(count), *options])
    if not out.exists():
        assert runtime_main([str(plan), "--reference", *model(config), "--dp", str(dp), "--steps", str(STEPS),
                             "--quiet", "--save-grads", str(out), "--metrics-out", str(out / "metrics"),
                             *options]) == 0
    return _dump(out), _losses(out)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics").read_text().splitlines()]


def _job(plan: Path, config: Path, out: Path, *options: str) -> tuple[Path, list[str]]:
    return plan, [*model(config), "--steps", str(STEPS), "--quiet", *options, "--save-grads", str(out),
                  "--metrics-out", str(out / "metrics")]


ZERO_GRADIENT = "self_attn.k_proj.bias"  # q·b_k adds one value to all of a query's scores: softmax drops it
ROUNDING = 1e-8  # such a gradient's size in fp32 (the reference's: ~2e-10)


def _check(cases: list, directory: Path) -> None:
    """Each run's first-step loss and gradients against the reference's (rel <= 1e-5; a key bias's,
    zero but for rounding, within ROUNDING of it), and the losses of the STEPS steps."""
    for name, plan, config, options, dp in cases:
        (loss, grads), losses = _reference(plan, config, directory / "refs", dp, *options)
        out = directory / name
        got_loss, got = _dump(out)
        zero = [key for key in grads if key.endswith(ZERO_GRADIENT)]
        for key in zero:
            assert got[key].norm() < ROUNDING and grads[key].norm() < ROUNDING, (name, key)
        kept = ({k: v for k, v in got.items() if k not in zero}, {k: v for k, v in grads.items() if k not in zero})
        loss_error, grad_error = relative_errors((got_loss, kept[0]), (loss, kept[1]))
        assert loss_error <= TOLERANCE and grad_error <= TOLERANCE, (name, loss_error, grad_error)
        assert _losses(out) == pytest.approx(losses, rel=TOLERANCE), name
        assert losses[-1] < losses[0], name  # the steps train


def _launch(cases: list, ranks: int, directory: Path) -> None:
    (directory / "refs").mkdir()
    jobs = [_job(plan, config, directory / name, *options, *(["--dp", str(dp)] if dp > 1 else []), *launch)
            for name, plan, config, options, dp, launch in cases]
    run = launch_plans(jobs, ranks, directory)
    assert run.returncode == 0, run.stderr[-4000:]
    _check([case[:5] for case in cases], directory)


@pytest.mark.slow
def test_tied_embeddings_on_two_ranks_give_the_reference(plans, tmp_path):  # noqa: F811
    """t = 1, p = 2: 1F1B, ZB-H1, interleaved 1F1B and DualPipeV for the tied Llama; 1F1B and
    interleaved for the tied GPT-2; GPipe with --clip-grad (the copy counted once in the norm); the
    windowed Mistral under 1F1B (the attention core recomputed) and ZB-H1."""
    schedules = {"1f1b": plans("1f1b", p=2, m=4), "zb_h1": plans("zb_h1", p=2, m=3),
                 "interleaved": plans("interleaved_1f1b", p=2, v=2, m=4), "dualpipev": plans("dualpipev", p=2, m=4)}
    cases = [(f"llama_{name}", plan, TIED_LLAMA, [], 1, []) for name, plan in schedules.items()]
    cases += [(f"gpt2_{name}", schedules[name], TINY_GPT2, [], 1, []) for name in ("1f1b", "interleaved")]
    cases.append(("llama_clip", plans("gpipe", p=2, m=4), TIED_LLAMA, ["--clip-grad", "0.05"], 1, []))
    cases += [(f"window_{name}", schedules[name], WINDOWED, [], 1, ["--recompute", mode])
              for name, mode in (("1f1b", "selective"), ("zb_h1", "none"))]
    _launch(cases, 2, tmp_path)


@pytest.mark.slow
def test_tied_embeddings_on_four_ranks_give_the_reference(plans, tmp_path):  # noqa: F811
    """t = 2, p = 2 (the embedding and its copy vocabulary-parallel, each tensor rank's rows summed with
    the same rows): 1F1B, interleaved 1F1B with sequence parallelism, DualPipeV; p = 2, d = 2 under
    ZeRO 2 and ZeRO 3 (the pair summed before the reduce-scatter); the windowed Mistral at t = 2 with
    sequence parallelism (the band over the gathered sequence); the tied Llama at --cp 2 (a group per
    context rank)."""
    tp = ["--tp", "2"]
    cases = [("llama_1f1b_t2", plans("1f1b", p=2, m=4), TIED_LLAMA, [], 1, tp),
             ("llama_interleaved_sp", plans("interleaved_1f1b", p=2, v=2, m=4), TIED_LLAMA, [], 1,
              [*tp, "--sequence-parallel"]),
             ("gpt2_dualpipev_t2", plans("dualpipev", p=2, m=4), TINY_GPT2, [], 1, tp),
             ("llama_zero2", plans("1f1b", p=2, m=4), TIED_LLAMA, [], 2, ["--zero", "2"]),
             ("gpt2_zero3", plans("zb_h1", p=2, m=3), TINY_GPT2, [], 2, ["--zero", "3", "--reshard-after-forward"]),
             ("window_sp", plans("1f1b", p=2, m=4), WINDOWED, [], 1, [*tp, "--sequence-parallel"]),
             ("llama_cp", plans("1f1b", p=2, m=4), TIED_LLAMA, [], 1, ["--cp", "2"])]
    _launch(cases, 4, tmp_path)
