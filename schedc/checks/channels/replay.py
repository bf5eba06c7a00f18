"""check_channels, the rendezvous replay: every rank runs its step program as far as it can under
blocking sends (a SEND waits for its receive to be posted, a consumer for the SEND of its tensor, a
SYNC_GRAD for its whole group); the replay names where each stuck rank waits and what it waits for.

    rank 0: SEND_F(0,0)>1 ...   rank 1: F(1,0) RECV_F(0,0)<0 ...
    -> error: the plan hangs under blocking sends: rank 0 blocks at SEND_F(0,0)>1 ... ; rank 1 blocks
       at F(1,0) ... (with the rank x instruction grid)
"""
from __future__ import annotations

from collections import defaultdict

from dataclasses import dataclass, field

from ...diagnostics import Diagnostic, error
from ...ops import COLLECTIVE, COMM, GRADIENT, RECVS, SENDS, Opcode, OpKind, fed_by, peer_stage
from ...passes.grid import elide, format_grid
from ...plan import Instr
from ...plan.channels import message as message_of
from .pairs import communicator, identity, where

_F, _B, _SEND, _RECV, _SYNC = 1, 2, 3, 4, 5
_KIND = {OpKind.F.value: _F, **dict.fromkeys(GRADIENT, _B), **dict.fromkeys(SENDS, _SEND),
         **dict.fromkeys(RECVS, _RECV), **dict.fromkeys(COLLECTIVE, _SYNC)}


