"""check_channels: on the lowered plan, messages match and a blocking run of the streams completes.

NCCL matches point-to-point messages per ordered pair of ranks in issue order, not by tag: for every
pair (a, b) the sends of a to b must be, one for one, the receives b posts from a (kind, stage,
microbatch, pipeline). Then the streams are replayed rank by rank under rendezvous semantics:

  RECV_*     posts the receive and goes on;
  SEND_*     blocks until the peer has posted the matching receive;
  F, B, I    consuming a received tensor block until the matching send has run;
  SYNC_GRAD  blocks until every rank of its group reaches its matching SYNC_GRAD.

    rank 0: F(0,0) SEND_F(0,0)>1 RECV_B(1,0)<1 B(0,0)      rank 1: RECV_F(0,0)<0 F(1,0) B(1,0) SEND_B(1,0)>0
    -> completes; swap rank 1's RECV_F after F(1,0) and rank 0 blocks at SEND_F(0,0)>1 while rank 1
       blocks at F(1,0) waiting for it: an error naming both, with the rank x instruction grid.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .diagnostics import Diagnostic, error
from .grid import format_grid
from .plan import Instr, Plan

_KIND = {"F": 1, "B": 2, "I": 2, "SEND_F": 3, "SEND_B": 3, "RECV_F": 4, "RECV_B": 4, "SYNC_GRAD": 5}
SEND, RECV, CONSUME, SYNC = "send", "recv", "consume", "sync"
SHOWN = 8  # mismatches listed per pair


def check_channels(plan: Plan) -> list[Diagnostic]:
    """Guarantees, when it returns no error: in every step program, every pair of ranks agrees on the
    sequence of its messages, every message goes between the ranks holding its producing and consuming
    stages, every tensor consumed from another rank is received exactly where it is used, SYNC_GRAD
    groups agree, and the blocking replay above completes (no rank waits forever)."""
    diags: list[Diagnostic] = []
    for step in range(plan.cycle_steps):
        streams = [plan.ranks[r][step] if step < len(plan.ranks[r]) else () for r in range(plan.devices)]
        scan = scan_streams(streams, _placements(plan))
        diags += scan.errors + _pairs(scan, step, plan.cycle_steps)
        if not diags:
            diags += _replay_errors(streams, scan, step, plan.cycle_steps)
    return diags


def _placements(plan: Plan) -> list[list[int]]:
    return [list(p.get("placement", ())) for p in plan.meta.get("pipelines", ())]


@dataclass
class Scan:
    """Per-rank codes for the replay and per-channel message sequences (channel = src * ranks + dst)."""

    ranks: int
    codes: list[list] = field(default_factory=list)         # per instruction: None or (what, channel, k)
    sends: dict[int, list[tuple]] = field(default_factory=dict)
    recvs: dict[int, list[tuple]] = field(default_factory=dict)
    syncs: dict[tuple, list[tuple[int, int]]] = field(default_factory=dict)  # (group, j) -> (rank, stage)
    errors: list[Diagnostic] = field(default_factory=list)


def scan_streams(streams: list, place: list[list[int]]) -> Scan:
    """One pass over every instruction: encode it for the replay, collect the message sequences."""
    scan = Scan(len(streams))
    for r, stream in enumerate(streams):
        scan.codes.append(_scan_rank(scan, r, stream, place))
    return scan


def _scan_rank(scan: Scan, r: int, stream, place: list[list[int]]) -> list:
    ranks, codes = scan.ranks, [None] * len(stream)
    received: dict[tuple, tuple[int, int]] = {}     # message -> (channel, k) of its receive on r
    consumers: list[tuple[int, tuple]] = []          # (position, message consumed)
    group_count: dict[tuple, int] = {}
    for n, ins in enumerate(stream):
        op, stage, mb, pipe = ins[0], ins[1], ins[2], ins[3] or 0
        kind = _KIND.get(op)
        if kind is None:
            continue
        if kind == 1 or kind == 2:
            need = _consumed(kind, stage, mb, pipe, place, r)
            if need is not None:
                consumers.append((n, need))
        elif kind == 3 or kind == 4:
            peer = ins[4]
            if not _peer_ok(op, stage, pipe, peer, place, r, ranks):
                scan.errors.append(error(f"rank {r}: {_text(ins)} goes to or comes from rank {peer}, but the "
                                         f"stages it links are on {_ends(op, stage, pipe, place)}"))
                continue
            message = (op[-1], stage, mb, pipe)
            if kind == 3:
                channel = r * ranks + peer
                sequence = scan.sends.setdefault(channel, [])
                codes[n] = (SEND, channel, len(sequence))
            else:
                channel = peer * ranks + r
                sequence = scan.recvs.setdefault(channel, [])
                if message in received:
                    scan.errors.append(error(f"rank {r}: {_text(ins)} receives the same tensor twice"))
                received[message] = (channel, len(sequence))
                codes[n] = (RECV, channel, len(sequence))
            sequence.append(message)
        else:
            group = tuple(ins[5] or ())
            j = group_count.get(group, 0)
            group_count[group] = j + 1
            scan.syncs.setdefault((group, j), []).append((r, stage))
            codes[n] = (SYNC, (group, j), len(group))
    _link_consumers(scan, r, stream, codes, received, consumers)
    return codes


def _consumed(kind: int, stage, mb, pipe: int, place: list[list[int]], r: int) -> tuple | None:
    """The message a compute op consumes from another rank: F(s) the activation of s-1, B/I(s) the
    gradient of s+1 (None when that stage is on this rank or does not exist)."""
    if not 0 <= pipe < len(place) or stage is None:
        return None
    where = place[pipe]
    if kind == 1:
        return ("F", stage - 1, mb, pipe) if 0 < stage <= len(where) and where[stage - 1] != r else None
    return ("B", stage + 1, mb, pipe) if -1 <= stage < len(where) - 1 and where[stage + 1] != r else None


def _link_consumers(scan: Scan, r: int, stream, codes: list, received: dict, consumers: list) -> None:
    used = set()
    for n, message in consumers:
        found = received.get(message)
        if found is None:
            scan.errors.append(error(f"rank {r}: {_text(stream[n])} (instruction {n}) uses {_message(message)} "
                                     f"from another rank, but rank {r} never receives it"))
            continue
        used.add(message)
        codes[n] = (CONSUME,) + found
    for message in received.keys() - used:
        scan.errors.append(error(f"rank {r}: receives {_message(message)} but no instruction uses it"))


def _peer_ok(op: str, stage, pipe: int, peer, place: list[list[int]], r: int, ranks: int) -> bool:
    if not isinstance(peer, int) or not 0 <= peer < ranks or peer == r or not 0 <= pipe < len(place):
        return False
    where, s = place[pipe], stage
    if not isinstance(s, int) or not 0 <= s < len(where):
        return False
    other = {"SEND_F": s + 1, "SEND_B": s - 1}.get(op, s)        # the stage on the peer's side
    mine = s if op.startswith("SEND") else (s + 1 if op == "RECV_F" else s - 1)
    return 0 <= other < len(where) and 0 <= mine < len(where) and where[other] == peer and where[mine] == r


def _ends(op: str, stage, pipe: int, place: list[list[int]]) -> str:
    where = place[pipe] if 0 <= pipe < len(place) else []
    pair = (stage, stage + 1) if op.endswith("F") else (stage - 1, stage) if isinstance(stage, int) else ()
    ranks = [f"stage {s} on rank {where[s]}" for s in pair if isinstance(s, int) and 0 <= s < len(where)]
    return " and ".join(ranks) or "no rank (the stage does not exist)"


def _message(message: tuple) -> str:
    direction, stage, mb, pipe = message
    what = "activation" if direction == "F" else "gradient"
    return f"the {what} of stage {stage}, microbatch {mb}" + (f", pipeline {pipe}" if pipe else "")


def _text(ins: Instr) -> str:
    """Compact form for messages and the grid: F(1,2), SEND_F(0,3)>1, RECV_B(2,0)<2, SYNC_GRAD(1)."""
    op, stage, mb = ins[0], ins[1], ins[2]
    args = "" if stage is None else f"({stage})" if mb is None else f"({stage},{mb})"
    if op.startswith("SEND"):
        return f"{op}{args}>{ins[4]}"
    if op.startswith("RECV"):
        return f"{op}{args}<{ins[4]}"
    return op + args


# Pairwise sequences ------------------------------------------------------------------------------------

def _pairs(scan: Scan, step: int, steps: int) -> list[Diagnostic]:
    diags = []
    for channel in sorted(scan.sends.keys() | scan.recvs.keys()):
        sent, got = scan.sends.get(channel, []), scan.recvs.get(channel, [])
        if sent != got:
            diags.append(_mismatch(channel // scan.ranks, channel % scan.ranks, sent, got, step, steps))
    for (group, j), members in sorted(scan.syncs.items()):
        ranks = sorted(r for r, _ in members)
        stages = sorted({s for _, s in members}, key=str)
        if ranks != sorted(group) or len(stages) != 1:
            diags.append(error(f"{_where(step, steps)}SYNC_GRAD #{j} of group {list(group)} is issued by ranks "
                               f"{ranks} for stages {stages}; every rank of the group must issue it, for one stage"))
    return diags


def _mismatch(a: int, b: int, sent: list, got: list, step: int, steps: int) -> Diagnostic:
    k = next((k for k, (x, y) in enumerate(zip(sent, got)) if x != y), min(len(sent), len(got)))
    first = (f"message {k}: rank {a} sends {_message(sent[k]) if k < len(sent) else 'nothing'}, rank {b} "
             f"expects {_message(got[k]) if k < len(got) else 'nothing'}")
    notes = tuple(f"message {i}: sent {_short(sent, i)}, received {_short(got, i)}"
                  for i in range(k, min(k + SHOWN, max(len(sent), len(got)))))
    return error(f"{_where(step, steps)}messages from rank {a} to rank {b} do not match: {len(sent)} sent, "
                 f"{len(got)} received; first difference at {first}", notes=notes)


def _short(messages: list, i: int) -> str:
    if i >= len(messages):
        return "-"
    direction, stage, mb, pipe = messages[i]
    return f"{direction}({stage},{mb})" + (f".{pipe}" if pipe else "")


def _where(step: int, steps: int) -> str:
    return f"step program {step}: " if steps > 1 else ""


# The rendezvous replay -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Blocked:
    """Where the replay stopped: each stuck rank's instruction index and what it waits for."""

    position: tuple[int, ...]
    waits: dict[int, tuple]   # rank -> code of the instruction it is blocked at


