# The runtime's one root of user errors. A user error is something the user can fix in what they gave
# (an option, a model or data module, a plan that does not fit the processes, a checkpoint): every
# module's own error class derives from UserError, and `python -m schedc.runtime` reports any of them
# once, on rank 0, as a short message with exit 1 (options: 2), never a traceback. Failures of a rank
# while it runs (ExecutionError, a lost peer) are not user errors: each rank reports its own.
from __future__ import annotations


class UserError(ValueError):
    """Something the user gave that the runtime cannot run; the message says what and how to fix it."""

    located = False  # True: the message is `path:line:col: error: ...` already


def error_line(exc: Exception) -> str:
    """How a user error is printed: `error: message`, or a located one as it is."""
    return str(exc) if getattr(exc, "located", False) else f"error: {exc}"
