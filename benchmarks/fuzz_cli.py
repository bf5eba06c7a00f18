"""Fuzz the whole command line as a hostile user would, and count what breaks schedc's promise: a
located error and exit 0, 1 or 2, never a traceback, a hang or a misleading answer.

    python benchmarks/fuzz_cli.py --count 10000 [--seed 1] [--jobs 2] [--failures out/fuzz]
    python benchmarks/fuzz_cli.py --first 2500 --count 2500   # cases 2,500-4,999 of the same seed
    python benchmarks/fuzz_cli.py --cases 325,1888             # these cases of the seed again
    python benchmarks/fuzz_cli.py --summarize out/r.jsonl      # the table of --results files

The cases (tests/fuzz_cases.py) are grammar-aware mutations of every library schedule and fixture,
numeric extremes and junk in every -D, malformed torch CSVs of every shape, edited plans (hash
recomputed) for `render` and `run`, and bad options to every subcommand; tests/fuzz_layout.py adds the
layout's newest options, mutated config.json descriptions and cluster tables. Each case runs in its own
process, forked from this one after schedc is imported (so a case costs its own work, not Python's
start-up), with a limit of 20 s of CPU time (--timeout: the case and every process it starts, summed;
each of them is also stopped by the kernel past it) and an address-space cap (--memory-gib, 4 GiB);
CPU time, not wall-clock time, because the machine is shared (at a load of 10, 7 s of CPU took 26 s),
and a wall-clock guard (--wall-timeout, 180 s) for a case that waits without computing. `run` cases
start torchrun from there as a user's command would; they train one step of a tiny model
(fuzz_cases.TINY_RUN). --run-cap bounds how many run (the others are reported as skipped).

Printed: outcomes per category (ok, failed = exit 1, usage = exit 2, and the defects: traceback,
timeout, memory, bad-exit, unlocated, silent, nonfinite, invalid-stats), then one line per distinct
defect (category, outcome, the first line of its message, how many cases). --failures DIR keeps every
defective case's files and command line for reproduction.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_cases  # noqa: E402
import fuzz_layout  # noqa: E402
from fuzz_cases import DEFECTS, OUTCOMES, Case, classify, launched, write_case  # noqa: E402

PLAN_SOURCES = {"1f1b": ["-D", "p=2", "-D", "m=4"], "gpipe": ["-D", "p=2", "-D", "m=2"],
                "interleaved_1f1b": ["-D", "p=2", "-D", "v=2", "-D", "m=4"], "chimera": ["-D", "p=2", "-D", "m=4"],
                "pipefisher": ["-D", "p=2", "-D", "m=2"], "seq1f1b": ["-D", "p=2", "-D", "m=2", "-D", "k=2"],
                "offload_1f1b": ["-D", "p=2", "-D", "m=4"]}


def library_plans(workdir: Path) -> dict[str, dict]:
    """Small plans of the library, compiled once by this process (in a child, as the cases are), and the
    expert-parallel plan of fuzz_layout's runs."""
    from click.testing import CliRunner
    from schedc.cli import main
    plans = {}
    for name, defines in PLAN_SOURCES.items():
        out = workdir / f"plan-{name}"
        result = CliRunner().invoke(main, ["compile", name, *defines, "-o", str(out)])
        assert result.exit_code == 0, result.output
        plans[name] = json.loads((out / "plan.json").read_text())
        fuzz_cases.PLACEHOLDERS[f"@plan-{name}".encode()] = (out / "plan.json").read_bytes()
    ep_plan(workdir)
    return plans