def replay_streams(codes: list[list], ranks: int) -> Blocked:
    """Run every rank as far as it can, waking a rank when what it waits for happens (linear)."""
    posted, sent = {}, {}                            # channel -> count of receives posted / sends done
    arrived: dict[tuple, set[int]] = {}              # collective -> ranks arrived
    sleeping: dict[tuple, list[int]] = {}            # event -> ranks to wake
    position, blocked = [0] * ranks, {}
    ready = list(range(ranks))
    while ready:
        r = ready.pop()
        program, n = codes[r], position[r]
        blocked.pop(r, None)
        while n < len(program):
            code = program[n]
            if code is not None:
                what, channel, k = code
                if what is RECV:
                    posted[channel] = k + 1
                    ready.extend(sleeping.pop((SEND, channel), ()))
                elif what is SEND:
                    if posted.get(channel, 0) <= k:
                        sleeping.setdefault((SEND, channel), []).append(r)
                        break
                    sent[channel] = k + 1
                    ready.extend(sleeping.pop((CONSUME, channel), ()))
                elif what is CONSUME:
                    if sent.get(channel, 0) <= k:
                        sleeping.setdefault((CONSUME, channel), []).append(r)
                        break
                elif not _meet(r, channel, k, arrived, sleeping, ready):
                    break
            n += 1
        position[r] = n
        if n < len(program):
            blocked[r] = program[n]
    return Blocked(tuple(position), blocked)


