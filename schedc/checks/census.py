"""census: the placed ops' identities against the ones the schedule must place, counted once for the
checks that need them (structure, deadlock). Linear, no per-op Python code: tuples hashed in C.

    1F1B p=2 m=1, device 1 runs F(1,0) only  ->  Census(placed={F(1,0), F(0,0), B(0,0)}, count=3,
                                                 expected={..., B(1,0)}); exact is False
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, product

from ..ir import OP_KEY, Schedule
from ..ops import BUILTIN, COPY, builtin_kinds


@dataclass(frozen=True, slots=True)
class Census:
    """The placed ops' identities against the expected ones (see Op.key)."""

    placed: frozenset[tuple]
    count: int                 # placed ops, copies included
    expected: frozenset[tuple]
    # every expected op placed exactly once, nothing else placed: compared once, as two checks read it
    # (at 10^6 ops a comparison of two sets of a million tuples, each hashed again)
    exact: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "exact", self.count == len(self.placed) and self.placed == self.expected)


def census(schedule: Schedule) -> Census:
    """Count the placed ops (tuples hashed in C; linear, no per-op Python code)."""
    ops = list(chain.from_iterable(schedule.orders))
    return Census(frozenset(map(OP_KEY, ops)), len(ops), frozenset(expected_keys(schedule)))


def expected_keys(schedule: Schedule) -> set[tuple]:
    """The identities of every op the orders must hold: the built-in grid plus the placed tasks. With a
    mixed backward, F and, per (stage, microbatch), I and W where the programs split it, else B."""
    keys: set[tuple] = set()
    for k, pipe in enumerate(schedule.pipelines):
        if schedule.mixed_backward:  # the units of each choice, then each choice's kinds over them
            units = {False: [], True: []}
            for s, mb in product(range(pipe.stages), pipe.microbatches):
                units[(k, s, mb) in schedule.split_of].append((s, mb))
            for split, chosen in units.items():
                keys.update((kind, s, mb, k, 0) for kind in builtin_kinds(split, schedule.recompute) for s, mb in chosen)
            continue
        keys.update(product(builtin_kinds(schedule.split_backward, schedule.recompute), range(pipe.stages), pipe.microbatches, (k,), (0,)))
    keys.update((kind, s, mb, k, 0) for k, s, mb in schedule.deps.offloaded for kind in COPY)  # both, or neither
    if schedule.tasks:
        unplaced = set(map(OP_KEY, schedule.unplaced))
        keys.update(key for key in map(OP_KEY, schedule.deps.explicit) if key[0] not in BUILTIN and key not in unplaced)
    return keys
