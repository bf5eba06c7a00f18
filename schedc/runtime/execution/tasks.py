# User tasks: plan instructions that are not built-in ops (e.g. K-FAC's `curvature_A`) run through a
# registry of handlers. A module registers handlers with `@register_task("name")` and is loaded with
# `--tasks pkg.mod`; `--ignore-tasks` runs tasks without a handler as no-ops.
from __future__ import annotations

import importlib
from typing import Any, Callable

from schedc.plan import Instr
from ..errors import UserError

# setup(executor), registered with `@register_setup`, runs once when an executor is built, before any
# step: a task module attaches its state and module hooks there (K-FAC captures layer inputs in F).
# handler(executor, instr): the executor exposes `stages` (stage -> module), `saved[(stage, mb)]`
# (the microbatch's stage input and output while alive), `rank` and `step`.
TaskHandler = Callable[[Any, Instr], None]
TASKS: dict[str, TaskHandler] = {}
SETUPS: list[Callable[[Any], None]] = []


class TaskError(UserError):
    """A task without a handler, or a task module that cannot be loaded."""


def register_task(name: str) -> Callable[[TaskHandler], TaskHandler]:
    def decorate(handler: TaskHandler) -> TaskHandler:
        TASKS[name] = handler
        return handler
    return decorate


def register_setup(setup: Callable[[Any], None]) -> Callable[[Any], None]:
    SETUPS.append(setup)
    return setup


def setup_tasks(executor: Any) -> None:
    for setup in SETUPS:
        setup(executor)


def load_task_modules(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise TaskError(f"--tasks {name!r}: {exc}") from None
        except BaseException as exc:  # noqa: BLE001 - the user's module failed while it was imported
            if isinstance(exc, KeyboardInterrupt):
                raise
            from ..process.plugins import user_failure
            raise TaskError(user_failure("--tasks", name, f"importing {name}", exc)) from None


def ignore_task(executor: Any, instr: Instr) -> None:
    """The handler of a task without one under --ignore-tasks."""


def task_handler(name: str, ignore_missing: bool) -> TaskHandler:
    handler = TASKS.get(name)
    if handler is not None:
        return handler
    if ignore_missing:
        return ignore_task
    raise TaskError(f"the plan uses task {name!r}, which has no handler here; the library's kfac add-on's "
                    "handlers come with --tasks schedc.runtime.kfac; for others, register one with "
                    "schedc.runtime.execution.tasks.register_task in a module given by --tasks, or pass "
                    "--ignore-tasks to run tasks as no-ops")
