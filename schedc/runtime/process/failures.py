# Which rank failed first, from what each rank left: its first error line and when it wrote it (the
# runtime records its own lines in torchrun's per-rank error file: record_error), how it ended, when
# torchrun saw it end. A rank that only reports the failure of another (a lost peer, a timed-out
# receive or collective, NCCL's watchdog tearing its communicator down) is a victim; the first rank
# with an error of its own, or one that died or hung without a word, is named first.
#
#   gloo:  rank 1 killed by SIGKILL; rank 0 "receive from rank 1 failed, rank 1 is probably lost"
#   NCCL:  rank 2 "torch.OutOfMemoryError: CUDA out of memory" at 12:00:01.2; ranks 0, 1, 3 "Watchdog
#          caught collective operation timeout" at 12:00:31, then SIGABRT (TORCH_NCCL_ASYNC_ERROR_HANDLING)
#   -> rank 1 first, then rank 2 first; the victims after them
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime

VICTIM = re.compile(
    r"probably lost|lost or stuck|lost its connection|Connection (closed|reset) by peer|Broken pipe|Socket closed"
    r"|Watchdog caught collective operation timeout|collective operation timeout|Received a dump signal"
    r"|NCCL communicator was aborted|ncclRemoteError|remote process exited|Some NCCL operations have failed"
    r"|timed out|Timed out")
SUSPECT = re.compile(r"(?:waiting for|receive from|send to) rank (\d+)")
GLOG = re.compile(r"^(?:\[rank\d+\]:)?\[([EF])(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)")  # [rank1]:[E1207 18:01:02.123456

# torch's NCCL settings the launcher gives the ranks unless set already: a failed or timed-out
# collective tears the rank down (no hang), and a timeout dumps NCCL's flight recorder of each rank
NCCL_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_BUFFER_SIZE": "2000"}  # the flight recorder (torch 2.13's name; TORCH_NCCL_TRACE_BUFFER_SIZE before)


@dataclass(frozen=True, slots=True)
class Report:
    """What one rank left: how it ended ("exit code 1", "killed by SIGKILL"), when torchrun saw it end
    (seconds since the epoch), and its first error line and when it was written, where it left one."""

    rank: int
    how: str
    ended: float
    line: str | None = None
    written: float | None = None

    @property
    def victim(self) -> bool:
        return self.line is not None and VICTIM.search(self.line) is not None


def ordered(reports: list[Report]) -> list[Report]:
    """The ranks, the one that failed first first: ranks with an error of their own, by when they wrote
    it; ranks that died by a signal torchrun did not send (SIGKILL, a crash, a stopped rank killed
    after ignoring SIGTERM), by when they ended; ranks the victims name as the one they waited for,
    the most named first; ranks that said nothing (stuck, or ended by torchrun before their own
    timeout), by when they ended; last the victims (a lost peer or a timeout in their line, NCCL's
    SIGABRT teardown), by time. With no error of its own anywhere the first named is a best guess:
    NCCL's flight recorder dumps (TORCH_NCCL_DUMP_ON_TIMEOUT) say which collective each rank reached."""
    named = [int(m.group(1)) for r in reports if r.victim for m in [SUSPECT.search(r.line)] if m]

    def key(r: Report) -> tuple:
        if r.line is not None and not r.victim:
            return (0, r.written or r.ended, r.rank)
        if r.victim or r.how == "killed by SIGABRT":
            return (4, r.written or r.ended, r.rank)
        if r.how.startswith("killed by") and r.how != "killed by SIGTERM":
            return (1, r.ended, r.rank)
        if r.rank in named:
            return (2, -named.count(r.rank), r.rank)
        return (3, r.ended, r.rank)
    return sorted(reports, key=key)


def summary(reports: list[Report]) -> str:
    order = ordered(reports)
    words = [f"rank {r.rank} ({r.how})" for r in order]
    return f"error: rank {order[0].rank} failed first; failed: {', '.join(words)}"


def first_error(log: str, year: int) -> tuple[str, float | None] | None:
    """A rank's first error line in its log and, for a glog line of torch's C++ side (`[rank1]:[E1207
    18:01:02.123456 pid file.cpp:12] message`, the year not written: `year`), its time; the runtime's
    own `error: ...` lines carry none (their time is in the error file)."""
    for raw in log.splitlines():
        glog = GLOG.match(raw)
        if glog:
            stamp = f"{year}-{glog.group(2)}-{glog.group(3)}T{glog.group(4)}"
            return raw[raw.index("]", glog.end()) + 1:].strip(), datetime.fromisoformat(stamp).timestamp()
        if raw.startswith("error: "):
            return raw, None
    return None


def rank_report(rank: int, how: str, ended: float, error_file: dict | None, log: str | None = None,
                year: int | None = None) -> Report:
    """One rank's Report: its line from the error file it recorded, else from its log (torchrun's
    --log-dir with --tee or --redirects), else none."""
    data = error_file or {}
    if isinstance(data.get("message"), str):
        return Report(rank, how, ended, data["message"], data.get("written"))
    found = first_error(log, year or datetime.now().year) if log else None
    return Report(rank, how, ended, *(found or (None, None)))


def record_error(line: str) -> None:
    """Under torchrun, this rank's error line and the time now into its error file (torchrun's
    TORCHELASTIC_ERROR_FILE), where the launcher reads it to name the rank that failed first."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    now = time.time()
    try:
        with open(path, "w") as handle:
            json.dump({"message": line, "timestamp": int(now), "written": now}, handle)
    except OSError:
        pass  # the summary then orders this rank by how it ended


def report_of(rank: int, failure) -> Report:
    """A Report from torchrun's ProcessFailure (its error file read where the rank wrote one)."""
    how = f"killed by {failure.signal_name()}" if failure.exitcode is not None and failure.exitcode < 0 \
        else f"exit code {failure.exitcode}"
    data = getattr(failure, "error_file_data", None)
    return rank_report(rank, how, float(failure.timestamp), data if isinstance(data, dict) else None)
