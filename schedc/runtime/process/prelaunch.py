"""`python -m schedc.runtime.process.prelaunch PLAN NPROC [OPTIONS ...]`: the pre-launch check of
`schedc run` (launch.check_launch: the options, the plan against them, --nproc, the disk, the machine)
and nothing else, in a process of its own. tune runs it on the run command it prints
(schedc/cli/runnable.py), so the compiler's process never imports torch, which the check needs.

    exit 0: `schedc run` would start it;  2: refused, the message on stdout;
    3: the runtime cannot be loaded here (no torch), why on stdout
"""
from __future__ import annotations

import sys

REFUSED, UNLOADABLE = 2, 3


def main(argv: list[str]) -> int:
    from .launch import LaunchError, check_launch  # imports nothing heavy: the check imports torch
    plan, nproc, *options = argv
    try:
        check_launch(plan, int(nproc), options, [])
    except LaunchError as exc:
        print(exc)
        return REFUSED
    except ImportError as exc:  # torch (a user's module that fails to import is a LaunchError)
        print(exc)
        return UNLOADABLE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
