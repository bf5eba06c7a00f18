# Measured activation memory: the bytes each forward of (stage, mb) saves for its backward, and over
# the step the peak of the live saved bytes and of the microbatches in flight per stage.
#
# The forward of (stage, mb) runs under a saved-tensor hook that notes the storage of every tensor
# autograd saves (and the inputs a recomputed region keeps instead of what it saves, runtime/execution/recompute.py):
# a storage shared by several saved tensors (q, k and v are views of one qkv output) counts once, at its
# size in bytes; parameters' and buffers' storages (model state: the rotary tables) are not counted; a storage of the step's batch (token ids and
# targets, microbatch views of one tensor) counts the bytes of the views saved, as a microbatch of its
# own would be on a GPU. A state is live from its forward to the instruction after which the executor
# drops it (runtime/execution/lifetimes.py); a storage held by two live states counts once in the live bytes.
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

Key = tuple[int, int]
_ACTIVE: list = []  # the recording in progress (one at a time: forwards do not nest)


def keep(*tensors: torch.Tensor) -> None:
    """Note tensors kept for backward outside autograd's saved tensors (a recomputed region's inputs)."""
    if _ACTIVE:
        for tensor in tensors:
            _ACTIVE[-1](tensor)


@dataclass
class SavedBytes:
    """Per rank: saved bytes per (stage, mb) forward, live bytes and states, and their peaks. A region
    (a storage, or a batch view) is live while a live state holds it and its storage exists (one freed
    inside a backward leaves the live bytes there)."""

    params: set[int]                                # data pointers of parameter storages
    batch: set[int] = field(default_factory=set)    # data pointers of the step's batch storages
    per_state: dict[Key, int] = field(default_factory=dict)  # bytes of each forward (the latest)
    held: dict[Key, set] = field(default_factory=dict)  # live state -> the regions it holds
    regions: dict[tuple, list] = field(default_factory=dict)  # live region -> [bytes, states holding it]
    current: dict[int, tuple] = field(default_factory=dict)  # data pointer -> its live storage's region
    made: int = 0
    live_bytes: int = 0
    peak_bytes: int = 0
    step_peak_bytes: int = 0  # the peak of the step in progress
    peak_states: dict[int, int] = field(default_factory=dict)  # stage -> most live states at once
    peak_rank_states: int = 0

    @classmethod
    def of(cls, stages: dict) -> SavedBytes:
        return cls({p.untyped_storage().data_ptr() for stage in stages.values()
                    for p in (*stage.parameters(), *stage.buffers())})

    def add_parameters(self, old: int | None, new: int) -> None:
        """A parameter buffer gathered again (ZeRO-3, zero.py) into a new storage: its pointer replaces the old."""
        self.params.discard(old)
        self.params.add(new)

    def new_step(self, batch) -> None:
        """A step begins: its batch's storages (counted by the views saved), its own peak."""
        self.batch = {t.untyped_storage().data_ptr() for t in (batch.tokens, batch.targets)}
        self.step_peak_bytes = self.live_bytes

    def _region(self, tensor: torch.Tensor) -> tuple[tuple, int] | None:
        """The region a saved tensor holds and its bytes; None for a parameter's storage."""
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer in self.params:
            return None
        if pointer in self.batch:
            return ("batch", pointer, tensor.storage_offset()), tensor.numel() * tensor.element_size()
        region = self.current.get(pointer)
        if region is None:  # a storage not seen alive: a region of its own, until the storage dies
            self.made += 1
            region = self.current[pointer] = ("storage", pointer, self.made)
            weakref.finalize(storage, self._died, region)
        return region, storage.nbytes()

    def _died(self, region: tuple) -> None:
        if self.current.get(region[1]) == region:
            del self.current[region[1]]
        entry = self.regions.pop(region, None)
        if entry is not None:
            self.live_bytes -= entry[0]

    @contextmanager
    def recording(self, key: Key):
        """Count what the forward of `key` saves while the context is open."""
        found: dict[tuple, int] = {}

        def note(tensor: torch.Tensor) -> None:
            region = self._region(tensor)
            if region is not None:
                found[region[0]] = region[1]

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            note(tensor)
            return tensor
        _ACTIVE.append(note)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield
        finally:
            _ACTIVE.pop()
        self._hold(key, found)

    def _hold(self, key: Key, found: dict[tuple, int]) -> None:
        self.release(key)
        found = {r: size for r, size in found.items() if r[0] == "batch" or self.current.get(r[1]) == r}
        self.per_state[key] = sum(found.values())
        self.held[key] = set()
        self._add(key, found)

    def add(self, key: Key, tensors: list[torch.Tensor]) -> None:
        """The live state of `key` holds these tensors too (what L brought back to the device for it)."""
        found = dict(region for region in map(self._region, tensors) if region is not None)
        self._add(key, {r: size for r, size in found.items() if r not in self.held.get(key, ())})

    def _add(self, key: Key, found: dict[tuple, int]) -> None:
        self.held.setdefault(key, set()).update(found)
        for region, size in found.items():
            entry = self.regions.setdefault(region, [size, 0])
            entry[1] += 1
            self.live_bytes += size if entry[1] == 1 else 0
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.step_peak_bytes = max(self.step_peak_bytes, self.live_bytes)
        alive = sum(1 for s, _ in self.held if s == key[0])
        self.peak_states[key[0]] = max(self.peak_states.get(key[0], 0), alive)
        self.peak_rank_states = max(self.peak_rank_states, len(self.held))

    def release(self, key: Key) -> None:
        """The state of `key` is dropped: its regions no other live state holds leave the live bytes."""
        for region in self.held.pop(key, ()):
            entry = self.regions.get(region)
            if entry is not None:
                entry[1] -= 1
                if not entry[1]:
                    del self.regions[region]
                    self.live_bytes -= entry[0]

    def summary(self) -> dict:
        """This rank's figures: per stage the bytes of a microbatch's forward (the largest, and whether
        all are equal), the peak live bytes, the peak live states per stage and on the rank."""
        stages: dict[int, list[int]] = {}
        for (s, _), size in sorted(self.per_state.items()):
            stages.setdefault(s, []).append(size)
        return {"saved_bytes_per_microbatch": {str(s): max(v) for s, v in stages.items()},
                "saved_bytes_equal_over_microbatches": all(min(v) == max(v) for v in stages.values()),
                "peak_saved_bytes": self.peak_bytes,
                "peak_microbatches_in_flight": {str(s): n for s, n in sorted(self.peak_states.items())},
                "peak_states_on_rank": self.peak_rank_states}
