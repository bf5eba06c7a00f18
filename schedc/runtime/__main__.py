# Entry point of one runtime process: `torchrun --nproc-per-node P -m schedc.runtime plan.json [options]`
# (or `python -m schedc.runtime plan.json --reference`). Errors are printed as one line, no traceback,
# unless --debug.
from __future__ import annotations

import os
import re
import signal
import sys
import time
import traceback

if __name__ == "__main__":  # Ctrl-C while torch loads ends the process quietly, not in an import's traceback
    signal.signal(signal.SIGINT, signal.SIG_DFL)

from schedc.plan import PlanError, load_plan  # noqa: E402 (after the handler)

from .errors import UserError, error_line
from .execution.executor import ExecutionError
from .process.failures import record_error
from .process.options import OptionError, parse_options

if __name__ == "__main__":  # loaded: Ctrl-C is a KeyboardInterrupt again, which main ends with exit 130
    signal.signal(signal.SIGINT, signal.default_int_handler)

USER_ERRORS = (UserError, PlanError)  # the runtime's root, and the plan format's own (schedc.plan)
PEER_LOST = re.compile(r"Connection (closed|reset) by peer|Broken pipe|Socket closed")
EXIT_USAGE, EXIT_FAILED = 2, 1


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", 0))
    if "TORCHELASTIC_RUN_ID" in os.environ:
        _die_with_agent()
    try:
        opts = parse_options(argv)
    except OptionError as exc:
        return _fail(rank, error_line(exc), EXIT_USAGE, only_rank0=True)
    for note in opts.notes if rank == 0 else ():
        print(note, file=sys.stderr, flush=True)
    try:
        return _run(opts)
    except USER_ERRORS as exc:
        return _fail(rank, f"error: {exc}", EXIT_FAILED, only_rank0=True, debug=opts.debug)
    except ExecutionError as exc:
        return _fail(rank, f"error: {exc}", EXIT_FAILED, debug=opts.debug)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a backend error outside an instruction (barrier, gather, ...)
        text = str(exc).strip().splitlines()
        first = text[0] if text else ""
        if PEER_LOST.search(first):  # gloo's words for a peer that exited or crashed
            return _fail(rank, f"error: rank {rank}: lost its connection to another rank, which probably failed "
                         f"or was stopped first ({_sentence(first[first.find(']') + 1:])})", EXIT_FAILED,
                         debug=opts.debug)
        return _fail(rank, f"error: rank {rank}: {type(exc).__name__}: {first} "
                     "(--debug shows the traceback)", EXIT_FAILED, debug=opts.debug)


def _sentence(text: str) -> str:
    """The first sentence of a library's message."""
    return re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0].rstrip(".")


def _run(opts) -> int:
    from .process.plugins import limit_user_code
    limit_user_code(opts.timeout)  # a model builder or data function that never returns ends the run
    plan = load_plan(opts.plan)
    if opts.threads:
        import torch
        torch.set_num_threads(opts.threads)
    if opts.reference:
        from .model.reference import run_reference
        return run_reference(plan, opts)
    from .model.train import run_pipeline
    return run_pipeline(plan, opts)


def _die_with_agent() -> None:
    """Under torchrun, end with the agent that started this process (Linux: PR_SET_PDEATHSIG): an
    agent killed with its machine's job must not leave its worker training on, alone, with the others."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the agent was gone before the call took effect
            os._exit(EXIT_FAILED)
    except (OSError, AttributeError):
        pass  # not Linux: the process group timeout still ends the others


QUIET_RANK_DELAY_S = 3.0  # a silent rank's head start for rank 0's message


def _fail(rank: int, message: str, code: int, only_rank0: bool = False, debug: bool = False) -> int:
    """Print the error (an error every rank finds alike: rank 0 only) and return the exit code. A rank
    that stays silent waits a little first: torchrun ends the others as soon as one exits, and a
    silent rank exiting first had rank 0 killed before it printed (the message was lost)."""
    if debug:
        traceback.print_exc()
    if rank == 0 or not only_rank0:
        print(message, file=sys.stderr, flush=True)
        record_error(message)  # for the launcher's "failed first" (process/failures.py)
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        time.sleep(QUIET_RANK_DELAY_S)
    return code


if __name__ == "__main__":
    sys.exit(main())
