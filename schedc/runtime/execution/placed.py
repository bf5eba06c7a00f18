# Placed recomputation (R) and activation offload (O, L) at run time: the ops a schedule places with
# `recompute F` and `offload F` (schedc/ops.py says what each follows).
#
# R: the F of a (stage, mb) that has an R in its step program runs without a graph (no_grad) and keeps
# only its stage input (stage 0's: its token ids) and the RNG and autocast state it began under
# (recompute.RunState); R runs the stage's forward again from that input under that state, building the
# graph its B (or I, then W) reads. Dropout draws the same masks; R's loss is not counted again and its
# output not sent again (the F did both).
#
# O and L: the F of a (stage, mb) that has an O runs under a saved-tensor hook that puts every tensor
# autograd saves into the forward's Store (and shows it to the saved-bytes meter). O copies each storage
# they hold to host memory and drops the device references, so the storage is freed and the meter sees
# the drop; L copies them back, and the backward's unpack hook serves the copies. Storages O leaves on the
# device: the parameters', the step's batch's, and those of the state's input and output (the executor
# keeps the input as the leaf the input gradient lands on, the output as the backward's root). The host
# buffers come from a pool bounded by the plan's offload peak (pool.py), pinned on CUDA, where O's copies
# run non_blocking on one side stream (device to host) and L's on another (host to device), so a reload
# does not queue behind an offload; the backward waits for L's copies at its first unpack. On CPU the
# host buffer is a plain one and L a copy back. A backward reaching a tensor offloaded and not reloaded
# raises OffloadError (the compiler refuses such plans already).
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from schedc.ops import OpKind, follows
from schedc.plan import Instr, Opcode, Plan, PlanError

from . import memory
from .pool import OffloadError, PinnedPool, host_buffers, offload_peak
from .recompute import RunState

Key = tuple[int, int]
PLACED = frozenset({Opcode.R.value, Opcode.O.value, Opcode.L.value})


def check_placed(plan: Plan, opts) -> None:
    """Placed recomputation (R) and offload (O, L), before any process starts: each after what it
    follows in its step program, and with --recompute none (a placed R recomputes the whole stage; O
    moves what autograd saved)."""
    for rank, steps in enumerate(plan.ranks):
        _check_order(list(steps), rank)
    if opts.recompute != "none" and any(i.op in PLACED for steps in plan.ranks for step in steps for i in step):
        raise PlanError(f"the plan places recomputation (R) or offload (O, L), which run with --recompute none "
                        f"(not {opts.recompute}); compile without 'recompute F' and 'offload F' to use --recompute")


def _check_order(programs: list[tuple[Instr, ...]], rank: int) -> None:
    """Every R and O after the F of its (stage, mb) in its step program, every L after its O, every
    backward of a state that was offloaded after its L and of one recomputed after its R (ops.follows);
    a PlanError naming the first that is not."""
    for k, (program, recomputed, offloaded) in enumerate(zip(programs, keys_of(programs, Opcode.R),
                                                             keys_of(programs, Opcode.O))):
        done: set[tuple[str, int, int]] = set()
        for instr in (u for i in program for u in i.units()):
            key = (instr.stage, instr.mb)
            if instr.op in PLACED or key in offloaded or key in recomputed:
                first = follows(instr.op, key in recomputed, key in offloaded)
                if first is not None and (first, *key) not in done:
                    raise PlanError(f"rank {rank}, step program {k}: {instr} comes before the {first} of its "
                                    "stage and microbatch, which this runtime runs only in that order")
            done.add((instr.op, instr.stage, instr.mb))


def keys_of(programs: list[tuple[Instr, ...]], op: str) -> list[frozenset[Key]]:
    """Per step program, the (stage, mb) that have an `op` instruction in it."""
    return [frozenset((u.stage, u.mb) for i in program for u in i.units() if u.op == op) for program in programs]