@dataclass
class Replay:
    """Where the replay of one step program stopped: each rank's position, why a stuck rank waits, and
    faults seen on the way (a message that differs from its receive, a tensor received twice or never
    used, a message to the wrong rank, a malformed instruction), each with the (rank, instruction index)
    it is about: the index None for a fault of the rank as a whole, the pair None when not known."""

    position: list[int]
    blocked: dict[int, str] = field(default_factory=dict)
    faults: list[tuple[str, tuple[int, int | None] | None]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.blocked and not self.faults


def _tables(place: list[list[int]], ranks: int) -> tuple[list, dict]:
    """sources[pipe][s] = (the rank F(s) reads its input from, the rank B/I(s) does; None for none), the
    same for every rank (a rank reads from another when its source is not itself: per rank, this table
    grew with the square of the device count); peer_of[op][pipe][s] = the rank at the other end of a
    message of stage s (-1 for none)."""
    def other_rank(where: list[int], s: int, kind: str) -> int | None:
        x = fed_by(kind, s)[1]
        return where[x] if 0 <= x < len(where) else None

    def peer(where: list[int], s: int, op: str) -> int:
        x = peer_stage(op, s)
        return where[x] if 0 <= x < len(where) else -1

    sources = [[tuple(other_rank(where, s, kind) for kind in (OpKind.F.value, OpKind.B.value))
                for s in range(len(where))] for where in place]
    peer_of = {op: [[peer(where, s, op) for s in range(len(where))] for where in place] for op in sorted(COMM)}
    return sources, peer_of


def replay(streams: list, place: list[list[int]]) -> Replay:
    """Run every rank as far as it can, waking a rank when what it waits for happens (linear in the
    instructions; one tight loop without allocation on the common path: the hot path of `schedc check`)."""
    ranks = len(streams)
    sources, peer_of = _tables(place, ranks)
    state = Replay([0] * ranks)
    # channels (sender * ranks + receiver) only where messages go: memory linear in the instructions,
    # not quadratic in the ranks
    posted: defaultdict[int, int] = defaultdict(int)      # per channel: receives posted, sends done
    sent: defaultdict[int, int] = defaultdict(int)
    expected: defaultdict[int, list] = defaultdict(list)  # per channel: messages in receive order
    wait_post: dict[int, int] = {}                         # per channel: the rank asleep on it
    wait_send: dict[int, int] = {}
    received = [{} for _ in range(ranks)]
    used = [0] * ranks
    syncs = _Syncs(ranks)
    ready = list(range(ranks - 1, -1, -1))
    try:
        _run(streams, state, ranks, sources, peer_of, posted, sent, expected, wait_post, wait_send, received, used,
             syncs, ready)
    except (IndexError, KeyError, TypeError) as exc:
        state.faults.append((f"malformed instruction ({type(exc).__name__}: {exc})", None))
        return state
    state.blocked = {r: _why(streams[r][n], r, received[r], sent, ranks, syncs) for r, n in
                     enumerate(state.position) if n < len(streams[r])}
    state.faults += [(f"rank {r}: receives {len(received[r]) - used[r]} tensors it never uses", (r, None))
                     for r in range(ranks) if used[r] != len(received[r]) and r not in state.blocked]
    state.faults += [(f"rank {c % ranks} posts {posted[c] - sent[c]} receives from rank {c // ranks} that are "
                      "never sent", (c % ranks, None)) for c in sorted(posted) if posted[c] != sent[c] and not state.blocked]
    return state




def _run(streams: list, state: Replay, ranks: int, sources, peer_of, posted, sent, expected, wait_post, wait_send,
         received, used, syncs, ready) -> None:
    """replay's loop: the ranks in `ready` run until each blocks, a rank woken when what it waits for
    happens. Its tables are its arguments, so every lookup in the loop is a local's."""
    while ready:
        r = ready.pop()
        stream, n, mine = streams[r], state.position[r], received[r]
        while n < len(stream):
            ins = stream[n]
            kind = _KIND.get(ins[0])
            if kind is None:
                pass
            elif kind <= _B:
                pipe = ins[3] or 0
                source = sources[pipe][ins[1]][kind - 1]
                if source is not None and source != r:
                    got = mine.get((*fed_by(ins[0], ins[1]), ins[2], pipe))
                    if got is None:
                        break
                    if sent[got[0]] <= got[1]:
                        wait_send[got[0]] = r
                        break
                    used[r] += 1
            elif kind == _SEND:
                channel = r * ranks + ins[4]
                k = sent[channel]
                if posted[channel] <= k:
                    wait_post[channel] = r
                    break
                pipe = ins[3] or 0
                if expected[channel][k] != message_of(ins) \
                        or peer_of[ins[0]][pipe][ins[1]] != ins[4]:
                    state.faults.append((f"rank {r}: {Instr.short(ins)} does not match its receive", (r, n)))
                sent[channel] = k + 1
                if channel in wait_send:
                    ready.append(wait_send.pop(channel))
            elif kind == _RECV:
                channel = ins[4] * ranks + r
                pipe = ins[3] or 0
                message = message_of(ins)
                where = (channel, posted[channel])
                if mine.setdefault(message, where) is not where or peer_of[ins[0]][pipe][ins[1]] != ins[4]:
                    state.faults.append((f"rank {r}: {Instr.short(ins)} is received twice or from the wrong rank",
                                         (r, n)))
                expected[channel].append(message)
                posted[channel] += 1
                if channel in wait_post:
                    ready.append(wait_post.pop(channel))
            elif not syncs.meet(state, r, n, ins, ready):
                break
            n += 1
        state.position[r] = n


def _why(ins, r: int, received: dict, sent: list, ranks: int, syncs: _Syncs) -> str:
    """What a rank stuck at instruction ins waits for."""
    op, stage, mb, pipe = ins[0], ins[1], ins[2], ins[3] or 0
    if op in SENDS:
        return f"until rank {ins[4]} posts its receive #{sent[r * ranks + ins[4]]} from rank {r}"
    if op in COLLECTIVE:
        return f"until every rank of group {list(ins[5] or ())} reaches it ({syncs.absent(r, ins)})"
    got = received.get((*fed_by(op, stage), mb, pipe))
    if got is None:
        return "and uses a tensor from another rank that it has not received"
    return f"until rank {got[0] // ranks} sends it (message #{got[1]})"


class _Syncs:
    """Collectives (SYNC_GRAD and the declared ones): the j-th one of a communicator (pairs.communicator)
    on each member rank meet, and complete only when every member has reached it."""

    def __init__(self, ranks: int):
        self.seen = [{} for _ in range(ranks)]     # rank -> communicator -> collectives passed
        self.arrived: dict[tuple, set[int]] = {}
        self.waiting: dict[tuple, list[int]] = {}
        self.first: dict[tuple, tuple] = {}        # collective -> (the first member's identity, its rank)

    def meet(self, state: Replay, r: int, n: int, ins, ready: list) -> bool:
        """True once every rank of the group has reached its matching collective. A rank outside the
        group, or a collective other than the first member's (pairs.identity), is a fault."""
        group = tuple(ins[5] or ())
        key = self._key(r, ins)
        mine = identity(ins[0], ins[1])
        first, by = self.first.setdefault(key, (mine, r))
        if r not in group or first != mine:
            state.faults.append((self._fault(r, ins, key[1], first, by), (r, n)))
        members = self.arrived.setdefault(key, set())
        members.add(r)
        if len(members) < len(group):
            self.waiting.setdefault(key, []).append(r)
            return False
        self.seen[r][key[0]] = key[1] + 1
        for other in self.waiting.pop(key, ()):
            self.seen[other][key[0]] = key[1] + 1
            state.position[other] += 1
            ready.append(other)
        return True

    def _key(self, r: int, ins) -> tuple:
        order = communicator(ins[0], ins[5])
        return order, self.seen[r].get(order, 0)

    def absent(self, r: int, ins) -> str:
        """The members of the collective rank r waits in that have not reached it, in words."""
        key = self._key(r, ins)
        missing = sorted(set(ins[5] or ()) - self.arrived.get(key, set()))
        return (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                f"{'have' if len(missing) > 1 else 'has'} not") if missing else "all have"

    @staticmethod
    def _fault(r: int, ins, j: int, first: tuple, by: int) -> str:
        group = list(ins[5] or ())
        if ins[0] == Opcode.SYNC_GRAD:
            return (f"rank {r}: SYNC_GRAD #{j} of group {group} for stage {ins[1]}: every rank of the group must "
                    "issue it, for one stage")
        return (f"rank {r}: {Instr.short(ins)} is collective #{j} of group {group}, where rank {by} issued "
                f"{first[0]}: every rank of the group must reach its collectives in one order")


def replay_errors(streams: list, state: Replay, step: int, steps: int) -> list[Diagnostic]:
    diags = [error(f"{where(step, steps)}{fault}", at=(about[0], step, about[1]) if about else None)
             for fault, about in state.faults]
    if not state.blocked:
        return diags
    stuck = sorted(state.blocked)
    reasons = [f"rank {r} blocks at {Instr.short(streams[r][state.position[r]])} (instruction {state.position[r]}) "
               f"{state.blocked[r]}" for r in stuck]
    grid = format_grid(streams, {(r, state.position[r]): "stuck" for r in stuck}, Instr.short)
    collective = any(streams[r][state.position[r]][0] in COLLECTIVE for r in stuck)
    notes = ("a SEND waits until its peer posts the matching RECV; a consumer waits for the SEND",
             *(("a collective completes only when every rank of its group reaches it, and a rank waiting for "
                "a tensor cannot enter one",) if collective else ()))
    return diags + [error(f"{where(step, steps)}the plan hangs under blocking sends"
                          f"{' and collectives' if collective else ''}: " + elide(reasons, 6, "ranks", sep="; "),
                          detail=grid, at=(stuck[0], step, state.position[stuck[0]]), notes=notes)]
