# User code the runtime loads by import path, `package.module:name` (--model-code, --data), with the error
# naming the option when the path is malformed or does not import. User code that raises anything while
# it is imported or called, SystemExit included (a module calling sys.exit(0) is not the run's success,
# nor sys.exit(3) its exit code), is reported as the user's code failing, naming the function: the
# runtime's error, exit 1.
from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Callable


def load_function(spec: str, option: str, error: type[Exception]) -> Callable:
    """The function `name` of module `package.module`; `error` (naming `option`) when it cannot be had
    or is not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{option} {spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
        found = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise error(f"{option} {spec!r}: {exc}") from None
    except BaseException as exc:  # noqa: BLE001 - the user's module failed while it was imported
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise error(user_failure(option, spec, f"importing {module_name}", exc)) from None
    if not callable(found):
        raise error(f"{option} {spec!r}: {attr} is not a function (its type is {type(found).__name__})")
    return found


def user_failure(option: str, spec: str, where: str, exc: BaseException) -> str:
    """The message of user code that failed: the option, the function, and what it raised."""
    if isinstance(exc, SystemExit):
        raised = f"SystemExit({exc.code!r}): it called sys.exit() (user code must return or raise)"
    else:
        text = str(exc).strip().splitlines()
        raised = type(exc).__name__ + (f": {text[0][:200]}" if text else "")
    return f"{option} {spec!r}: the user's code failed in {where}: {raised}"


_LIMIT = [None]  # seconds a call of user code may take: the run's --timeout (limit_user_code)


def limit_user_code(seconds: float | None) -> None:
    """Hold every later call_user to `seconds` (the run's --timeout); None: no limit."""
    _LIMIT[0] = seconds


def call_user(function: Callable, option: str, spec: str, error: type[Exception], *args):
    """function(*args), user code: anything it raises (SystemExit too) becomes `error`, naming it; a
    call that does not return within the run's --timeout ends the process (exit 1), naming it."""
    name = getattr(function, "__qualname__", None) or getattr(function, "__name__", repr(function))
    timer = None
    if _LIMIT[0] is not None:
        timer = threading.Timer(_LIMIT[0], _overrun, (f"error: {option} {spec!r}: the user's code did not return "
                                                      f"from {name}() within --timeout {_LIMIT[0]:g} s",))
        timer.daemon = True
        timer.start()
    try:
        return function(*args)
    except BaseException as exc:  # noqa: BLE001 - whatever user code raises is the user's code failing
        if isinstance(exc, (KeyboardInterrupt, error)):
            raise
        raise error(user_failure(option, spec, f"{name}()", exc)) from None
    finally:
        if timer is not None:
            timer.cancel()


def _overrun(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(1)
