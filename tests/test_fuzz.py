"""Robustness: random bytes, token streams and mutations of the library never produce a traceback,
only success or a located error; absurd sizes are refused quickly."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SCHEDULES
from schedc.cli import main

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TOKENS = ["schedule", "s", '"doc"', "param", "p", "m", "=", "4", "2", "require", "pipeline", "main", "{", "}",
          "stages", "device", "d", "->", "microbatches", ";", "on", "F", "B", "I", "W", "*", "(", ")", ",", "..",
          "queue", "by", "i", "let", "w", "for", "k", "in", "if", "else", "min", "+", "-", "//", "%", "**",
          "limit", "memory", "<=", "greedy", "inflight", "task", "after", "fill", "bubbles", "with", "split",
          "backward", "replicate", "cost", "\n", "#", ".", "up", "0F0", "1B1", "3I2"]
LIBRARY = {path.name: path.read_bytes() for path in SCHEDULES.glob("*.sched")}


def run(tmp_path, name: str, data: bytes, *args: str):
    # a folder of its own: `extends 1f1b` would find an earlier example's mutated 1f1b.sched beside it
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / name
    path.write_bytes(data)
    result = CliRunner().invoke(main, ["check", str(path), *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code:
        assert f"{path}" in result.output and "error:" in result.output, result.output
    return result


@SETTINGS
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".sched", ".csv"]))
def test_random_bytes(tmp_path, data, suffix):
    run(tmp_path, "fuzz" + suffix, data)


@SETTINGS
@given(tokens=st.lists(st.sampled_from(TOKENS), max_size=60), suffix=st.sampled_from([".sched", ".csv"]))
def test_random_token_streams(tmp_path, tokens, suffix):
    run(tmp_path, "fuzz" + suffix, " ".join(tokens).encode())


@pytest.mark.slow
@SETTINGS
@given(name=st.sampled_from(sorted(LIBRARY)), data=st.data())
def test_mutated_library_files(tmp_path, name, data):
    text = LIBRARY[name]
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, min(len(text), start + 12)))
    insert = data.draw(st.sampled_from([b"", b"(", b"}", b"F", b"B *", b"0", b"-1", b"9", b"\xff", b"p", b";"]))
    run(tmp_path, name, text[:start] + insert + text[end:])


def test_edge_inputs(tmp_path):
    assert run(tmp_path, "empty.sched", b"").exit_code == 2
    assert run(tmp_path, "empty.csv", b"").exit_code == 2
    assert run(tmp_path, "latin1.sched", b"schedule caf\xe9").exit_code == 2
    assert run(tmp_path, "latin1.csv", b"0F0,\xe9").exit_code == 2
    deep = b"schedule x\non device d { " + b"(" * 5000 + b"F" + b")" * 5000 + b" }\n"
    assert run(tmp_path, "deep.sched", deep).exit_code == 2
    assert run(tmp_path, "deep.csv", b"(" * 5000 + b"0F0" + b")" * 5000 + b"OVERLAP_F_B\n").exit_code in (1, 2)


def test_absurd_sizes_are_refused_quickly(tmp_path):
    start = time.monotonic()
    result = run(tmp_path, "1f1b.sched", LIBRARY["1f1b.sched"], "-D", "m=1000000000")
    assert result.exit_code == 2 and "refusing (--max-ops" in result.output
    assert time.monotonic() - start < 5
