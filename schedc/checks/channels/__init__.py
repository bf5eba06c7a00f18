"""check_channels: on the lowered plan, messages match and a blocking run of the streams completes.

NCCL matches point-to-point messages per ordered pair of ranks in issue order, not by tag: for every
pair (a, b) the sends of a to b must be, one for one, the receives b posts from a (kind, stage,
microbatch, pipeline). Then the streams are replayed rank by rank under rendezvous semantics:

  RECV_*     posts the receive and goes on;
  SEND_*     blocks until the peer has posted the matching receive;
  F, B, I    consuming a received tensor block until the matching send has run;
  SYNC_GRAD  blocks until every rank of its group reaches its matching SYNC_GRAD;
  OVERLAP_F_B is its two halves in their order (it waits for the inputs of both before it starts, the
             receives of both are posted before it and the sends of both follow it).

Three checkers, one module each: `certificate` clears a good step program by whole-list passes;
`replay` runs what the certificate cannot vouch for under the semantics above; `pairs` compares each
pair's sends and receives and each SYNC_GRAD group, to name the faults of a failing program.

    rank 0: F(0,0) SEND_F(0,0)>1 RECV_B(1,0)<1 B(0,0)      rank 1: RECV_F(0,0)<0 F(1,0) B(1,0) SEND_B(1,0)>0
    -> completes; swap rank 1's RECV_F after F(1,0) and rank 0 blocks at SEND_F(0,0)>1 while rank 1
       blocks at F(1,0) waiting for it: an error naming both, with the rank x instruction grid.
"""
from __future__ import annotations

from itertools import chain
from operator import attrgetter, methodcaller

from ...diagnostics import Diagnostic
from ...plan import Plan
from .certificate import certify
from .pairs import pair_errors, sync_errors
from .replay import replay, replay_errors


def check_channels(plan: Plan) -> list[Diagnostic]:
    """Guarantees, when it returns no error: in every step program, every pair of ranks agrees on the
    sequence of its messages, every message goes between the ranks holding its producing and consuming
    stages, SYNC_GRAD groups agree, every tensor a rank uses from another rank is received there before
    it is used, and the blocking replay above completes (no rank waits forever).

    A static certificate (`certify`, about twice as fast) clears a good step program; anything it cannot
    vouch for is replayed, and a failing plan is analysed again to name every fault."""
    diags: list[Diagnostic] = []
    place = [list(p.get("placement", ())) for p in plan.meta.get("pipelines", ())]
    microbatches = 1 + max((mb for p in plan.meta.get("pipelines", ()) for mb in p.get("microbatches", ())
                            if type(mb) is int), default=-1)
    for step in range(plan.cycle_steps):
        streams = [_units(plan.ranks[r][step]) if step < len(plan.ranks[r]) else () for r in range(plan.devices)]
        if certify(streams, place, microbatches):
            continue
        state = replay(streams, place)
        if state.clean:
            continue
        found = pair_errors(streams, place, step, plan.cycle_steps) + sync_errors(streams, step, plan.cycle_steps)
        diags += found or replay_errors(streams, state, step, plan.cycle_steps)
    return diags


_HALVES, _UNITS = attrgetter("halves"), methodcaller("units")


def _units(stream: tuple) -> tuple:
    """The stream with every OVERLAP_F_B replaced by its halves (the grids of the errors show them so)."""
    if not any(map(_HALVES, stream)):
        return stream
    return tuple(chain.from_iterable(map(_UNITS, stream)))