class Store:
    """The saved tensors of one offloaded forward, by the index its pack hook returned: on the device
    from F to O and from L on, on the host in between (`moved`)."""

    def __init__(self, key: Key, kept: set[int]):
        self.key, self.kept = key, kept  # kept: data pointers of storages that stay on the device
        self.tensors: list[torch.Tensor | None] = []
        self.moved: list[tuple[torch.Tensor, torch.device, list[tuple]]] = []  # host bytes, device, views
        self.ready = None  # CUDA: the event after L's copies, waited for at the first unpack
        self.back: list[torch.Tensor] = []  # what L brought back

    def pack(self, tensor: torch.Tensor) -> tuple[Store, int]:
        memory.keep(tensor)
        self.tensors.append(tensor)
        return self, len(self.tensors) - 1

    def get(self, index: int) -> torch.Tensor:
        tensor = self.tensors[index]
        if tensor is None:
            s, mb = self.key
            raise OffloadError(f"the backward of stage {s} microbatch {mb} reads a saved tensor that O moved to "
                               "host memory and no L brought back (place an L before the backward)")
        if self.ready is not None:
            stream = torch.cuda.current_stream()
            stream.wait_event(self.ready)
            for t in self.back:
                t.record_stream(stream)  # allocated on the copy stream, used on this one
            self.ready = None
        return tensor

    def groups(self) -> dict[int, list[int]]:
        """The indices of the tensors O moves, by their storage's data pointer."""
        found: dict[int, list[int]] = {}
        for index, tensor in enumerate(self.tensors):
            storage = tensor.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in self.kept:
                found.setdefault(storage.data_ptr(), []).append(index)
        return found

    def offload(self, copier: Copier) -> None:
        """O: each moved storage copied to the host once (views keep their place in it), the device
        references dropped."""
        for indices in self.groups().values():
            first = self.tensors[indices[0]]
            views = [(i, t.dtype, t.storage_offset(), t.size(), t.stride())
                     for i, t in ((i, self.tensors[i]) for i in indices)]
            self.moved.append((copier.out(self.key, first.untyped_storage()), first.device, views))
            for i in indices:
                self.tensors[i] = None

    def reload(self, copier: Copier) -> list[torch.Tensor]:
        """L: the moved storages back on the device, each view rebuilt in its copy; what came back."""
        for host, device, views in self.moved:
            storage = copier.back(host, device).untyped_storage()
            for index, *view in views:
                self.tensors[index] = _view(storage, tuple(view))
                self.back.append(self.tensors[index])
        self.moved.clear()
        self.ready = copier.done()
        copier.pool.release(self.key, self.ready)  # the host buffers, reusable once L's copies are through
        return self.back


def _unpack(handle: tuple[Store, int]) -> torch.Tensor:
    store, index = handle
    return store.get(index)


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _view(storage: torch.UntypedStorage, view: tuple) -> torch.Tensor:
    dtype, offset, size, stride = view
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


