"""Whether `schedc run` accepts a run command that tune prints: the plan compiled here and checked by
the runtime's own pre-launch check (the one `schedc run` makes before torchrun starts), run alone in a
child process (schedc/runtime/process/prelaunch.py: it needs torch, which the compiler never imports).
The runtime's check is the only list of what it runs; tune prints the command only where the check
passes, and its refusal otherwise."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..runtime.process import prelaunch  # its exit statuses; the module imports nothing (the child runs it)


@dataclass(frozen=True, slots=True)
class LocalRun:
    """A plan of `schedule` compiled with `defines` and run on `nproc` processes with `options`."""
    schedule: str
    defines: tuple[str, ...]
    nproc: int
    options: tuple[str, ...]


PLAN_SHOWN = "out/tune-local/plan.json"  # where the printed compile command writes the plan
CHECK = prelaunch.__name__  # the runtime's check alone: `python -m CHECK PLAN NPROC OPTIONS...`
CHECK_SECONDS = 120  # the child's check imports torch and reads the plan, seconds; one that hangs ends here


def run_refusal(run: LocalRun) -> str | None:
    """The runtime's refusal of `run` (its message), or None where `schedc run` would start it; without
    torch (the runtime's own requirement) the commands are not printed, and the line says why. The
    check runs in a child process: it imports torch, which the compiler's process never does."""
    from ..diagnostics import SchedError
    from ..driver import compile_file
    from ..plan.write import write_plan
    try:
        result = compile_file(run.schedule, list(run.defines))
    except SchedError as exc:
        return f"the plan does not compile: {exc.render().splitlines()[0]}"
    if not result.ok:
        return "the plan does not compile: it fails its checks"
    with tempfile.TemporaryDirectory(prefix="schedc-tune-") as scratch:
        write_plan(result.plan, scratch)
        path = str(Path(scratch) / "plan.json")
        try:
            checked = subprocess.run([sys.executable, "-m", CHECK, path, str(run.nproc), *run.options],
                                     capture_output=True, text=True, timeout=CHECK_SECONDS)
        except subprocess.TimeoutExpired:
            return f"not checked: the runtime's check did not end within {CHECK_SECONDS} s"
    said = checked.stdout.strip() or (checked.stderr.strip().splitlines() or [f"exit {checked.returncode}"])[-1]
    if checked.returncode == 0:
        return None
    if checked.returncode == prelaunch.REFUSED:
        return said.replace(f"{path}: ", "").replace(path, PLAN_SHOWN)
    return f"not checked: the runtime cannot be loaded here ({said})"
