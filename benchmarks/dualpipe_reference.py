"""DualPipe's step as deepseek-ai/DualPipe's dualpipe.py runs it, timed by hand: an independent reference for
schedc's `dualpipe` library order under its simulator (imports nothing of schedc).

Each rank's list of chunks is built from the eight steps of the reference implementation's `step()` (nF0,
nF0F1, nB1W1F1, nF0B1F1B0, nB1F1B0, nB1B0, nWB0, nW) in its own terms: phase 0 and 1 of a rank, half_rank
= min(rank, PP - 1 - rank), the middle ranks' first main-step pair not overlapped, the zero-bubble switch
half-way through step 6, W popped oldest first. The timing is pure dataflow on zero-cost links (the
report's Figure 5): a chunk starts when its rank is free and its inputs exist, a forward after the previous
stage's forward of its microbatch, a backward after the next stage's backward (the last stage after its own
forward), an overlapped F&B pair when both halves' inputs exist; W needs only its own rank. The reference
implementation's batched sends (issued at the sender's next communication point) are not modelled: the
report's formula assumes none.

    python benchmarks/dualpipe_reference.py --pp 8 --f 1 --b 2 --w 1 --fb 2.5
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """One item of a rank's list: kind F, B (full backward), I (backward for inputs, its W deferred), W (the
    oldest deferred weight gradient) or FB (F of phase, B of phase_b, overlapped)."""

    kind: str
    phase: int = 0
    phase_b: int = 0


def rank_chunks(rank: int, pp: int, chunks: int) -> list[Chunk]:
    """The chunks rank `rank` runs in one step of `chunks` microbatches (half per direction), in order."""
    half, r, half_chunks = pp // 2, min(rank, pp - 1 - rank), chunks // 2
    middle = r == half - 1
    out = [Chunk("F", 0)] * ((half - r - 1) * 2)                       # 1: nF0
    out += [Chunk("F", 0), Chunk("F", 1)] * (r + 1)                    # 2: nF0F1
    out += [Chunk("I", 1), Chunk("W"), Chunk("F", 1)] * (half - r - 1)  # 3: nB1W1F1, zero bubble
    for i in range(half_chunks - pp + r + 1):                          # 4: nF0B1F1B0
        out += [Chunk("F", 0), Chunk("B", 1)] if i == 0 and middle else [Chunk("FB", 0, 1)]
        out.append(Chunk("FB", 1, 0))
    out += [Chunk("B", 1), Chunk("FB", 1, 0)] * (half - r - 1)         # 5: nB1F1B0
    zb = False
    for i in range(r + 1):                                             # 6: nB1B0, the second half split
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        out.append(Chunk("I" if zb else "B", 1))
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        out.append(Chunk("I" if zb else "B", 0))
    out += [Chunk("W"), Chunk("I", 0)] * (half - r - 1)                # 7: nWB0
    out += [Chunk("W")] * (r + 1)                                      # 8: nW
    return out


def stage_of(rank: int, phase: int, pp: int) -> tuple[int, int]:
    """(direction, stage) of a rank's phase: direction 0 runs stage s on rank s, direction 1 on PP-1-s;
    phase 0 is direction 0 on the first half of the ranks and direction 1 on the second."""
    direction = phase ^ (rank >= pp // 2)
    return direction, rank if direction == 0 else pp - 1 - rank


def timeline(pp: int, chunks: int, f: float, b: float, w: float, fb: float) -> dict:
    """Every rank's busy time and end, the makespan and each rank's idle time (makespan - busy): the
    durations of a forward chunk f, a full backward b (= its input part + w), a weight chunk w, an
    overlapped pair fb."""
    lists = [rank_chunks(rank, pp, chunks) for rank in range(pp)]
    done: dict[tuple, float] = {}            # ("F"|"B", direction, stage, microbatch) -> end
    counters = [{} for _ in range(pp)]       # per rank: (kind, phase) -> next microbatch
    deferred = [[] for _ in range(pp)]       # per rank: the W chunks waiting, oldest first
    clock, busy, at = [0.0] * pp, [0.0] * pp, [0] * pp

    def half(rank: int, kind: str, phase: int) -> tuple[tuple, tuple]:
        """(the key this half produces, the key it waits for; None for none) without advancing."""
        direction, stage = stage_of(rank, phase, pp)
        mb = counters[rank].get((kind, phase), 0)
        if kind == "F":
            return ("F", direction, stage, mb), (("F", direction, stage - 1, mb) if stage else None)
        needs = ("B", direction, stage + 1, mb) if stage < pp - 1 else ("F", direction, stage, mb)
        return ("B", direction, stage, mb), needs

    progress = True
    while progress:
        progress = False
        for rank in range(pp):
            while at[rank] < len(lists[rank]):
                c = lists[rank][at[rank]]
                halves = {"F": [("F", c.phase)], "B": [("B", c.phase)], "I": [("B", c.phase)], "W": [],
                          "FB": [("F", c.phase), ("B", c.phase_b)]}[c.kind]
                keys = [half(rank, kind, phase) for kind, phase in halves]
                if any(needs is not None and needs not in done for _, needs in keys):
                    break
                start = max([clock[rank]] + [done[needs] for _, needs in keys if needs is not None])
                cost = {"F": f, "B": b, "I": b - w, "W": w, "FB": fb}[c.kind]
                if c.kind == "W":
                    deferred[rank].pop(0)
                if c.kind == "I":
                    deferred[rank].append(keys[0][0])
                clock[rank], busy[rank] = start + cost, busy[rank] + cost
                for (made, _), (kind, phase) in zip(keys, halves):
                    done[made] = clock[rank]
                    counters[rank][(kind, phase)] = counters[rank].get((kind, phase), 0) + 1
                at[rank] += 1
                progress = True
    if any(at[rank] < len(lists[rank]) for rank in range(pp)) or any(deferred):
        raise RuntimeError("the reference's chunk lists deadlocked")
    makespan = max(clock)
    return {"makespan": makespan, "busy": busy, "idle": [makespan - x for x in busy]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=8)
    parser.add_argument("--chunks", type=int, help="microbatches (default 2 x PP)")
    for name, default in (("f", 1.0), ("b", 2.0), ("w", 1.0), ("fb", 2.5)):
        parser.add_argument(f"--{name}", type=float, default=default)
    a = parser.parse_args(argv)
    t = timeline(a.pp, a.chunks or 2 * a.pp, a.f, a.b, a.w, a.fb)
    formula = (a.pp // 2 - 1) * (a.fb + a.b - 3 * a.w)
    print(f"makespan {t['makespan']:.4f}  idle per rank {' '.join(f'{x:.4f}' for x in t['idle'])}")
    print(f"most idle {max(t['idle']):.4f}  (PP/2-1)(F&B+B-3W) {formula:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
