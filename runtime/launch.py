# Launching: `launch()` starts torchrun for `schedc run plan.json --nproc P [options] [-- torchrun args]`.
# On one machine it passes --standalone (a free port on localhost); multi-node runs pass torchrun's own
# --nnodes/--node-rank/--rdzv-backend/--rdzv-endpoint/--rdzv-id (or --master-addr/--master-port) after
# `--`, and then no --standalone is added. torchrun runs through this module's `main`, which reports a
# failed rank as one line instead of torchrun's traceback.
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RENDEZVOUS_FLAGS = ("--standalone", "--nnodes", "--rdzv", "--master", "--node")


def torchrun_command(plan_path: str | Path, nproc: int, options: list[str] = (),
                     torchrun_args: list[str] = ()) -> list[str]:
    """The full command line: this module (torchrun) + its flags + `-m schedc.runtime plan options`."""
    extra = list(torchrun_args)
    own_rendezvous = any(arg.startswith(RENDEZVOUS_FLAGS) for arg in extra)
    flags = ([] if own_rendezvous else ["--standalone"]) + ["--nproc-per-node", str(nproc)] + extra
    return [sys.executable, "-m", "schedc.runtime.launch", *flags,
            "-m", "schedc.runtime", str(plan_path), *options]


def launch(plan_path: str | Path, nproc: int, options: list[str] = (),
           torchrun_args: list[str] = ()) -> int:
    """Run the plan on `nproc` local processes (per node); return the exit status (0 = all ranks ok)."""
    try:
        return subprocess.call(torchrun_command(plan_path, nproc, options, torchrun_args))
    except KeyboardInterrupt:
        return 130


def launch_from_cli(plan_path: str | Path, nproc: int | None, args: list[str]) -> int:
    """`schedc run PLAN [--nproc P] [runtime options] [-- torchrun args]`: split the arguments at `--`;
    without --nproc, start the plan's devices x --dp processes."""
    options, torchrun_args = split_args(args, sys.argv)
    if nproc is None:
        nproc = default_nproc(plan_path, options)
        if nproc is None:
            print(f"error: {plan_path}: cannot read the plan to count its devices; pass --nproc",
                  file=sys.stderr)
            return 2
    return launch(plan_path, nproc, options, torchrun_args)


def split_args(args: list[str], argv: list[str]) -> tuple[list[str], list[str]]:
    """Runtime options and torchrun args: around `--` in args, or, where the command-line parser
    consumed the `--` (click does), around the place where argv's `--` was.

    >>> split_args(["--steps", "3", "--nnodes", "2"], ["schedc", "run", "p", "--steps", "3", "--", "--nnodes", "2"])
    (['--steps', '3'], ['--nnodes', '2'])
    """
    if "--" in args:
        split = args.index("--")
        return list(args[:split]), list(args[split + 1:])
    tail = argv[argv.index("--") + 1:] if "--" in argv else []
    if tail and list(args[-len(tail):]) == tail:
        return list(args[:-len(tail)]), tail
    return list(args), []


def default_nproc(plan_path: str | Path, options: list[str]) -> int | None:
    """The plan's devices x the --dp given among the runtime options (None if the plan is unreadable)."""
    from schedc.plan import PlanError, load_plan
    try:
        devices = load_plan(plan_path, verify=False).devices
    except PlanError:
        return None
    dp = 1
    for i, arg in enumerate(options):
        value = arg.split("=", 1)[1] if arg.startswith("--dp=") else (
            options[i + 1] if arg == "--dp" and i + 1 < len(options) else None)
        if value is not None and value.isdigit():
            dp = int(value)
    return devices * dp


def main(argv: list[str] | None = None) -> int:
    """torchrun, with a failed worker reported as `error: rank R failed first (...)`."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        print(_failure_line(exc.failures), file=sys.stderr, flush=True)
        return 1
    return 0


def _failure_line(failures: dict) -> str:
    """Name the rank that failed first; ranks the agent terminated (SIGTERM) after it come last."""
    def key(item):
        rank, failure = item
        return (_how(failure) == "killed by SIGTERM", failure.timestamp, rank)
    order = sorted(failures.items(), key=key)
    words = [f"rank {rank} ({_how(failure)})" for rank, failure in order]
    return f"error: rank {order[0][0]} failed first; failed: {', '.join(words)}"


def _how(failure) -> str:
    if failure.exitcode is not None and failure.exitcode < 0:
        return f"killed by {failure.signal_name()}"
    return f"exit code {failure.exitcode}"


if __name__ == "__main__":
    sys.exit(main())
