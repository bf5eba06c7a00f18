"""The `schedc` command group, which ends quietly on a closed pipe."""
from __future__ import annotations

import errno
import os
import signal
import sys
from contextlib import contextmanager

import click

from .common import end
from .options import CONTEXT


@contextmanager
def _closed_pipe_ends_quietly():
    """A write to a reader that has gone (EPIPE) exits with 128 + SIGPIPE, stdout pointed at the null
    device so that the interpreter's last flush at exit has nowhere to fail."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):  # a stream without a descriptor (tests' CliRunner)
            pass
        end(128 + signal.SIGPIPE)


class _Commands(click.Group):
    """The command group. A reader that stops early (`schedc simulate X | head -1`, `schedc --help |
    head -1`) ends the command quietly with 128 + SIGPIPE, as a shell tool the signal kills does, not
    with a failed check's 1 (what click itself exits with on a closed pipe): the closed pipe is met
    here, in the parse (where --help prints) or the command, before click sees it."""

    whole_process = False  # the command line's own process (main() with no args), not a caller's

    def main(self, args=None, *rest, **kwargs):
        self.whole_process = args is None
        return super().main(args, *rest, **kwargs)

    def make_context(self, *args, **kwargs) -> click.Context:
        with _closed_pipe_ends_quietly():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context):
        with _closed_pipe_ends_quietly():
            out = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return out


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(package_name="schedc")
def main() -> None:
    """schedc: declare, check, simulate, draw and run pipeline-parallel training schedules.

    FILE may be a path or the name of a library schedule (see `schedc list`).
    """
