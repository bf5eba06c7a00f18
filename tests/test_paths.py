"""Output paths checked before any work (schedc/plan/paths.py): no output on an input of the same command or
on another output, outputs regular files in places that can be written; the compiler's verbs refuse with
exit 2 and change nothing; the runtime's checkpoints prune only the step folders schedc wrote."""
from __future__ import annotations

import os
import shutil

from click.testing import CliRunner

from conftest import ROOT
from schedc.cli import main
from schedc.plan.paths import clash, unwritable
from schedc.runtime.execution.checkpoint import MARKER, is_checkpoint_step

LIBRARY = ROOT / "schedc" / "schedules"


def test_an_output_on_an_input_or_on_another_output_is_named(tmp_path):
    read = tmp_path / "in.sched"
    read.write_text("x")
    assert clash([("FILE", str(read))], [("-o", str(read))]) == \
        f"-o {read} is FILE {read}: the command would overwrite what it reads"
    link = tmp_path / "link.sched"
    link.symlink_to(read)  # the same file by another name
    assert clash([("FILE", str(read))], [("-o", str(link))]).startswith(f"-o {link} is FILE")
    out = str(tmp_path / "new" / ".." / "x.json")  # not made yet: compared by resolved path
    assert clash([], [("--report-out", out), ("--profile-out", str(tmp_path / "x.json"))]) == \
        f"--profile-out {tmp_path / 'x.json'} and --report-out {out} name one file: one would replace the other"
    assert clash([("FILE", str(read))], [("-o", "-"), ("-o2", None), ("-o3", str(tmp_path / "y"))]) is None


def test_what_cannot_be_written_is_said(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert unwritable(str(tmp_path)) == f"{tmp_path} is a directory"
    assert unwritable(str(fifo)) == f"{fifo} is not a regular file (a FIFO, a device or a socket)"
    assert unwritable(str(blocker / "sub" / "x.json")) == f"{blocker} is not a directory"
    assert unwritable(str(blocker), directory=True) == f"{blocker} exists and is not a directory"
    assert unwritable(str(tmp_path / "a" / "b" / "x.json")) is None  # its folders are made
    assert unwritable(str(tmp_path), directory=True) is None


def _same_after(path, command):
    before = path.read_bytes()
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    assert path.read_bytes() == before
    return result.output


def test_export_render_and_compile_refuse_to_overwrite_what_they_read(tmp_path):
    mine = tmp_path / "my.sched"
    shutil.copy(LIBRARY / "1f1b.sched", mine)
    out = _same_after(mine, ["export", str(mine), "-o", str(mine)])
    assert f"-o {mine} is FILE {mine}: the command would overwrite what it reads" in out
    assert CliRunner().invoke(main, ["compile", str(mine), "-o", str(tmp_path / "pl")]).exit_code == 0
    plan = tmp_path / "pl" / "plan.json"
    out = _same_after(plan, ["render", str(plan), "-o", str(plan)])
    assert "the command would overwrite what it reads" in out and "Traceback" not in out
    costs = tmp_path / "c2" / "plan.json"  # measured costs kept where the new plan would go
    costs.parent.mkdir()
    costs.write_text('{"F": 1, "B": 2}')
    out = _same_after(costs, ["compile", str(mine), "--costs", str(costs), "-o", str(tmp_path / "c2")])
    assert f"-o {tmp_path / 'c2' / 'plan.json'} is --costs {costs}" in out


def test_only_the_step_folders_schedc_wrote_are_checkpoint_steps(tmp_path):
    ours, theirs, named = tmp_path / "step-00000004", tmp_path / "step-plots", tmp_path / "step-00000002"
    for folder in (ours, theirs, named):
        folder.mkdir()
    (ours / MARKER).write_text("")
    (theirs / MARKER).write_text("")   # a marker in a folder of another name: still not ours
    assert is_checkpoint_step(ours) and not is_checkpoint_step(theirs) and not is_checkpoint_step(named)


def test_an_empty_output_name_is_refused_not_a_traceback():
    result = CliRunner().invoke(main, ["export", "1f1b", "-o", ""])
    assert result.exit_code == 2 and "Traceback" not in result.output and result.exception is None or \
        isinstance(result.exception, SystemExit), result.output
