"""descriptions: one lookup of the shipped model files, one meaning of --model. The compiler's --model
and the runtime's read the same TOML (a path or a library name); model code is --model-code; the old
--config is read with a note and `--model pkg.mod:fn` is refused, naming --model-code."""
from __future__ import annotations

import tomllib

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
    from schedc.runtime.options import parse_options
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
    from schedc.runtime.options import current_spelling, parse_options
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
    from schedc.runtime.options import OptionError, parse_options
    with pytest.raises(OptionError, match="give one of --model and --config"):
        parse_options([plan, "--model", "gpt-1.7b", "--config", "gpt-1.7b"])


def test_the_help_names_model_code_and_no_longer_config():
    from schedc.runtime.options import build_parser
    text = build_parser().format_help()
    assert "--model-code PKG.MOD:FN" in text and "--model TOML|NAME" in text and "--config" not in text
