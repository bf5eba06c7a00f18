# User code the runtime loads by import path, `package.module:name` (--model, --data), with the error
# naming the option when the path is malformed or does not import.
from __future__ import annotations

import importlib
from typing import Callable


def load_function(spec: str, option: str, error: type[Exception]) -> Callable:
    """The function `name` of module `package.module`; `error` (naming `option`) when it cannot be had
    or is not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{option} {spec!r}: expected 'package.module:function'")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise error(f"{option} {spec!r}: {exc}") from None
    if not callable(found):
        raise error(f"{option} {spec!r}: {attr} is not a function (its type is {type(found).__name__})")
    return found
