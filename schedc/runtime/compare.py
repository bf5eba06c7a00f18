# `schedc run PLAN ... --compare-to-reference`: the run's first-step gradients and loss against the
# one-process reference's on the same model, data and seed, per parameter group and overall, as
# relative differences (||run - reference|| / ||reference|| per tensor; the loss's |difference| over
# |reference loss|). The two dumps are the files --save-grads writes (grads.pt, loss.json).
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

TOLERANCE = 1e-5  # fp32's: summation order differs between a schedule and one process


@dataclass(frozen=True, slots=True)
class Comparison:
    """Relative differences: the loss's, each parameter group's worst, the worst tensor overall."""

    loss: float
    groups: tuple[tuple[str, float], ...]
    worst: tuple[str, float]
    missing: tuple[str, ...]    # in the reference, not in the run
    extra: tuple[str, ...]      # in the run, not in the reference

    def within(self, tolerance: float) -> bool:
        return not (self.missing or self.extra) and max(self.loss, self.worst[1]) <= tolerance

    def lines(self, tolerance: float) -> list[str]:
        width = max((len(name) for name, _ in self.groups), default=4)
        out = [f"{'loss':<{width}}  {self.loss:.1e}"]
        out += [f"{name:<{width}}  {error:.1e}" for name, error in self.groups]
        out.append(f"largest gradient difference {self.worst[1]:.1e} ({self.worst[0]}), loss {self.loss:.1e}")
        out += [f"missing from the run: {name}" for name in self.missing]
        out += [f"not in the reference: {name}" for name in self.extra]
        verdict = "within" if self.within(tolerance) else "NOT within"
        out.append(f"{verdict} --tolerance {tolerance:.1e}")
        return out


def group_of(name: str) -> str:
    """A parameter's group: its name up to its first layer index (`blocks.3.qkv.weight` -> `blocks.3`,
    `model.layers.0.mlp.up_proj.weight` -> `model.layers.0`), else its first part (`embed.tok.weight`
    -> `embed`)."""
    parts = name.split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:k + 1])
    return parts[0]


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if got.shape != want.shape:
        return float("inf")
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


def compare(run: dict[str, torch.Tensor], run_loss: float, reference: dict[str, torch.Tensor],
            reference_loss: float) -> Comparison:
    errors = {name: relative(run[name], want) for name, want in reference.items() if name in run}
    groups: dict[str, float] = {}
    for name, error in errors.items():
        groups[group_of(name)] = max(groups.get(group_of(name), 0.0), error)
    worst = max(errors.items(), key=lambda item: item[1], default=("(no parameters)", 0.0))
    loss = abs(run_loss - reference_loss) / max(abs(reference_loss), 1e-12)
    return Comparison(loss, tuple(groups.items()), worst, tuple(n for n in reference if n not in run),
                      tuple(n for n in run if n not in reference))


def load_dump(directory: str | Path) -> tuple[dict[str, torch.Tensor], float]:
    """(gradients by name, loss) from a --save-grads directory."""
    directory = Path(directory)
    grads = torch.load(directory / "grads.pt", map_location="cpu", weights_only=True)
    loss = json.loads((directory / "loss.json").read_text())["loss"]
    return grads, float(loss)


def compare_dumps(run_dir: str | Path, reference_dir: str | Path) -> Comparison:
    (grads, loss), (ref_grads, ref_loss) = load_dump(run_dir), load_dump(reference_dir)
    return compare(grads, loss, ref_grads, ref_loss)
