"""What the command line and the demo print about a compiled schedule: a summary and a per-device table."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .compiler import Compiled


def summary(result: Compiled) -> str:
    """The compile summary: sizes, makespan, bubble, utilization, peaks (and the fill, if any)."""
    s, st = result.schedule, result.stats
    params = " ".join(f"{k}={v}" for k, v in s.params.items())
    peak = "/".join(f"{m:g}" for m in st["peak_memory"])
    lines = [f"{s.name} ({params}): {s.devices} devices, {s.stages} stages, {s.microbatches} microbatches, "
             f"{st['ops']} ops",
             f"  makespan {st['makespan']:g}  bubble {st['bubble_fraction']:.4f}  "
             f"utilization {st['utilization']:.4f}  peak activations per device {peak}"]
    if st.get("cycle_steps", 1) > 1 or "utilization_unfilled" in st:
        lines.append(f"  filled: utilization {st.get('utilization_unfilled', 0):.4f} -> {st['utilization']:.4f}"
                     f" over a cycle of {st['cycle_steps']} steps")
    return "\n".join(lines)


def device_table(result: Compiled) -> str:
    """Busy, idle and peak activations per device."""
    st = result.stats
    rows = ["  device      busy      idle   peak act"]
    for d in range(result.schedule.devices):
        rows.append(f"  {d:>6} {st['busy'][d]:>9g} {st['idle'][d]:>9g} {st['peak_memory'][d]:>10g}")
    return "\n".join(rows)
