# Tests of the launcher's "rank R failed first" (runtime/process/failures.py) on recorded ends of failed
# runs (tests/fixtures/failures: gloo runs of the runtime's own messages, NCCL runs of torch's watchdog
# lines and SIGABRT teardown), of the error file a rank records, and of the NCCL settings a launch gives.
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedc.runtime.process import failures
from schedc.runtime.process.failures import Report, first_error, ordered, rank_report, record_error, summary

FIXTURES = Path(__file__).parent / "fixtures" / "failures"


def _reports(case: Path) -> tuple[list[Report], dict]:
    ranks = json.loads((case / "ranks.json").read_text())
    reports = []
    for key, end in ranks.items():
        if not key.isdigit():
            continue
        log = case / f"rank{key}.log"
        reports.append(rank_report(int(key), end["how"], end["ended"], end["error_file"],
                                   log.read_text() if log.exists() else None, ranks.get("year")))
    return reports, ranks


@pytest.mark.parametrize("case", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_the_rank_that_failed_first_is_named_not_its_victims(case):
    reports, ranks = _reports(FIXTURES / case)
    line = summary(reports)
    assert line.startswith(f"error: rank {ranks['first']} failed first; failed: rank {ranks['first']} ("), line
    assert sorted(r.rank for r in ordered(reports)) == sorted(r.rank for r in reports)


def test_nccl_victims_are_read_from_their_glog_lines():
    reports, _ = _reports(FIXTURES / "nccl_oom")
    victim = next(r for r in reports if r.rank == 0)
    assert victim.victim and victim.line.startswith("[Rank 0] Watchdog caught collective operation timeout")
    assert victim.written is not None and not next(r for r in reports if r.rank == 2).victim


def test_the_old_rule_named_a_victim():
    """Before: any signal but SIGTERM first, so NCCL's SIGABRT teardown of a victim came ahead of the
    rank that ran out of memory (exit code 1)."""
    reports, _ = _reports(FIXTURES / "nccl_oom")
    old = sorted(reports, key=lambda r: (0 if r.how.startswith("killed by") and r.how != "killed by SIGTERM" else 1,
                                         r.ended, r.rank))
    assert old[0].rank == 0 and ordered(reports)[0].rank == 2


def test_glog_lines_warnings_skipped_and_the_runtimes_own_lines():
    log = ("[rank1]:[W1207 18:01:01.100000 7 x.cpp:1] a warning\n"
           "[rank1]:[E1207 18:01:31.500000 7 ProcessGroupNCCL.cpp:632] [Rank 1] boom\n")
    line, when = first_error(log, 2026)
    assert line == "[Rank 1] boom" and when is not None
    assert first_error("step 0\nerror: rank 1: ValueError: x\n", 2026) == ("error: rank 1: ValueError: x", None)
    assert first_error("nothing wrong\n", 2026) is None


def test_a_rank_records_its_line_once_in_torchruns_error_file(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    record_error("error: rank 1: first")
    record_error("error: rank 1: second")  # the first error is the one that counts
    data = json.loads(path.read_text())
    assert data["message"] == "error: rank 1: first" and isinstance(data["timestamp"], int) and data["written"] > 0
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    failure = ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(path))  # how torchrun reads it
    report = failures.report_of(1, failure)
    assert report.line == "error: rank 1: first" and report.how == "exit code 1" and report.written == data["written"]


def test_nothing_is_written_outside_torchrun(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    record_error("error: x")
    assert not list(tmp_path.iterdir())


def test_a_launch_gives_nccls_settings_unless_set(monkeypatch):
    from schedc.runtime.process import launch
    seen = {}
    monkeypatch.setattr(launch, "supervise", lambda child: 0)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda command, env: seen.update(env))
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    launch.launch("plan.json", 2)
    assert seen["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and seen["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert seen["TORCH_FR_BUFFER_SIZE"] == "10"  # the user's
