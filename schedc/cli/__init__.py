"""The command line: schedc compile | check | simulate | tune | render | run | list | export | demo | calibrate.

Click lives here and nowhere else: `options` declares every option that more than one command takes
(and the layout's switches, once), `common` prints diagnostics and ends a command with its exit code,
one module per verb parses its own options and calls the library (the driver, render, the search, the
runtime's launcher). Heavy modules are imported inside the commands so that `schedc --help` answers at
once. Exit codes (diagnostics.exit_code, SchedError.exit_code): 0 ok, 1 a schedule that fails its
checks, 2 usage or syntax errors.
"""
from __future__ import annotations

from importlib import import_module

from .group import main

VERBS = ("compile", "check", "simulate", "tune", "list", "render", "export", "calibrate", "demo", "run")
for _verb in VERBS:  # each module adds its command to `main`, in the order `schedc --help` lists them
    import_module(f".{_verb}", __name__)

__all__ = ["main", "VERBS"]
