"""The command line: schedc compile | check | simulate | tune | render | run | list | export | demo | calibrate.

Click lives here and nowhere else: `options` declares every option that more than one command takes
(and the layout's switches, once), `common` prints diagnostics and ends a command with its exit code,
one module per verb parses its own options and calls the library (the driver, render, the search, the
runtime's launcher). Heavy modules are imported inside the commands so that `schedc --help` answers at
once. Exit codes (diagnostics.exit_code, SchedError.exit_code): 0 ok, 1 a schedule that fails its
checks, 2 usage or syntax errors.
"""
from __future__ import annotations

import gc
from importlib import import_module

VERBS = ("compile", "check", "simulate", "tune", "list", "render", "export", "calibrate", "demo", "run")

# Loading the command line makes some thousands of classes and functions, which live as long as the
# process, and no garbage: the cyclic collector is paused while it loads and what is alive then is
# frozen (left out of later passes), as the compile's own objects are (driver.passes.collector_paused).
_collecting = gc.isenabled()
gc.disable()
try:
    from .group import main
    for _verb in VERBS:  # each module adds its command to `main`, in the order `schedc --help` lists them
        import_module(f".{_verb}", __name__)
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

__all__ = ["main", "VERBS"]
