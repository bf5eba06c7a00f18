# Tests of a GPT-2 config.json in the runtime (schedc/runtime/model/gpt2_names.py): --save-grads writes
# GPT-2's own Hugging Face names and layouts (Conv1D weights [in, out], q, k and v as one c_attn, the
# position table's n_positions rows, the tied lm_head under transformer.wte.weight). The check is an
# independent construction: a one-process GPT-2 written here in plain torch (float64) from transformers'
# GPT2LMHeadModel layout, its weights the run's initial ones laid out by this file's own table, whose loss
# and gradients the saved files must equal by name (rel <= 1e-5): the reference run here, and under
# torchrun t = 2, p = 2 (c_attn joined from the tensor ranks' q, k, v shards) with and without sequence
# parallelism. The stages hold the weights the cost model counts (the position table's n_positions rows).
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from schedc.cli import main
from schedc.descriptions import read_hf_config
from schedc.plan import load_plan
from schedc.runtime.__main__ import main as runtime_main
from schedc.runtime.model.gpt import Stage, build_model, build_pieces, partition, uses_gpt
from schedc.runtime.model.gpt2_names import gpt2_gradients, saved_layout
from schedc.runtime.model.train import global_microbatches, make_dataset, model_pieces
from schedc.runtime.process.options import parse_options
from test_runtime import _dump, launch_plans, plans  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[1]
TINY_GPT2 = REPO / "tests/data/hf/tiny-gpt2/config.json"  # 4 layers, n_embd 64, 4 heads, 64 positions, vocab 256
MODEL = ["--model", str(TINY_GPT2), "--seq", "16", "--mb-size", "2"]
TOLERANCE = 1e-5
LAYERS, HIDDEN, POSITIONS, VOCAB = 4, 64, 64, 256


def hf_shapes() -> dict[str, tuple[int, ...]]:
    """GPT2LMHeadModel's named_parameters at the fixture's sizes (lm_head.weight is wte's tensor: not
    listed), as transformers' modeling_gpt2 lays them out: Conv1D weights [in, out]."""
    h = HIDDEN
    shapes = {"transformer.wte.weight": (VOCAB, h), "transformer.wpe.weight": (POSITIONS, h),
              "transformer.ln_f.weight": (h,), "transformer.ln_f.bias": (h,)}
    for i in range(LAYERS):
        block = {"ln_1.weight": (h,), "ln_1.bias": (h,), "attn.c_attn.weight": (h, 3 * h), "attn.c_attn.bias": (3 * h,),
                 "attn.c_proj.weight": (h, h), "attn.c_proj.bias": (h,), "ln_2.weight": (h,), "ln_2.bias": (h,),
                 "mlp.c_fc.weight": (h, 4 * h), "mlp.c_fc.bias": (4 * h,), "mlp.c_proj.weight": (4 * h, h),
                 "mlp.c_proj.bias": (h,)}
        shapes.update({f"transformer.h.{i}.{k}": v for k, v in block.items()})
    return shapes