class Copier:
    """Copies between the device and host memory into the pool's buffers: on CUDA non_blocking, O's on
    one side stream and L's on another (the copy engines); on CPU plain copies."""

    def __init__(self, device: torch.device, peak: int):
        self.cuda = device.type == "cuda"
        self.pool = PinnedPool(peak, host_buffers(self.cuda))
        self.out_stream, self.in_stream = (torch.cuda.Stream(device), torch.cuda.Stream(device)) if self.cuda else (None, None)

    def out(self, key: Key, storage: torch.UntypedStorage) -> torch.Tensor:
        source = _bytes_of(storage)
        host = self.pool.take(key, source.numel())
        if not self.cuda:
            return host.copy_(source)
        self.out_stream.wait_stream(torch.cuda.current_stream())  # the forward has written it
        with torch.cuda.stream(self.out_stream):
            host.copy_(source, non_blocking=True)
        source.record_stream(self.out_stream)  # the device block is not reused before the copy is done
        return host

    def back(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        if not self.cuda:
            return host.clone()
        self.in_stream.wait_stream(self.out_stream)  # the state's own O copies are through
        with torch.cuda.stream(self.in_stream):
            return host.to(device, non_blocking=True)

    def done(self):
        """An event after L's copies issued so far (None on CPU)."""
        return self.in_stream.record_event() if self.cuda else None


@dataclass(slots=True)
class Dropped:
    """What the F of a recomputed (stage, mb) keeps: its input (stage 0's: the token ids, views of the
    step's batch on CPU) and the state it began under."""

    x: torch.Tensor
    state: RunState


class Placed:
    """One rank's placed ops: which forwards of each step program are recomputed or offloaded, their
    kept inputs and stores, and the handlers of R, O and L."""

    def __init__(self, executor, programs: list[tuple[Instr, ...]]):
        self.executor = executor
        self.recomputed = keys_of(programs, Opcode.R)
        self.offloaded = keys_of(programs, Opcode.O)
        self.dropped: dict[Key, Dropped] = {}
        self.stores: dict[Key, Store] = {}  # from F to L; then the graph alone holds the store
        self.copier = Copier(executor.world.device, offload_peak(programs)) if any(self.offloaded) else None
        self.params = {p.untyped_storage().data_ptr() for stage in executor.stages.values()
                       for p in (*stage.parameters(), *stage.buffers())}  # buffers: the rotary tables
        self.table = {Opcode.R: self.recompute, Opcode.O: self.offload, Opcode.L: self.reload}

    def forward(self, instr: Instr) -> None:
        """F: as the executor runs it, or without a graph where an R follows, or under the offload store
        where an O follows."""
        key, k = (instr.stage, instr.mb), self.executor.step_no % len(self.recomputed)
        if key in self.recomputed[k]:
            return self._dropping(instr, key)
        if key not in self.offloaded[k]:
            return self.executor._forward(instr)
        store = self.stores[key] = Store(key, self._kept_storages())
        with torch.autograd.graph.saved_tensors_hooks(store.pack, _unpack):
            self.executor._forward(instr)
        saved = self.executor.saved[key]
        store.kept |= {t.untyped_storage().data_ptr() for t in (saved.x, saved.y, saved.head) if t is not None}

    def _kept_storages(self) -> set[int]:
        """The storages no O moves: the parameters' and buffers', and the step's batch's."""
        batch = self.executor.batch
        return self.params | {t.untyped_storage().data_ptr() for t in (batch.tokens, batch.targets)}

    def _dropping(self, instr: Instr, key: Key) -> None:
        ex = self.executor
        state = RunState([ex.world.device])
        with torch.no_grad():
            ex._forward(instr)
        saved = ex.saved.pop(key)
        memory.keep(saved.x)  # what the meter counts for the state until R
        self.dropped[key] = Dropped(saved.x.detach(), state)

    def recompute(self, instr: Instr) -> None:
        """R: the forward again from the kept input, under the state it began under, with its graph."""
        key, ex = (instr.stage, instr.mb), self.executor
        dropped = self.dropped.pop(key, None)
        if dropped is None:
            raise PlanError(f"R of stage {instr.stage} microbatch {instr.mb}: its F kept no input to recompute from")
        recording = ex.meter.recording(key) if ex.meter is not None else nullcontext()
        with recording, dropped.state.restored():
            ex._forward(instr, kept=dropped.x)

    def offload(self, instr: Instr) -> None:
        """O: the state's saved storages to host memory, the device's copies dropped."""
        self._store(instr, OpKind.O).offload(self.copier)

    def reload(self, instr: Instr) -> None:
        """L: the offloaded storages back to the device, where the backward's unpack finds them."""
        store = self._store(instr, OpKind.L)
        del self.stores[store.key]
        back = store.reload(self.copier)
        if self.executor.meter is not None:
            self.executor.meter.add(store.key, back)

    def _store(self, instr: Instr, op: str) -> Store:
        store = self.stores.get((instr.stage, instr.mb))
        if store is None:
            raise PlanError(f"{op} of stage {instr.stage} microbatch {instr.mb}: its F kept no offloadable state "
                            "on this rank (a forward offloads where its step program has an O for it)")
        return store
