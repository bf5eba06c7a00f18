"""Colours and labels shared by every drawing: one hue per op kind, one shade per pipeline or chunk.

F is blue and B green as in Megatron-LM's figures; split backward gets orange I and teal W, a placed recompute violet R; each user
task kind takes the next colour of a fixed palette in sorted-name order. Ops of a device's second
chunk (interleaved) or of a second pipeline (Chimera's `up`) are drawn in lighter shades of their hue;
a task kind keeps one colour.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Op, Schedule
from ..ops import OpKind, split_unit

KIND_COLOURS = {OpKind.F: "#3b6fb6", OpKind.B: "#3f9a4a", OpKind.I: "#e3872d", OpKind.W: "#2f9c95",
                OpKind.R: "#7a4fa3", OpKind.O: "#8c8c8c", OpKind.L: "#5a5a5a"}  # R violet; the copies grey
TASK_COLOURS = ("#d6404e", "#9467bd", "#c9a227", "#e377c2", "#8c564b", "#7f7f7f", "#17becf", "#bcbd22")
KIND_NAMES = {OpKind.F: "forward", OpKind.B: "backward", OpKind.I: "backward (input grad)",
              OpKind.W: "backward (weight grad)", OpKind.R: "recompute (forward again)",
              OpKind.O: "offload to host (copy engine)", OpKind.L: "reload from host (copy engine)"}


def mix(colour: str, white: float) -> str:
    """Blend `#rrggbb` with white (0 = the colour, 1 = white)."""
    rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * white):02x}" for c in rgb)


def text_colour(fill: str) -> str:
    r, g, b = (int(fill[k:k + 2], 16) for k in (1, 3, 5))
    return "#ffffff" if 0.299 * r + 0.587 * g + 0.114 * b < 150 else "#000000"


@dataclass(frozen=True, slots=True)
class Palette:
    """The fill colour of every (kind, pipeline, stage), and the legend entries in a fixed order."""

    kinds: tuple[str, ...]                     # kinds present: F B I W first, then tasks by name
    variant: dict[tuple[int, int], int]        # (pipe, stage) -> shade index
    variant_names: tuple[str, ...]             # shade index -> "down", "chunk 1", ... ("" when one shade)

    def fill(self, kind: str, pipe: int, stage: int) -> str:
        base = KIND_COLOURS.get(kind)
        if base is None:  # a task kind: one colour, whatever the pipeline
            return TASK_COLOURS[self._task_index(kind) % len(TASK_COLOURS)]
        shades = len(self.variant_names)
        shade = self.variant.get((pipe, stage), 0)
        return mix(base, 0.55 * shade / (shades - 1)) if shades > 1 else base

    def _task_index(self, kind: str) -> int:
        tasks = [k for k in self.kinds if k not in KIND_COLOURS]
        return tasks.index(kind) if kind in tasks else len(tasks)

    def legend(self) -> list[tuple[str, str]]:
        """(fill, text) per entry: every kind, in every shade for the built-in kinds."""
        out, first = [], self._first_of_shade()
        for kind in self.kinds:
            name = f"{kind} {KIND_NAMES[kind]}" if kind in KIND_NAMES else kind
            if kind in KIND_COLOURS and len(self.variant_names) > 1:
                out.extend((self.fill(kind, *first[v]), f"{kind} {self.variant_names[v]}") for v in sorted(first))
            else:
                out.append((self.fill(kind, *first.get(0, (0, 0))), name))
        return out

    def fill_of_shade(self, kind: str, shade: int) -> str:
        return self.fill(kind, *self._first_of_shade().get(shade, (0, 0)))

    def _first_of_shade(self) -> dict[int, tuple[int, int]]:
        """shade index -> the first (pipe, stage) drawn in it, found in one pass (a legend of 100,000
        chunks asked for each shade's by a scan of all of them: minutes)."""
        first: dict[int, tuple[int, int]] = {}
        for pipe_stage, shade in sorted(self.variant.items()):
            first.setdefault(shade, pipe_stage)
        return first


def palette(schedule: Schedule) -> Palette:
    """Shades: one per pipeline (when there are several) times one per chunk a device holds."""
    chunks = 1
    variant_of: dict[tuple[int, int], tuple[int, int]] = {}
    for k, pipe in enumerate(schedule.pipelines):
        seen: dict[int, int] = {}
        for s, device in enumerate(pipe.placement):
            c = seen.get(device, 0)
            seen[device] = c + 1
            variant_of[(k, s)] = (k, c)
            chunks = max(chunks, c + 1)
    many = len(schedule.pipelines) > 1
    names = []
    for k, pipe in enumerate(schedule.pipelines):
        for c in range(chunks):
            parts = ([pipe.name] if many else []) + ([f"chunk {c}"] if chunks > 1 else [])
            names.append(" ".join(parts))
    variant = {key: k * chunks + c for key, (k, c) in variant_of.items()}
    return Palette(kinds_present(schedule), variant, tuple(names) if len(names) > 1 else ("",))


def kinds_present(schedule: Schedule) -> tuple[str, ...]:
    kinds = {op.kind for program in schedule.steps for order in program for op in order}
    return tuple(k for k in KIND_COLOURS if k in kinds) + tuple(sorted(kinds - set(KIND_COLOURS)))


def op_label(op: Op) -> str:
    """The text in an op's box: its microbatch, as in the papers (a task without one: its kind); with
    sequence chunks microbatch.chunk (3.1), as Seq1F1B's figures number them."""
    if op.mb is None:
        return op.kind[:3]
    if op.kind in KIND_COLOURS and op.parts > 1:
        mb, chunk = split_unit(op.mb, op.parts)
        return f"{mb}.{chunk}"
    return str(op.mb)
