# OVERLAP_F_B: the forward of one microbatch and the backward (B or I) of another, run as one
# instruction. On CPU, and whenever the two halves are of one microbatch (the backward may read what
# the forward makes), the halves run in the plan's order. On CUDA they run on two streams, the rank's
# main stream and one side stream, so that their kernels overlap:
#
#   side waits for main     what came before the instruction (earlier ops, local inputs) is done
#   backward on stream S    S = the stream its forward ran on: autograd runs a backward op's kernels on
#                           the stream of its forward op, so the backward lands there whatever is current
#   forward on the other    the forward's kernels go to the stream the backward leaves free
#   inputs recorded         each tensor a half reads is marked in use on that half's stream, so the
#                           caching allocator does not give its memory to the other stream too early
#   main waits for side     what comes after (the halves' sends, STEP) sees both halves done
#
# A received input is waited for inside its half (`Executor.take`), on that half's stream.
from __future__ import annotations

from typing import Any

from schedc.ops import OpKind
from schedc.plan import Instr


class CudaStreams:
    """A rank's two CUDA streams and the stream operations run_overlapped uses (one place, so that the
    order of waits, records and launches can be followed, and tested, without a GPU)."""

    def __init__(self) -> None:
        import torch
        self._torch = torch
        self.main = torch.cuda.current_stream()
        self.side = torch.cuda.Stream()

    def current(self) -> Any:
        return self._torch.cuda.current_stream()

    def wait(self, waiter: Any, waited: Any) -> None:
        """Work queued on `waiter` from now on starts after all work queued on `waited` so far."""
        waiter.wait_stream(waited)

    def using(self, stream: Any):
        """A context in which kernels are queued on `stream`."""
        return self._torch.cuda.stream(stream)

    def record(self, tensor: Any, stream: Any) -> None:
        tensor.record_stream(stream)


def roles(instr: Instr) -> tuple[Instr, Instr]:
    """(forward, backward) of an OVERLAP_F_B, whichever order the plan gives them."""
    first, second = instr.halves
    return (first, second) if first.op == OpKind.F else (second, first)


def half_streams(streams: CudaStreams, backward_stream: Any) -> tuple[Any, Any]:
    """(forward's stream, backward's stream): the backward where its forward ran (main when that is
    unknown), the forward on the other of the two."""
    back = streams.main if backward_stream is None else backward_stream
    return (streams.side if back == streams.main else streams.main), back


def run_overlapped(executor: Any, instr: Instr) -> None:
    """Run both halves of `instr` through the executor's method table (see the header)."""
    forward, backward = roles(instr)
    streams = executor.streams
    if streams is None or forward.mb == backward.mb:
        for half in instr.halves:
            executor.current = half
            executor.table[half.op](half)
        return
    saved = executor.saved.get((backward.stage, backward.mb))
    on = dict(zip((forward, backward), half_streams(streams, saved.stream if saved is not None else None)))
    streams.wait(streams.side, streams.main)
    for half in instr.halves:
        for tensor in executor.inputs(half):
            streams.record(tensor, on[half])
    for half in instr.halves:
        executor.current = half
        with streams.using(on[half]):
            executor.table[half.op](half)
    streams.wait(streams.main, streams.side)
