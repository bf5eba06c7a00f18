"""outputs: writes land in the file a symlink names, in place on pipes, atomically on files, and `-`
is the standard output; every failure a usage error naming the path."""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedc.cli import main
from schedc.diagnostics import SchedError
from schedc.outputs import destination, write_output


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    target, link = tmp_path / "target.csv", tmp_path / "link.csv"
    target.write_text("old\n")
    target.chmod(0o640)
    link.symlink_to("target.csv")
    write_output(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == "target.csv"
    assert target.read_text() == "new\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "target.csv"]  # no temporary left


def test_a_dangling_symlink_makes_its_target_and_a_chain_is_followed(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("sub/c.txt")
    write_output(tmp_path / "a", b"x")
    assert (tmp_path / "sub" / "c.txt").read_bytes() == b"x" and (tmp_path / "a").is_symlink()
    assert destination(tmp_path / "a") == (tmp_path / "sub" / "c.txt", False)


def test_a_symlink_loop_and_a_link_to_a_directory_are_usage_errors(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dir").mkdir()
    (tmp_path / "to_dir").symlink_to("dir")
    for path, why in ((tmp_path / "loop", "too many levels of symbolic links"),
                      (tmp_path / "to_dir", "it is a directory")):
        with pytest.raises(SchedError) as caught:
            write_output(path, "x")
        assert caught.value.exit_code == 2 and f"cannot write {path}: {why}" in caught.value.render()
    assert list((tmp_path / "dir").iterdir()) == []


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_output(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert received == [b"through the pipe\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert destination(fifo) == (fifo, True)
    (tmp_path / "to_pipe").symlink_to("pipe")
    assert destination(tmp_path / "to_pipe") == (fifo, True)


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "kept.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        from schedc.outputs import open_output
        with open_output(target) as stream:
            stream.write(b"half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]


def test_a_file_named_like_the_old_temporary_is_not_touched(tmp_path):
    (tmp_path / "x.csv.tmp").write_text("the user's")
    assert CliRunner().invoke(main, ["export", "1f1b", "-o", str(tmp_path / "x.csv")]).exit_code == 0
    assert (tmp_path / "x.csv.tmp").read_text() == "the user's"


def test_dash_is_the_standard_output_for_text_and_a_usage_error_elsewhere(tmp_path):
    exported = CliRunner().invoke(main, ["export", "1f1b", "-D", "p=2", "-D", "m=2", "-o", "-"])
    assert exported.exit_code == 0 and exported.output == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", exported.output
    assert not Path("-").exists()
    compiled = CliRunner().invoke(main, ["compile", "1f1b", "-o", "-"])
    assert compiled.exit_code == 2 and "compile writes a directory" in compiled.output
    rendered = CliRunner().invoke(main, ["render", "1f1b", "-o", "-"])
    assert rendered.exit_code == 2 and "-: error: render picks its format by OUT's extension" in rendered.output
    for result in (compiled, rendered):
        assert "Traceback" not in result.output


def test_a_link_to_the_standard_output_is_written_in_place_and_followed_by_nothing(tmp_path):
    """As `-o /dev/stdout` (a link to /proc/self/fd/1): the CSV goes to the process's standard output,
    the link is never replaced, and no "wrote" line is printed after the data."""
    import subprocess
    import sys
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    captured = tmp_path / "captured.csv"
    with open(captured, "wb") as stream:
        done = subprocess.run([sys.executable, "-m", "schedc.cli", "export", "1f1b", "-D", "p=2", "-D", "m=2",
                               "-o", str(link)], stdout=stream, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr
    assert captured.read_text() == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n" and link.is_symlink()
