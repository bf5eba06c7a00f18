"""The command line under hostile input, in process: a few hundred cases of benchmarks/fuzz_cli.py's
generators (tests/fuzz_cases.py: mutated library schedules, extreme -D values, malformed torch CSVs,
edited plans for render, bad options), each run through click's CliRunner under a limit of 20 s of CPU
time (CPU, not wall-clock: the test machine may be shared). None may
raise, exit outside {0, 1, 2}, leave an error about a .sched or .csv file unlocated, print inf or NaN
as an answer, print the stats of a schedule that fails its checks, or flood its output. The long run,
each case in its own process with a memory cap, is `python benchmarks/fuzz_cli.py`."""
from __future__ import annotations

import json
import signal

import pytest
from click.testing import CliRunner

import fuzz_cases
from fuzz_cases import DEFECTS, classify, write_case
from schedc.cli import main

CASES = 400
SEED = 20261201
LIMIT_S = 20
FLOOD = 1024 * 1024
pytestmark = pytest.mark.slow  # 400 command lines in process: several seconds


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("plans")
    plans = {}
    for name, defines in (("1f1b", ["-D", "p=2", "-D", "m=4"]), ("chimera", ["-D", "p=2", "-D", "m=4"]),
                          ("pipefisher", ["-D", "p=2", "-D", "m=2"])):
        result = CliRunner().invoke(main, ["compile", name, *defines, "-o", str(root / name)])
        assert result.exit_code == 0, result.output
        plans[name] = json.loads((root / name / "plan.json").read_text())
    cases = [c for c in fuzz_cases.cases(SEED, CASES, plans, allow_slow=False) if c.argv[0] not in ("run", "@api")]
    return cases, (root / "1f1b" / "plan.json").read_bytes()


class _Alarm(Exception):
    pass


def _raise_alarm(signum, frame):
    raise _Alarm()


def test_fuzzed_command_lines_keep_the_promise(generated, tmp_path, monkeypatch):
    cases, small_plan = generated
    monkeypatch.chdir(tmp_path)  # relative output paths (an empty one plus a suffix, `.csv`) land here
    assert len(cases) > 300 and {c.category for c in cases} >= {"sched", "define", "csv", "plan-render", "options"}
    failures = []
    previous = signal.signal(signal.SIGPROF, _raise_alarm)
    try:
        for n, case in enumerate(cases):
            directory = tmp_path / f"case{n}"
            write_case(case, directory, small_plan)
            signal.setitimer(signal.ITIMER_PROF, LIMIT_S)
            try:
                result = CliRunner().invoke(main, case.resolved(str(directory)))
                timed_out = isinstance(result.exception, _Alarm)
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            output = result.output
            if result.exception is not None and not isinstance(result.exception, (SystemExit, _Alarm)):
                outcome = f"traceback: {type(result.exception).__name__}: {result.exception}"
            else:
                outcome = classify(case, str(directory), result.exit_code, output, timed_out)
                if outcome not in DEFECTS and len(output) > FLOOD:
                    outcome = "flood"
            if outcome in DEFECTS or outcome.startswith("traceback"):
                failures.append(f"{outcome} [{case.category}] schedc {case.describe()[:200]}\n"
                                f"    {output.strip().splitlines()[:1]}")
    finally:
        signal.signal(signal.SIGPROF, previous)
    assert not failures, f"{len(failures)} of {len(cases)} cases broke the promise:\n" + "\n".join(failures[:20])


def test_fuzzed_torch_api_calls_return_or_raise_schedule_error(tmp_path, capsys):
    """The torch API's generated calls (fuzz_cases.api_case: sizes of every type, ranks out of range,
    misspelt formats, params repeating p or m, stages that are not this rank's) in process: each
    returns its documented value (exit 0) or raises ScheduleError (2); anything else raised fails."""
    import random
    rng = random.Random(SEED)
    cases = [fuzz_cases.api_case(rng, allow_slow=False) for _ in range(80)]
    codes = []
    for n, case in enumerate(cases):
        directory = tmp_path / f"api{n}"
        write_case(case, directory, b"")
        codes.append(fuzz_cases.api_main(case.argv[1:], str(directory)))
    capsys.readouterr()
    assert set(codes) == {0, 2}  # both outcomes met, and never a result of the wrong shape (3)