def ep_plan(workdir: Path) -> None:
    """The plan of fuzz_layout's expert-parallel runs (1F1B, p = 2, m = 4, for tiny-mixtral under --ep 2
    --dp 2), compiled once: the runs' "@plan-ep"."""
    from click.testing import CliRunner
    from schedc.cli import main
    out = workdir / "plan-ep"
    result = CliRunner().invoke(main, ["compile", "1f1b", "-D", "p=2", "-D", "m=4", "--cluster", "dgx-h100-80gb",
                                       "--model", fuzz_layout.MIXTRAL, "--seq", "16", "--ep", "2", "--dp", "2",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    fuzz_cases.PLACEHOLDERS[b"@plan-ep"] = (out / "plan.json").read_bytes()


def make_checkpoint(workdir: Path) -> Path:
    """A real checkpoint of fuzz_cases.TINY_RUN on the small 1F1B plan (one step, two ranks), which
    the resume cases copy and resume under other options."""
    import subprocess
    ckpt = workdir / "ckpt"
    command = [sys.executable, "-m", "schedc.cli", "run", str(workdir / "plan-1f1b" / "plan.json"),
               *fuzz_cases.TINY_RUN, "--save", str(ckpt)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (ckpt / "latest.json").is_file(), done.stderr
    return ckpt


def start(case: Case, directory: Path, memory: int, cpu_limit: float) -> int:
    """Fork a child that runs `schedc ARGV` in `directory` (stdout, stderr to files there); its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler reports; a case just ends
        os.setsid()
        for fd, name in ((1, ".stdout"), (2, ".stderr")):
            handle = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(handle, fd)
            os.close(handle)
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(math.ceil(cpu_limit))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))  # SIGXCPU, then SIGKILL
        os.chdir(directory)
        argv = case.resolved(str(directory))
        sys.argv = ["schedc", *argv]
        from schedc.cli import main
        try:
            if case.argv[0] == "@api":
                code = fuzz_cases.api_main(case.argv[1:], str(directory))
            else:
                main(args=argv, prog_name="schedc")
                code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - what the fuzzer is looking for
            traceback.print_exc()
            code = 70
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except BaseException:  # noqa: BLE001
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(71)


FLOOD = 1024 * 1024  # more output than this from one case is a defect ("flood")
KEEP = 128 * 1024  # bytes kept of the head and of the tail of a case's output


def _read_capped(path: Path) -> str:
    """A case's output, its middle left out past 2 x KEEP bytes (a flood of diagnostics is a defect of
    its own, seen in the line count, not a reason for this process to hold gigabytes)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        if size <= 2 * KEEP:
            return handle.read().decode(errors="replace")
        head = handle.read(KEEP)
        handle.seek(size - KEEP)
        tail = handle.read()
    return (head.decode(errors="replace") + f"\n[... {size - 2 * KEEP} bytes left out ...]\n"
            + tail.decode(errors="replace"))


def finish(case: Case, directory: Path, status: int | None, timed_out: bool) -> tuple[str, str, bool]:
    """The case's outcome, output and whether it started torchrun; `timed_out` when it used up its CPU
    time or the wall-clock guard."""
    stdout, stderr = _read_capped(directory / ".stdout"), _read_capped(directory / ".stderr")
    code = None if status is None else (os.waitstatus_to_exitcode(status))
    code = None if code is not None and code < 0 else code
    output = stdout + "\n#stderr#\n" + stderr
    outcome = classify(case, str(directory), code, output, timed_out)
    size = (directory / ".stdout").stat().st_size + (directory / ".stderr").stat().st_size
    if size > FLOOD and outcome not in DEFECTS:
        outcome = "flood"
    return outcome, output, launched(case, code, output)


def run_all(cases: list[tuple[int, Case]], args, workdir: Path, small_plan: bytes, results: list):
    """Run the (index, case) pairs, appending (index, case, outcome, output, seconds) to `results` as
    they finish."""
    running: dict[int, tuple[int, Case, Path, float]] = {}
    queue = list(cases)
    memory = int(args.memory_gib * 2 ** 30)
    begun = time.monotonic()
    try:
        while queue or running:
            while queue and len(running) < args.jobs:
                index, case = queue.pop(0)
                directory = workdir / f"case-{index:06d}"
                write_case(case, directory, small_plan)
                pid = start(case, directory, memory, args.timeout)
                running[pid] = (index, case, directory, time.monotonic())
            time.sleep(0.002)
            for pid, (index, case, directory, started) in list(running.items()):
                done, status, usage = os.wait4(pid, os.WNOHANG)
                elapsed = time.monotonic() - started
                timed_out = False
                if not done and elapsed > args.wall_timeout:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    done, status, usage = os.wait4(pid, 0)
                    timed_out = True
                if not done:
                    continue
                cpu = usage.ru_utime + usage.ru_stime  # with every process it started and waited for
                timed_out = timed_out or cpu >= args.timeout or (
                    os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU)
                try:
                    os.killpg(pid, signal.SIGKILL)  # whatever the case left running (torchrun workers, dot)
                except (ProcessLookupError, PermissionError):
                    pass
                del running[pid]
                outcome, output, started = finish(case, directory, status, timed_out)
                results.append((index, case, outcome, output, elapsed, cpu, started))
                if args.results:
                    with open(args.results, "a") as handle:
                        handle.write(json.dumps({"case": index, "category": case.category, "outcome": outcome,
                                                 "cpu": round(cpu, 3), "wall": round(elapsed, 3), "launched": started,
                                                 "argv": case.describe()[:300],
                                                 "headline": headline(output) if outcome in DEFECTS else ""}) + "\n")
                if outcome in DEFECTS and args.failures:
                    keep = Path(args.failures) / f"{outcome}-{case.category}-{index:06d}"
                    shutil.copytree(directory, keep, dirs_exist_ok=True, ignore=_special_files)
                    (keep / "argv.json").write_text(json.dumps(case.argv))
                shutil.rmtree(directory, ignore_errors=True)
                if args.progress and len(results) % args.progress == 0:
                    print(f"  {len(results)} cases, {time.monotonic() - begun:.0f} s", file=sys.stderr, flush=True)
    finally:  # interrupted: end the cases still running (each leads a process group of its own)
        for pid in running:
            try:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _special_files(directory: str, names: list[str]) -> list[str]:
    """Devices and pipes a case made (reading the full device never ends): not copied."""
    return [n for n in names if not (os.path.isfile(os.path.join(directory, n)) or os.path.isdir(os.path.join(directory, n)))]


def headline(output: str) -> str:
    """The first line that says what went wrong, with the case's directory taken out."""
    lines = [x for x in output.splitlines() if x.strip() and x != "#stderr#"]
    for pattern in ("Error:", "Error", "error:", "rror"):
        for line in reversed(lines) if pattern.endswith("Error") else lines:
            if pattern in line:
                return _strip_dir(line)[:150]
    return _strip_dir(lines[-1])[:150] if lines else "(no output)"


def _strip_dir(line: str) -> str:
    import re
    return re.sub(r"\S*/case-\d+/?", "", re.sub(r"\d{2,}", "N", line))


def report(results, skipped: Counter, seconds: float) -> None:
    table: dict[str, Counter] = defaultdict(Counter)
    for _, case, outcome, *_ in results:
        table[case.category][outcome] += 1
    shown = [o for o in OUTCOMES if any(table[c][o] for c in table)] + ["skipped"] * bool(skipped)
    print(f"{'category':<12}" + "".join(f"{o:>14}" for o in shown) + f"{'cases':>8}")
    total = Counter()
    for category in sorted(table):
        row = table[category] + Counter({"skipped": skipped[category]})
        total += row
        print(f"{category:<12}" + "".join(f"{row[o]:>14}" for o in shown) + f"{sum(row.values()):>8}")
    print(f"{'all':<12}" + "".join(f"{total[o]:>14}" for o in shown) + f"{sum(total.values()):>8}")
    started = Counter(r[1].category for r in results if r[6])
    print("started torchrun: " + (", ".join(f"{c} {n}" for c, n in sorted(started.items())) or "none")
          + f" ({sum(started.values())} of {sum(1 for r in results if r[1].argv[:1] == ['run'])} run cases)")
    defects = sum(total[o] for o in DEFECTS)
    slowest = max((r[4] for r in results), default=0.0)
    most_cpu = max((r[5] for r in results), default=0.0)
    print(f"\n{len(results)} cases run in {seconds:.0f} s ({sum(skipped.values())} skipped), "
          f"most CPU {most_cpu:.1f} s, slowest {slowest:.1f} s wall; defects: {defects}")
    for defect in DEFECTS:
        print(f"  {defect}: {total[defect]}")
    heaviest = sorted(results, key=lambda r: -r[5])[:5]
    if heaviest:
        print("\nthe most CPU (seconds, category, case):")
    for index, case, _, _, _, cpu, _ in heaviest:
        print(f"  {cpu:6.1f} s  [{case.category}] #{index}: schedc {case.describe()[:140]}")
    groups: dict[tuple, list] = defaultdict(list)
    for index, case, outcome, output, elapsed, *_ in results:
        if outcome in DEFECTS:
            groups[(case.category, outcome, headline(output))].append((index, case, elapsed))
    if groups:
        print("\ndistinct defects (category, outcome, message, cases, e.g.):")
    for (category, outcome, line), found in sorted(groups.items(), key=lambda g: -len(g[1])):
        example = found[0][1].describe()
        print(f"  [{category}] {outcome} x{len(found)}: {line}\n      e.g. schedc {example[:160]}")


def summarize(paths: list[str]) -> None:
    """The markdown table of results files (--results; chunks of one seed): per category the cases, the
    outcomes, the defects, the runs that started torchrun and the CPU seconds. A case run again (--cases,
    into the same file) counts by its last line."""
    last: dict[int, dict] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            last[record["case"]] = record
    table: dict[str, Counter] = defaultdict(Counter)
    cpu: Counter = Counter()
    for record in last.values():
        row = table[record["category"]]
        row[record["outcome"] if record["outcome"] not in DEFECTS else "defects"] += 1
        row["cases"] += 1
        row["launched"] += record["launched"]
        cpu[record["category"]] += record["cpu"]
    columns = ("cases", "ok", "failed", "usage", "defects", "launched")
    print("| category | cases | ok (exit 0) | failed (exit 1) | usage (exit 2) | defects | started torchrun | CPU s |")
    print("|---|" + "---|" * 7)
    total, seconds = Counter(), 0.0
    for category in sorted(table):
        total += table[category]
        seconds += cpu[category]
        print(f"| {category} | " + " | ".join(f"{table[category][c]:,}" for c in columns) + f" | {cpu[category]:,.0f} |")
    print("| **all** | " + " | ".join(f"**{total[c]:,}**" for c in columns) + f" | **{seconds:,.0f}** |")
    worst = max(last.values(), key=lambda r: r["cpu"], default=None)
    if worst:
        print(f"\n{len(last):,} cases (0 to {max(last):,}), most CPU {worst['cpu']:.1f} s (case {worst['case']}, "
              f"{worst['category']}): schedc {worst['argv'][:120]}")
    for record in sorted(last.values(), key=lambda r: r["case"]):
        if record["outcome"] in DEFECTS:
            print(f"  defect: case {record['case']} [{record['category']}] {record['outcome']}: {record['headline']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--first", type=int, default=0, help="skip this many cases of the seed (run in chunks)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=20.0, help="CPU seconds per case (default 20)")
    parser.add_argument("--wall-timeout", type=float, default=180.0,
                        help="wall-clock seconds per case, for one that waits without computing (default 180)")
    parser.add_argument("--memory-gib", type=float, default=4.0, help="address-space cap per case")
    parser.add_argument("--run-cap", type=int, default=None, help="at most this many `schedc run` cases (default: all)")
    parser.add_argument("--results", default=None, help="append one JSON line per finished case to this file")
    parser.add_argument("--no-slow", action="store_true", help="leave out Graphviz and torchrun cases")
    parser.add_argument("--only", default=None, help="comma-separated categories to run")
    parser.add_argument("--cases", default=None, help="comma-separated case numbers to run (e.g. defects found)")
    parser.add_argument("--failures", default=None, help="keep defective cases here")
    parser.add_argument("--progress", type=int, default=1000, help="a line every N cases (0: none)")
    parser.add_argument("--summarize", default=None, help="comma-separated results files: print their table, run nothing")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize.split(","))
        return 0
    if args.count < 1 or args.first < 0 or args.jobs < 1 or not args.timeout > 0 or not args.memory_gib > 0 \
            or not args.wall_timeout > 0:
        parser.error("--count, --jobs, --timeout and --memory-gib must be positive")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import schedc.cli  # noqa: F401 - imported once, before forking
    import schedc.runtime.model.train  # noqa: F401 - torch and the runtime's checks too: a run case costs its own work
    workdir = Path(tempfile.mkdtemp(prefix="schedc-fuzz-"))
    try:
        plans = library_plans(workdir)
        if not args.no_slow:
            fuzz_cases.CHECKPOINT = make_checkpoint(workdir)
        small = (workdir / "plan-1f1b" / "plan.json").read_bytes()
        picked = sorted({int(n) for n in args.cases.split(",")}) if args.cases else None
        if picked:
            args.first, args.count = 0, picked[-1] + 1
        generated = fuzz_cases.cases(args.seed, args.first + args.count, plans, allow_slow=not args.no_slow)
        only = set(args.only.split(",")) if args.only else None
        chosen, skipped, runs = [], Counter(), 0
        for index, case in enumerate(generated[args.first:], args.first):
            if (only and case.category not in only) or (picked and index not in picked):
                continue
            if case.argv[:1] == ["run"]:
                runs += 1
                if args.run_cap is not None and runs > args.run_cap:
                    skipped[case.category] += 1
                    continue
            chosen.append((index, case))
        print(f"schedc fuzz: seed {args.seed}, {len(chosen)} of cases {args.first:,}-{len(generated) - 1:,}, "
              f"timeout {args.timeout:g} s CPU ({args.wall_timeout:g} s wall), memory cap {args.memory_gib:g} GiB, {args.jobs} at once", flush=True)
        begun, results = time.monotonic(), []
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill PID: report what finished
        try:
            run_all(chosen, args, workdir, small, results)
        except KeyboardInterrupt:
            print(f"interrupted: the counts below are of the {len(results)} cases that finished", flush=True)
        report(sorted(results, key=lambda r: r[0]), skipped, time.monotonic() - begun)
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
