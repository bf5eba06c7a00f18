"""Mixtures of experts and latent attention as model facts: the library's Mixtral and DeepSeek-V3 files,
Hugging Face config.json files of the four MoE families, their parameter counts against the published
totals, and what is inconsistent refused at its key (exit 2)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from conftest import ROOT
from schedc.cli import main

HF_MOE = ROOT / "tests" / "data" / "hf_moe"
SIMULATE = ["simulate", "1f1b", "-D", "p=2", "-D", "m=4", "--cluster", "dgx-h100-80gb", "--json"]

# Published totals and activated parameters, in the digits their sources give them: Mixtral of Experts
# (Jiang et al. 2024): 46.7B / 12.9B; Mistral AI's Mixtral 8x22B release: 141B / 39B; DeepSeek-V3 report
# section 1: 671B / 37B (the MTP module's 14B aside); Qwen1.5-MoE-A2.7B's model card: 14.3B / 2.7B;
# Qwen3-30B-A3B's model card: 30.5B / 3.3B.
PUBLISHED = {"mixtral-8x7b": (46.7e9, 12.9e9, 0.1e9), "mixtral-8x22b": (141e9, 39e9, 1e9),
             "deepseek-v3": (671e9, 37e9, 1e9)}
CONFIGS = {"mixtral-8x7b": (46.7e9, 12.9e9, 0.1e9), "deepseek-v3": (671e9, 37e9, 1e9),
           "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9, 0.1e9), "qwen3-30b-a3b": (30.5e9, 3.3e9, 0.1e9)}


def _counts(facts):
    from schedc.descriptions.facts import activated_parameters, parameters
    return parameters(facts), activated_parameters(facts)


def _rounds_to(value: float, published: float, unit: float) -> bool:
    """Whether `value` is `published` in its source's last digit (unit); the activated counts' last digit
    is allowed one unit off, as sources round and differ on counting the input embedding."""
    return abs(value - published) <= unit


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_library_moe_has_its_published_total_and_activated_parameters(name):
    from schedc.costmodel.specs import load_model_spec
    total, active = _counts(load_model_spec(name))
    published_total, published_active, unit = PUBLISHED[name]
    assert _rounds_to(total, published_total, unit / 2), total
    assert _rounds_to(active, published_active, unit), active


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_config_json_of_each_moe_family_has_its_published_parameters(name):
    from schedc.descriptions import read_hf_config
    total, active = _counts(read_hf_config((HF_MOE / name / "config.json").read_text(), 4096))
    published_total, published_active, unit = CONFIGS[name]
    assert _rounds_to(total, published_total, unit / 2), total
    assert _rounds_to(active, published_active, unit), active


def test_mixtral_counts_by_hand():
    """Mixtral 8x7B by hand: per layer attention 2·4096² + 2·4096·1024, eight SwiGLU experts 3·4096·14336
    each, the router 4096·8, two RMSNorms; the untied embeddings and the final norm."""
    from schedc.costmodel.specs import load_model_spec
    h, f, kv = 4096, 14336, 1024
    layer = 2 * h * h + 2 * h * kv + 8 * 3 * h * f + 8 * h + 2 * h
    assert _counts(load_model_spec("mixtral-8x7b"))[0] == 32 * layer + 2 * 32000 * h + h


def test_deepseek_v3_latent_attention_and_layers_by_hand():
    from schedc.costmodel.specs import load_model_spec
    from schedc.descriptions.moe import attention_parameters
    m = load_model_spec("deepseek-v3")
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    assert attention_parameters(m) == mla
    assert (m.moe_layers, m.first_k_dense, m.mla, m.moe, m.mtp) == (58, 3, True, True, 1)
    moe_layer = mla + 256 * 3 * 7168 * 2048 + 3 * 7168 * 2048 + 256 * 7168 + 256 + 2 * 7168
    dense_layer = mla + 3 * 7168 * 18432 + 2 * 7168
    assert _counts(m)[0] == 58 * moe_layer + 3 * dense_layer + 2 * 129280 * 7168 + 7168


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3"])
def test_a_library_moe_and_its_config_json_are_the_same_model(name):
    from schedc.costmodel.specs import load_model_spec
    toml = load_model_spec(name)
    config = load_model_spec(str(HF_MOE / name / "config.json"), seq=toml.seq)
    assert replace(toml, aux_loss=0.0) == replace(config, aux_loss=0.0)


def test_each_family_reads_its_router_and_shared_experts():
    from schedc.descriptions import read_hf_config
    read = {name: read_hf_config((HF_MOE / name / "config.json").read_text(), 64) for name in CONFIGS}
    assert (read["deepseek-v3"].router, read["deepseek-v3"].n_group, read["deepseek-v3"].topk_group) == \
        ("sigmoid", 8, 4)
    assert (read["qwen1.5-moe-a2.7b"].shared_experts, read["qwen1.5-moe-a2.7b"].shared_width) == (1, 5632)
    assert (read["qwen3-30b-a3b"].head_dim, read["qwen3-30b-a3b"].q_hidden) == (128, 4096)
    assert (read["mixtral-8x7b"].experts, read["mixtral-8x7b"].top_k, read["mixtral-8x7b"].router) == \
        (8, 2, "softmax")


def _line_of(path: str, key: str) -> int:
    return next(n for n, line in enumerate(open(path).read().splitlines(), 1) if f'"{key}"' in line)


@pytest.mark.parametrize("name, change, key, words", [
    ("mixtral-8x7b", {"num_experts_per_tok": 9}, "num_experts_per_tok",
     "'num_experts_per_tok' (9) must be from 1 to the 8 experts ('num_local_experts')"),
    ("mixtral-8x7b", {"num_local_experts": None}, None, "missing key 'num_local_experts'"),
    ("deepseek-v3", {"n_group": 7}, "n_group", "'n_group' (7) must divide the 256 experts"),
    ("deepseek-v3", {"first_k_dense_replace": 61}, "first_k_dense_replace",
     "'first_k_dense_replace' (61) must be fewer than the 61 layers"),
    ("deepseek-v3", {"scoring_func": "relu"}, "scoring_func", "'scoring_func' must be softmax or sigmoid"),
    ("deepseek-v3", {"v_head_dim": None}, "v_head_dim", "'v_head_dim' missing: latent attention"),
    ("qwen3-30b-a3b", {"mlp_only_layers": [0]}, "mlp_only_layers", "'mlp_only_layers' given"),
    ("qwen3-30b-a3b", {"decoder_sparse_step": 2}, "decoder_sparse_step", "'decoder_sparse_step' 2"),
])
def test_an_inconsistent_moe_config_is_a_located_error(tmp_path, name, change, key, words):
    table = json.loads((HF_MOE / name / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**table, **change}, indent=2))
    result = CliRunner().invoke(main, [*SIMULATE, "--model", str(path), "--seq", "64"])
    line = _line_of(str(path), key) if key else 1
    where = f"{path}:{line}:{3 if key else 1}"
    assert result.exit_code == 2 and f"{where}: error: {words}" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_toml_moe_with_top_k_past_its_experts_is_located(tmp_path):
    text = (ROOT / "schedc" / "models" / "mixtral-8x7b.toml").read_text().replace("top_k = 2", "top_k = 12")
    path = tmp_path / "moe.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, [*SIMULATE, "--model", str(path)])
    line = next(n for n, row in enumerate(text.splitlines(), 1) if row.startswith("top_k"))
    assert result.exit_code == 2 and f"{path}:{line}:1: error: 'top_k' (12) must be from 1 to the 8 experts" \
        in result.output, result.output
