"""What the command line and the demo print about a compiled schedule: a summary and a per-device table."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..diagnostics import Severity
from ..text import MAX_SHOWN, listed, more, plural

if TYPE_CHECKING:
    from ..passes.compiled import Compiled


def _cycle(st) -> str:
    """What a filled schedule's makespan spans: its whole cycle of K step programs."""
    steps = st.get("cycle_steps", 1)
    return f" (the cycle of {steps} steps)" if steps > 1 else ""


def summary(result: Compiled) -> str:
    """The compile summary: sizes, makespan, bubble, utilization, peaks (and the fill, if any)."""
    s, st = result.schedule, result.stats
    peak = listed([f"{m:g}" for m in st["peak_memory"]], "/") + (
        f" (at most {max(st['peak_memory']):g})" if s.devices > MAX_SHOWN else "")
    lines = [f"{s.title}: {plural(s.devices, 'device')}, {plural(s.stages, 'stage')}, "
             f"{plural(s.microbatches, 'microbatch', 'microbatches')}, {plural(st['ops'], 'op')}"
             + (" a step, with the filled tasks' pieces besides" if "utilization_unfilled" in st else ""),
             f"  makespan {st['makespan']:g}{_cycle(st)}  bubble {st['bubble']:.4f}  "
             f"utilization {st['utilization']:.4f}  peak activations per device {peak}",
             f"  steady-state bubble: at most {max(st['idle_inside'], default=0):g} idle between a device's first and "
             "last op"]
    if st.get("peak_host_memory"):  # `offload F`: what the copies keep on the host
        lines.append(f"  offloaded to host: peak per device {listed([f'{m:g}' for m in st['peak_host_memory']], '/')}")
    if st.get("cycle_steps", 1) > 1 or "utilization_unfilled" in st:
        useful = (f" ({st['utilization_useful']:.4f} without the overhead of cut pieces)"
                  if st.get("utilization_useful", st["utilization"]) < st["utilization"] - 5e-5 else "")
        lines.append(f"  filled: utilization {st.get('utilization_unfilled', 0):.4f} -> {st['utilization']:.4f}"
                     f"{useful} over a cycle of {plural(st['cycle_steps'], 'step')}")
    return "\n".join(lines)


def device_table(result: Compiled) -> str:
    """Busy, idle and peak activations per device; `inside` is the idle time between the device's first
    and last op (zero bubble's steady-state bubble: the warm-up's and the drain's idle left out)."""
    st = result.stats
    inside = st["idle_inside"]
    rows = ["  device      busy      idle    inside   peak act"]
    devices = result.schedule.devices
    shown = range(min(devices, MAX_SHOWN))
    columns = [_aligned([column[d] for d in shown]) for column in (st["busy"], st["idle"], inside, st["peak_memory"])]
    for d in shown:
        busy, idle, ins, peak = (column[d] for column in columns)
        rows.append(f"  {d:>6} {busy:>9} {idle:>9} {ins:>9} {peak:>10}")
    if devices > MAX_SHOWN:
        rows.append(f"  {more(devices - MAX_SHOWN, 'devices')} (--json lists every device)")
    return "\n".join(rows)


def _aligned(values: list[float]) -> list[str]:
    """A column's numbers to the same decimals: as many as its most precise value needs (%g), at most 4."""
    decimals = max((len(f"{v:g}".partition(".")[2]) for v in values if "e" not in f"{v:g}"), default=0)
    return [f"{v:.{min(decimals, 4)}f}" for v in values]


def refusal(result: Compiled) -> str:
    """What simulate prints instead of stats for a schedule that fails its checks: its times are not a
    schedule's (a deadlocked one never finishes), so no makespan or utilization is shown."""
    s = result.schedule
    errors = sum(d.severity is Severity.ERROR for d in result.diagnostics)
    return (f"{s.name}: fails its checks ({plural(errors, 'error')} below); "
            "no stats for a schedule that cannot run")
