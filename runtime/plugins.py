# User code the runtime loads by import path, `package.module:name` (--model, --data), with the error
# naming the option when the path is malformed or does not import.
from __future__ import annotations

import importlib
from typing import Any


def load_object(spec: str, option: str, error: type[Exception]) -> Any:
    """The object `name` of module `package.module`; `error` (naming `option`) when it cannot be had."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{option} {spec!r}: expected 'package.module:function'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise error(f"{option} {spec!r}: {exc}") from None
