"""The `schedc` command group, which ends quietly on a closed pipe."""
from __future__ import annotations

import signal
import sys

import click
from click.utils import PacifyFlushWrapper

from .options import CONTEXT




class _Commands(click.Group):
    """The command group. A reader that stops early (`schedc simulate X | head -1`, `schedc --help |
    head -1`) ends the command quietly with 128 + SIGPIPE, as a shell tool the signal kills does, not
    with a failed check's 1 (click's own exit on a closed pipe, after it wraps the streams)."""

    def invoke(self, ctx: click.Context):
        out = super().invoke(ctx)
        sys.stdout.flush()  # a closed pipe shows here, inside click, not at the interpreter's exit
        return out

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, **kwargs)
        except SystemExit as exc:
            if exc.code == 1 and isinstance(sys.stdout, PacifyFlushWrapper):  # click met EPIPE
                sys.exit(128 + signal.SIGPIPE)
            raise


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(package_name="schedc")
def main() -> None:
    """schedc: declare, check, simulate, draw and run pipeline-parallel training schedules.

    FILE may be a path or the name of a library schedule (see `schedc list`).
    """
