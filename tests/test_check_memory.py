"""check_memory: activation units against `limit memory`, bytes against --memory-limit with --model."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from schedc.checks.memory import Model, parse_bytes
from schedc.cli import main
from schedc.diagnostics import SchedError

MODEL = """layers = 32
hidden = 4096
heads = 32
seq = 2048
microbatch_size = 1
dtype = "bf16"
"""


def check(*args):
    return CliRunner().invoke(main, ["check", *map(str, args)])


def test_units_limit_names_device_time_and_alive_ops():
    result = check(FIXTURES / "broken" / "memory.sched")
    assert result.exit_code == 1
    assert "device 1: 3 activation units alive at time 3 when F(1,2) runs" in result.output
    assert "alive: F(1,0), F(1,1), F(1,2)" in result.output
    assert "memory.sched:8" in result.output  # the limit's line, in a note


def test_bytes_formula():
    model = Model(32, 4096, 32, 2048, 1)
    assert model.activation_bytes_per_layer() == 2048 * 1 * 4096 * (34 + 5 * 32 * 2048 / 4096)
    assert model.state_bytes_per_layer() == (12 * 4096 ** 2 + 13 * 4096) * 16
    assert Model(10, 8, 1, 1, 1).stage_layers(4) == [3, 3, 2, 2]


def test_bytes_limit(tmp_path):
    model = tmp_path / "model.toml"
    model.write_text(MODEL)
    fits = check("1f1b", "--model", model, "--memory-limit", "80GiB")
    assert fits.exit_code == 0, fits.output
    assert "peak memory per device" in fits.output
    over = check("gpipe", "-D", "m=64", "--model", model, "--memory-limit", "40GiB")
    assert over.exit_code == 1
    assert "device 0:" in over.output and "exceeds the limit 40.00 GiB" in over.output
    assert "64 microbatch-stages alive" in over.output


@pytest.mark.parametrize("text,where", [("layers = 32\nhidden = [\n", "model.toml:2:"),
                                        (MODEL + "hiden = 3\n", "model.toml:7:1"),
                                        (MODEL.replace("32\n", "-1\n", 1), "model.toml:1:1")])
def test_bad_model_is_a_located_usage_error(tmp_path, text, where):
    model = tmp_path / "model.toml"
    model.write_text(text)
    result = check("1f1b", "--model", model)
    assert result.exit_code == 2 and where in result.output, result.output


def test_limits_parse():
    assert parse_bytes("80GiB") == 80 * 2 ** 30 and parse_bytes("1e9") == 1e9 and parse_bytes("512 MB") == 512e6
    with pytest.raises(SchedError) as info:
        parse_bytes("lots")
    assert info.value.exit_code == 2
    assert check("1f1b", "--memory-limit", "80GiB").exit_code == 2  # a byte limit needs --model
