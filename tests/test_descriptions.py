"""descriptions: one lookup of the shipped model files, one meaning of --model. The compiler's --model
and the runtime's read the same TOML (a path or a library name); model code is --model-code; the old
--config is read with a note and `--model pkg.mod:fn` is refused, naming --model-code."""
from __future__ import annotations

import json
import tomllib
from dataclasses import replace

import pytest
from click.testing import CliRunner

from conftest import ROOT
from schedc.cli import main
from schedc.descriptions import code_given_as_model, resolve_model

LIBRARY = ROOT / "schedc" / "models"
RUN = ["--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2", "--vocab", "256", "--steps", "1",
       "--quiet"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    assert CliRunner().invoke(main, ["compile", "1f1b", "-D", "p=2", "-D", "m=2", "-o", str(out)]).exit_code == 0
    return str(out / "plan.json")


@pytest.mark.parametrize("name", ["gpt-1.7b", "gpt-1.7b.toml", "zb-1.5b"])
def test_a_library_name_is_the_shipped_file_for_the_compiler_and_the_runtime(plan, name):
    from schedc.costmodel.specs import load_model_spec
    from schedc.runtime.process.options import parse_options
    stem = name.removesuffix(".toml")
    table = tomllib.loads((LIBRARY / f"{stem}.toml").read_text())  # read here, apart from either reader
    assert resolve_model(name) == LIBRARY / f"{stem}.toml"
    spec = load_model_spec(name)
    cfg = parse_options([plan, "--model", name, "--device", "cuda"]).model_config
    for key in ("layers", "hidden", "heads", "seq", "vocab"):
        assert getattr(spec, key) == getattr(cfg, key) == table[key], key


def test_a_path_is_taken_as_given_before_the_library(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt-1.7b").write_text("layers = 2\n")
    assert resolve_model("gpt-1.7b").resolve() == tmp_path / "gpt-1.7b"


def test_the_old_config_spelling_is_read_as_model_with_one_note(plan, capsys):
    from schedc.runtime.__main__ import main as runtime_main
    from schedc.runtime.process.options import current_spelling, parse_options
    small = ROOT / "tests" / "fixtures" / "small_model.toml"
    old = parse_options([plan, "--config", str(small)])
    assert old.model == str(small) and old.model_config == parse_options([plan, "--model", str(small)]).model_config
    assert old.notes == ["note: --config is deprecated: use --model (a model TOML file or a library name)"]
    assert current_spelling(["--config", "a.toml", "--config=b.toml", "--steps", "1"]) == \
        ["--model", "a.toml", "--model=b.toml", "--steps", "1"]
    assert runtime_main([plan, "--config", str(small), *RUN, "--reference"]) == 0
    err = capsys.readouterr().err
    assert err.count("--config is deprecated: use --model") == 1, err


def test_model_code_given_to_model_is_refused_naming_model_code(plan, capsys):
    from schedc.runtime.__main__ import main as runtime_main
    assert runtime_main([plan, "--model", "pkg.mod:build", *RUN]) == 2
    err = capsys.readouterr().err
    assert "error: --model pkg.mod:build: 'pkg.mod:build' names no file; model code (PKG.MOD:FN) goes to " \
        "--model-code pkg.mod:build" in err, err
    result = CliRunner().invoke(main, ["run", plan, "--model", "pkg.mod:build", *RUN])
    assert result.exit_code == 2 and "goes to --model-code pkg.mod:build" in result.output
    compiled = CliRunner().invoke(main, ["simulate", "1f1b", "--model", "pkg.mod:build", "--cluster", "dgx-a100-80gb"])
    assert compiled.exit_code == 2 and "goes to --model-code pkg.mod:build" in compiled.output
    assert "Traceback" not in result.output + compiled.output


def test_a_file_whose_name_has_a_colon_is_a_description(tmp_path):
    path = tmp_path / "a:b.toml"
    path.write_text("layers = 2\n")
    assert code_given_as_model(str(path)) is None and code_given_as_model("gpt-1.7b") is None


def test_a_name_found_nowhere_lists_the_library(plan, capsys):
    from schedc.runtime.__main__ import main as runtime_main
    assert runtime_main([plan, "--model", "gpt-nosuch", *RUN]) == 2
    err = capsys.readouterr().err
    assert "error: --model gpt-nosuch: no such file or library model (the library's: " in err and "gpt-175b" in err


def test_model_and_config_together_are_refused(plan):
    from schedc.runtime.process.options import OptionError, parse_options
    with pytest.raises(OptionError, match="give one of --model and --config"):
        parse_options([plan, "--model", "gpt-1.7b", "--config", "gpt-1.7b"])


def test_the_help_names_model_code_and_no_longer_config():
    from schedc.runtime.process.options import build_parser
    text = build_parser().format_help()
    assert "--model-code PKG.MOD:FN" in text and "--model TOML|NAME" in text and "--config" not in text


# --- architecture facts: Hugging Face config.json and the library's Llama-family models -----------------

HF = ROOT / "tests" / "data" / "hf"
TINY = HF / "tiny-llama" / "config.json"
LLAMA_70B_CONFIG = ROOT / "examples" / "hf" / "llama3.1-70b" / "config.json"
SIMULATE = ["simulate", "1f1b", "-D", "p=2", "-D", "m=4", "--cluster", "dgx-h100-80gb", "--json"]


def test_the_tiny_llama_config_reads_as_its_keys_say():
    from schedc.descriptions import read_hf_config
    facts = read_hf_config(TINY.read_text(), 32)
    assert (facts.layers, facts.hidden, facts.heads, facts.kv_heads, facts.ffn, facts.vocab, facts.seq) == \
        (4, 64, 4, 2, 176, 256, 32)
    assert (facts.mlp, facts.norm, facts.positions, facts.tied_embeddings, facts.bias, facts.family) == \
        ("swiglu", "rmsnorm", "rope", False, "none", "llama")
    assert (facts.norm_eps, facts.rope_theta, facts.head_dim, facts.kv_hidden) == (1e-5, 500000.0, 16, 32)


# The parameter counts of the published checkpoints (the Hugging Face safetensors' totals; Llama 3.1 model
# card: 8B, 70B, 405B; Qwen2.5 report: 72.7B; Mistral 7B: 7.24B)
PUBLISHED = {"llama3.1-8b": 8_030_261_248, "llama3.1-70b": 70_553_706_496, "llama3.1-405b": 405_853_388_800,
             "qwen2.5-72b": 72_706_203_648, "mistral-7b": 7_241_732_096}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_library_model_has_its_published_parameter_count(name):
    from schedc.costmodel.specs import load_model_spec
    from schedc.descriptions import parameters
    assert parameters(load_model_spec(name)) == PUBLISHED[name]


def test_a_gpt_counts_twelve_h_squared_and_thirteen_h_a_layer():
    from schedc.costmodel.specs import load_model_spec
    from schedc.descriptions import parameters
    m = load_model_spec("gpt-175b")  # Narayanan et al.: 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
    h, lay = 12288, 96
    assert parameters(m) == 12 * lay * h * h + 13 * lay * h + (51200 + 2048) * h + 2 * h


def test_a_library_llama_and_its_config_json_are_the_same_model():
    from schedc.costmodel.specs import load_model_spec
    toml, config = load_model_spec("llama3.1-70b"), load_model_spec(str(LLAMA_70B_CONFIG), seq=8192)
    assert config.rope_scaling == (8.0, 1.0, 4.0, 8192)  # Llama 3.1's; the runtime's alone (no cost changes)
    assert replace(toml, dtype="bf16") == replace(config, dtype="bf16", rope_scaling=None)


def test_seq_changes_a_library_model_and_a_config_json_needs_it(tmp_path):
    from schedc.costmodel.specs import load_model_spec
    assert load_model_spec("llama3.1-8b", seq=4096).seq == 4096
    result = CliRunner().invoke(main, [*SIMULATE, "--model", str(TINY)])
    assert result.exit_code == 2 and f"{TINY}:1:1: error: a config.json gives no sequence length" in result.output


def test_a_tiny_llama_config_is_simulated_on_a_cluster():
    result = CliRunner().invoke(main, [*SIMULATE, "--model", str(TINY), "--seq", "64"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["parameters"] == 217_664  # 4 (2·64² + 2·64·32 + 3·64·176 + 2·64) + 2·256·64 + 64


def _config(tmp_path, change: dict, drop: tuple[str, ...] = ()) -> str:
    table = {k: v for k, v in json.loads(TINY.read_text()).items() if k not in drop}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**table, **change}, indent=2))
    return str(path)


def _line_of(path: str, key: str) -> int:
    return next(n for n, line in enumerate(open(path).read().splitlines(), 1) if f'"{key}"' in line)


@pytest.mark.parametrize("change, drop, key, words", [
    ({}, ("num_hidden_layers",), None, "missing key 'num_hidden_layers'"),
    ({"hidden_size": -64}, (), "hidden_size", "'hidden_size' must be a positive integer"),
    ({"num_attention_heads": 5}, (), "num_attention_heads", "'num_attention_heads' (5) must divide 'hidden_size' (64)"),
    ({"num_key_value_heads": 3}, (), "num_key_value_heads", "'num_key_value_heads' (3) must divide"),
    ({"model_type": "mamba"}, (), "model_type", "model_type 'mamba' is not a family schedc knows"),
    ({"tie_word_embeddings": "no"}, (), "tie_word_embeddings", "'tie_word_embeddings' must be true or false"),
    ({"head_dim": 32}, (), "head_dim", "head_dim 32 is not hidden_size / num_attention_heads = 16"),
    ({"hidden_size": None}, (), "hidden_size", "'hidden_size' is null (a positive integer)"),
    ({"hidden_act": "gelu"}, (), "hidden_act", "'hidden_act' 'gelu': schedc builds the llama family's MLP as SwiGLU"),
])
def test_a_bad_config_json_is_a_located_error(tmp_path, change, drop, key, words):
    path = _config(tmp_path, change, drop)
    result = CliRunner().invoke(main, [*SIMULATE, "--model", path, "--seq", "32"])
    where = f"{path}:{_line_of(path, key)}:3" if key else f"{path}:1:1"
    assert result.exit_code == 2 and f"{where}: error: {words}" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_null_key_value_heads_is_the_heads_as_transformers_reads_it(tmp_path):
    """LlamaConfig(num_key_value_heads=None) is multi-head attention: the tiny Llama's 4 heads."""
    from schedc.costmodel.modelspec import load_model_spec
    spec = load_model_spec(_config(tmp_path, {"num_key_value_heads": None}, ()), 32)
    assert (spec.heads, spec.kv_heads) == (4, 4)


def test_check_of_a_config_json_asks_for_the_microbatch_size_an_option_gives():
    result = CliRunner().invoke(main, ["check", "1f1b", "-D", "p=2", "--model", str(TINY), "--seq", "32"])
    assert result.exit_code == 2 and "give --microbatch-size B (or `microbatch_size = B` in a model TOML file; " \
        "a config.json states none)" in result.output, result.output
    ok = CliRunner().invoke(main, ["check", "1f1b", "-D", "p=2", "--model", str(TINY), "--seq", "32",
                                   "--microbatch-size", "2"])
    assert ok.exit_code == 0, ok.output


def test_a_learned_position_model_refuses_a_longer_seq(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4,
                                "vocab_size": 256, "n_positions": 128}, indent=2))
    ok = CliRunner().invoke(main, [*SIMULATE, "--model", str(path), "--seq", "128"])
    assert ok.exit_code == 0, ok.output
    result = CliRunner().invoke(main, [*SIMULATE, "--model", str(path), "--seq", "256"])
    assert result.exit_code == 2
    assert f"{path}:{_line_of(str(path), 'n_positions')}:3: error: sequence 256 (the model's seq or --seq) is longer than its " \
           "128 learned positions" in result.output


