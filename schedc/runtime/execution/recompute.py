# Activation recomputation (--recompute none|selective|full): a recomputed region keeps only its inputs
# for backward and runs again, once, when backward first needs what it saved (Korthikanti et al. 2022:
# full recomputes each transformer layer, selective only the attention core, the score product, softmax
# and value product).
#
# A region is torch.utils.checkpoint's non-reentrant scheme (saved-tensor hooks: the forward saves a
# placeholder per tensor, the first unpack replays the region and serves each placeholder the tensor
# the replay saved at its place), with one difference the split backward needs: torch replays once per
# backward call (graph task), and its GraphExecGroup, which shares one replay between calls, refuses
# two calls that read one saved tensor, as I and W both do at a Linear's addmm node. Here the replay
# is the region's own: it runs on the first unpack (in B, or in I of a split backward) and serves every
# later backward call (W, after I) until the region's graph is freed. The replay restores the forward's
# RNG state and autocast, so a region with dropout or under --dtype bf16 replays what its forward ran.
#
# Full recomputation wraps the stage's layer pieces (every piece but the model's first and last) in
# Stage.forward; selective wraps what a block names as its attention core (a module with a
# `recompute_core` attribute calls `recomputed(self.recompute_core, core, q, k, v)`), so a block of
# another kind (a tensor-parallel one) takes it by the same attribute.
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable

import torch

from . import memory

MODES = ("none", "selective", "full")


class RecomputeError(RuntimeError):
    """A replay that saved other tensors than its forward (a region that is not deterministic)."""


class RunState:
    """The RNG and autocast state a forward began under, to run it again alike (a recomputed region's
    replay, a placed R: runtime/execution/placed.py)."""

    def __init__(self, devices: list[torch.device]):
        self.cuda = [d for d in devices if d.type == "cuda"][:1]
        self.rng = torch.get_rng_state()
        self.cuda_rng = [torch.cuda.get_rng_state(d) for d in self.cuda]
        kind = self.cuda[0].type if self.cuda else "cpu"
        self.autocast = (kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))

    @contextmanager
    def restored(self):
        """Grad mode on, the RNG and autocast as the forward had them; the RNG as it was after."""
        kind, enabled, dtype = self.autocast
        with torch.random.fork_rng(devices=self.cuda), torch.enable_grad(), \
                torch.autocast(kind, dtype=dtype, enabled=enabled):
            torch.set_rng_state(self.rng)
            for device, state in zip(self.cuda, self.cuda_rng):
                torch.cuda.set_rng_state(state, device)
            yield


class _Frame:
    """One run of a region: its function, inputs, RNG and autocast state, and the replay's tensors."""

    def __init__(self, fn: Callable, args: tuple):
        self.fn, self.args, self.count = fn, args, 0
        self.replayed: list[torch.Tensor] | None = None
        self.state = RunState([a.device for a in args if isinstance(a, torch.Tensor)])

    def pack(self, _tensor: torch.Tensor) -> tuple[_Frame, int]:
        self.count += 1
        return self, self.count - 1

    def replay(self) -> list[torch.Tensor]:
        saved: list[torch.Tensor] = []
        # a tensor needing no gradient goes as it is (a subclass such as a CausalBias keeps its fields)
        inputs = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad else a
                  for a in self.args]
        with self.state.restored(), \
                torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or len(saved) - 1,
                                                         lambda i: saved[i]):
            self.fn(*inputs)
        if len(saved) != self.count:
            raise RecomputeError(f"recomputing a region saved {len(saved)} tensors where its forward saved "
                                 f"{self.count}: the region does not run alike twice")
        return saved


def _unpack(holder: tuple[_Frame, int]) -> torch.Tensor:
    frame, index = holder
    if frame.replayed is None:
        frame.replayed = frame.replay()
    return frame.replayed[index]


def recomputed(enabled: bool, fn: Callable, *args: Any) -> Any:
    """fn(*args), as a recomputed region when `enabled` (else plainly): only the inputs are kept for
    backward (and counted by the saved-bytes meter, runtime/execution/memory.py)."""
    if not enabled or not torch.is_grad_enabled():
        return fn(*args)
    frame = _Frame(fn, args)
    memory.keep(*(a for a in args if isinstance(a, torch.Tensor)))
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, _unpack):
        return fn(*args)


def layer_indices(pieces: int, first: bool, last: bool) -> frozenset[int]:
    """Which of a stage's `pieces` are layers: all but the model's first piece (on the first stage)
    and its last (on the last stage)."""
    return frozenset(range(1 if first else 0, pieces - 1 if last else pieces))


def apply_recompute(stage: torch.nn.Module, mode: str, first: bool, last: bool) -> bool:
    """Mark a Stage's layers for `mode`: full recomputes each layer piece (Stage.forward), selective the
    attention core of each module in a layer that has one (its `recompute_core`). False when selective
    finds a layer without a core."""
    layers = layer_indices(len(stage.pieces), first, last)
    if mode == "full":
        stage.recomputed_pieces = layers
    elif mode == "selective":
        for index in layers:
            cores = [m for m in stage.pieces[index].modules() if hasattr(m, "recompute_core")]
            if not cores:
                return False
            for module in cores:
                module.recompute_core = True
    return True