def _meet(r: int, collective: tuple, size: int, arrived: dict, sleeping: dict, ready: list) -> bool:
    """A rank at a SYNC_GRAD: True once the whole group has arrived (the collective is done)."""
    members = arrived.setdefault(collective, set())
    members.add(r)
    if len(members) < size:
        sleeping.setdefault((SYNC, collective), []).append(r)
        return False
    ready.extend(x for x in sleeping.pop((SYNC, collective), ()) if x != r)
    return True


def _replay_errors(streams: list, scan: Scan, step: int, steps: int) -> list[Diagnostic]:
    result = replay_streams(scan.codes, scan.ranks)
    if not result.waits:
        return []
    reasons = [f"rank {r} blocks at {_text(streams[r][result.position[r]])} (instruction "
               f"{result.position[r]}) {_waiting(result.waits[r], scan.ranks)}" for r in sorted(result.waits)]
    marks = {(r, n): "stuck" for r, n in enumerate(result.position) if r in result.waits}
    grid = format_grid(streams, marks, _text)
    return [error(f"{_where(step, steps)}the plan hangs under blocking sends: " + "; ".join(reasons[:6])
                  + (f"; ... ({len(reasons)} ranks)" if len(reasons) > 6 else ""), detail=grid,
                  notes=("a SEND waits until its peer posts the matching RECV; a consumer waits for the SEND",))]


def _waiting(code: tuple, ranks: int) -> str:
    what, channel, k = code
    if what is SEND:
        return f"until rank {channel % ranks} posts its receive #{k} from rank {channel // ranks}"
    if what is CONSUME:
        return f"until rank {channel // ranks} sends message #{k} to rank {channel % ranks}"
    group, j = channel
    return f"until every rank of group {list(group)} reaches SYNC_GRAD #{j}"