def as_gpt2(built: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The runtime's initial weights (nn.Linear [out, in], separate q, k, v) in GPT-2's layout."""
    out = {"transformer.wte.weight": built["model.embed_tokens.weight"],
           "transformer.wpe.weight": built["model.embed_positions.weight"],
           "transformer.ln_f.weight": built["model.norm.weight"], "transformer.ln_f.bias": built["model.norm.bias"]}
    for i in range(LAYERS):
        ours, theirs = f"model.layers.{i}.", f"transformer.h.{i}."
        for kind in ("weight", "bias"):
            out[theirs + "ln_1." + kind] = built[ours + "input_layernorm." + kind]
            out[theirs + "ln_2." + kind] = built[ours + "post_attention_layernorm." + kind]
        out[theirs + "attn.c_attn.weight"] = torch.cat(
            [built[f"{ours}self_attn.{p}_proj.weight"] for p in "qkv"]).T
        out[theirs + "attn.c_attn.bias"] = torch.cat([built[f"{ours}self_attn.{p}_proj.bias"] for p in "qkv"])
        for mine, hf in (("self_attn.o_proj", "attn.c_proj"), ("mlp.up_proj", "mlp.c_fc"), ("mlp.down_proj", "mlp.c_proj")):
            out[f"{theirs}{hf}.weight"] = built[f"{ours}{mine}.weight"].T
            out[f"{theirs}{hf}.bias"] = built[f"{ours}{mine}.bias"]
    return {name: w.detach().double().clone().requires_grad_() for name, w in out.items()}


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's activation (transformers' NewGELUActivation)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def gpt2_loss(w: dict[str, torch.Tensor], tokens: torch.Tensor, targets: torch.Tensor, heads: int = 4,
              eps: float = 1e-5) -> torch.Tensor:
    """GPT-2's forward (modeling_gpt2): pre-LayerNorm blocks, Conv1D x @ W + b, the causal softmax over
    q k^T / sqrt(head size) written out, the output tied to wte; mean cross entropy of the next tokens."""
    b, t = tokens.shape
    x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:t]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(LAYERS):
        p = {k.removeprefix(f"transformer.h.{i}."): v for k, v in w.items() if k.startswith(f"transformer.h.{i}.")}
        a = F.layer_norm(x, (HIDDEN,), p["ln_1.weight"], p["ln_1.bias"], eps)
        q, k, v = (a @ p["attn.c_attn.weight"] + p["attn.c_attn.bias"]).split(HIDDEN, dim=2)
        q, k, v = (z.view(b, t, heads, HIDDEN // heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-1, -2) / math.sqrt(HIDDEN // heads)).masked_fill(~causal, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, HIDDEN)
        x = x + y @ p["attn.c_proj.weight"] + p["attn.c_proj.bias"]
        m = F.layer_norm(x, (HIDDEN,), p["ln_2.weight"], p["ln_2.bias"], eps)
        x = x + gelu_new(m @ p["mlp.c_fc.weight"] + p["mlp.c_fc.bias"]) @ p["mlp.c_proj.weight"] + p["mlp.c_proj.bias"]
    x = F.layer_norm(x, (HIDDEN,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    logits = x @ w["transformer.wte.weight"].T
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def plain_gpt2(plan: Path) -> tuple[float, dict[str, torch.Tensor]]:
    """The plain GPT-2's first-step loss and gradients, by GPT-2's names, on the run's initial weights
    (from --seed) and batch (the whole step's microbatches)."""
    opts = parse_options([str(plan), *MODEL])
    weights = as_gpt2(dict(Stage(model_pieces(opts)).global_parameters()))
    batch = make_dataset(opts).batch(0, global_microbatches(load_plan(plan), 1), opts.model_config.mb_size)
    loss = gpt2_loss(weights, batch.tokens, batch.targets)
    loss.backward()
    return loss.item(), {name: w.grad for name, w in weights.items()}


def assert_matches(saved: Path, want: tuple[float, dict[str, torch.Tensor]]) -> None:
    loss, grads = _dump(saved)
    want_loss, want_grads = want
    assert {n: tuple(g.shape) for n, g in grads.items()} == hf_shapes()
    assert abs(loss - want_loss) <= TOLERANCE * abs(want_loss)
    for name, g in want_grads.items():
        error = ((grads[name].double() - g).norm() / g.norm().clamp_min(1e-12)).item()
        assert error <= TOLERANCE, (saved.name, name, error)


def test_the_reference_run_saves_gpt2s_names_and_layouts(plans, tmp_path):  # noqa: F811
    plan = plans("1f1b", p=2, m=4)
    out = tmp_path / "reference"
    assert runtime_main([str(plan), "--reference", *MODEL, "--steps", "1", "--quiet", "--save-grads", str(out)]) == 0
    assert_matches(out, plain_gpt2(plan))


def test_gpt2s_activation_is_read_and_built():
    """activation_function absent is gelu_new (GPT2Config's default): the tanh form, which the GPT's
    Block (exact GeLU) does not build; "gelu" is exact."""
    text = json.loads(TINY_GPT2.read_text())
    assert read_hf_config(json.dumps(text), 16).gelu_approximate == "tanh"
    assert read_hf_config(json.dumps({**text, "activation_function": "gelu"}), 16).gelu_approximate == "none"
    assert not uses_gpt(parse_options(["plan.json", *MODEL]).model_config)


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_each_stages_weights_are_the_cost_models(stages):
    """The position table has the config's n_positions rows (64, at seq 16), as the cost model counts it:
    at p = 1, 4 layers of 12h^2 + 13h = 49,984 + 256 x 64 + 64 x 64 positions + the final norm's 128."""
    from schedc.costmodel import stage_params
    from schedc.costmodel.modelspec import load_model_spec
    spec = load_model_spec(str(TINY_GPT2), 16)
    runs = partition(build_pieces(build_model, parse_options(["plan.json", *MODEL]).model_config, seed=0), stages)
    held = [sum(p.numel() for p in Stage(run).parameters()) for run in runs]
    assert held == [stage_params(spec, 1, stages, s) for s in range(stages)]
    assert stages > 1 or held == [4 * 49984 + 256 * 64 + 64 * 64 + 128]


def test_only_the_runtimes_own_gpt2_block_is_renamed():
    """A user model's names, and a model TOML file's family gpt2 of another block, are written as built."""
    cfg = parse_options(["plan.json", *MODEL]).model_config
    assert saved_layout(cfg, None) is gpt2_gradients
    assert saved_layout(cfg, "pkg.mod:build") is dict
    assert saved_layout(replace(cfg, mlp="swiglu"), None) is dict
    assert saved_layout(replace(cfg, family="llama"), None) is dict


@pytest.mark.parametrize("value", ["relu", ["gelu"]])
def test_an_activation_gpt2_is_not_built_with_is_a_located_error(tmp_path, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(TINY_GPT2.read_text()), "activation_function": value}, indent=2))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"activation_function"' in text)
    result = CliRunner().invoke(main, ["simulate", "schedc/schedules/1f1b.sched", "-D", "p=2", "-D", "m=4",
                                       "--cluster", "dgx-a100-80gb", "--model", str(path), "--seq", "16"])
    assert result.exit_code == 2, result.output
    assert f"{path}:{line}:3: error: 'activation_function' {value!r}: schedc builds GPT-2's MLP" in result.output


@pytest.mark.slow
def test_tensor_parallel_runs_save_the_whole_c_attn(plans, tmp_path):  # noqa: F811
    """t = 2, p = 2 (4 ranks): 1F1B, and interleaved 1F1B with sequence parallelism; each run's file
    against the plain GPT-2."""
    cases = {"1f1b_t2": (plans("1f1b", p=2, m=4), []),
             "interleaved_sp": (plans("interleaved_1f1b", p=2, v=2, m=4), ["--sequence-parallel"])}
    jobs = [(plan, [*MODEL, "--tp", "2", *extra, "--steps", "1", "--quiet", "--save-grads", str(tmp_path / name)])
            for name, (plan, extra) in cases.items()]
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    for name, (plan, _) in cases.items():
        assert_matches(tmp_path / name, plain_gpt2(plan))