def test_invalid_json_is_located(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 64,,\n}\n')
    result = CliRunner().invoke(main, [*SIMULATE, "--model", str(path), "--seq", "32"])
    assert result.exit_code == 2 and f"{path}:3:" in result.output and "Traceback" not in result.output


def test_tensor_parallelism_over_fewer_key_value_heads_is_refused_naming_them():
    result = CliRunner().invoke(main, [*SIMULATE, "--model", str(TINY), "--seq", "32", "--tp", "4"])
    assert result.exit_code == 2
    assert f"{TINY}:{_line_of(str(TINY), 'num_key_value_heads')}:3: error: --tp 4 does not divide 'kv_heads' (2): " \
           "tensor parallelism splits the key/value heads" in result.output
    assert CliRunner().invoke(main, [*SIMULATE, "--model", str(TINY), "--seq", "32", "--tp", "2"]).exit_code == 0


def test_a_toml_model_states_the_facts_by_their_names(tmp_path):
    from schedc.costmodel.specs import load_model_spec
    path = tmp_path / "m.toml"
    path.write_text("layers = 2\nhidden = 64\nheads = 4\nkv_heads = 3\nseq = 32\nvocab = 256\n")
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=2", "--cluster", "dgx-h100-80gb",
                                       "--model", str(path)])
    assert result.exit_code == 2 and f"{path}:4:1: error: 'kv_heads' (3) must divide 'heads' (4)" in result.output
    path.write_text("layers = 2\nhidden = 64\nheads = 4\nseq = 32\nvocab = 256\nmlp = 'relu'\n")
    result = CliRunner().invoke(main, ["simulate", "1f1b", "-D", "p=2", "--cluster", "dgx-h100-80gb",
                                       "--model", str(path)])
    assert result.exit_code == 2 and f"{path}:6:1: error: 'mlp' must be one of gelu, swiglu" in result.output
    path.write_text("layers = 2\nhidden = 64\nheads = 4\nseq = 32\nvocab = 256\n")
    gpt = load_model_spec(str(path))  # the defaults: Megatron's GPT
    assert (gpt.kv_heads, gpt.mlp, gpt.ffn, gpt.norm, gpt.positions, gpt.tied_embeddings, gpt.bias) == \
        (4, "gelu", 256, "layernorm", "learned", True, "all")


def test_tune_searches_a_config_json_at_its_seq_and_never_splits_the_kv_heads_past_them():
    args = ["tune", "--model", str(TINY), "--seq", "64", "--cluster", "dgx-h100-80gb", "--gpus", "8",
            "--global-batch", "16", "--schedules", "1f1b", "--sequence-parallel", "--tp-comm-overlap"]
    listed = CliRunner().invoke(main, [*args, "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert rows and {r["t"] for r in rows} <= {1, 2} and all(r["parameters"] == 217_664 for r in rows)
    text = CliRunner().invoke(main, [*args, "--why", "1f1b t=2"])
    assert text.exit_code == 0, text.output
    assert "--seq 64" in text.output and "--tp-comm-overlap" in text.output
    assert "exposed with --tp-comm-overlap" in text.output and "this step's, with it" in text.output
