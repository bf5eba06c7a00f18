"""check_channels, the static certificate: clears a good step program without running it.

Every wait of the replay is known before it runs: a SEND waits for the receive its message is matched
to, a consumer for the SEND of its tensor, a collective (SYNC_GRAD, ALL_TO_ALL, ...) for the rest of its
members. So a good step program is cleared by whole-list passes (a code per instruction from table
lookups, positions scattered into lists indexed by message) and a run that stops at waits only; anything
unusual goes to the replay.
"""
from __future__ import annotations

from array import array
from collections import defaultdict
from dataclasses import dataclass
from itertools import chain, compress, count, islice, repeat
from operator import getitem, lt, setitem

from ...ir import consume
from ...ops import COLLECTIVE, COMM, GRADIENT, OpKind, feeds, message
from .pairs import communicator, identity

_SENT, _POSTED, _USED = 1, 2, 3   # an instruction's code is 3K + one of these, K its message
# `_completes` gives up (the plan goes to the replay) after this many rounds per position of an average
# rank, plus a margin for tiny programs; library plans use a sixth to a quarter of the allowance.
_ROUNDS_PER_POSITION, _EXTRA_ROUNDS = 2, 64


def certify(streams: list, place: list[list[int]], microbatches: int) -> bool:
    """True only when `replay(streams, place)` is sure to come back clean (no fault, no rank blocked) and
    every collective is issued by its whole group, as one collective (pairs.identity); False whenever in doubt (a
    microbatch outside range(microbatches), a field that is not an int, a consumer or message on a rank
    that does not hold its stage, a tensor received twice or used twice, ...).

    Sound because message codes are one-to-one (a code met twice is refused, so each message is sent,
    received and used exactly once), its ends are the ranks the replay's tables name, each channel
    carries its messages in one order at both ends, and a run over the waits completes."""
    try:
        links = _Links(place, len(streams), microbatches, budget=sum(map(len, streams)) + 4096)
        lay = _layout(streams, links)
        return lay is not None and _matched(lay, links) and _completes(lay, len(streams))
    except (TypeError, ValueError, IndexError, KeyError):
        return False


class _Links:
    """Tables of one step program's messages. A link is a (pipeline, stage, direction) whose two stages sit
    on different ranks; message K = link * m + mb. `top[r][op][pipe][stage][mb]` is the code of an
    instruction on rank r: 3K + _SENT or _POSTED where r holds that end of the link, 3K + _USED for a
    consumer on r that reads another rank (the replay's `sources` table), 0 for one the replay neither
    waits on nor for (a local consumer, STEP, SYNC_GRAD, tasks). Stages are looked up in dicts of the rank's own
    (a missing one fails), microbatches in tuples: an index past the
    end or not an int fails; `_layout` refuses negative ones, which would wrap round to another message.
    With one pipeline the pipe level is left out (`flat`)."""

    def __init__(self, place: list[list[int]], ranks: int, m: int, budget: int):
        links, self.sender, self.receiver = [], [], []
        for p, where in enumerate(place):
            if any(type(x) is not int or not 0 <= x < ranks for x in where):
                raise ValueError("placement")
            for s, kind, other in ((s, kind, feeds(kind, s)) for s in range(len(where))
                                   for kind in (OpKind.F.value, OpKind.B.value)):
                if 0 <= other < len(where) and where[other] != where[s]:
                    links.append((p, s, kind, other))
                    self.sender.append(where[s])
                    self.receiver.append(where[other])
        self.m, self.size, self.flat = m, len(links) * m, len(place) == 1
        if self.size > budget:
            raise ValueError("more messages than the program has instructions")
        # Code 0: the replay neither waits on nor for it. Any op not in the tables (STEP, SYNC_GRAD, tasks,
        # but also a misspelt SEND_F) gets code 0 at every pipe, stage and mb through this chain; a misspelt
        # send is still caught: its message is then never sent, so the counts of `_layout` (filled % 3)
        # or of `_matched` (`missing`) refuse the program.
        self.local = defaultdict(int)                                        # any mb -> 0
        other = defaultdict(repeat(self.local).__next__)                     # any stage -> local
        other = other if self.flat else defaultdict(repeat(other).__next__)  # any pipe
        self.top = [defaultdict(repeat(other).__next__, table) for table in self._tables(place, ranks, links)]
        self.sender_k = list(chain.from_iterable(repeat(x, m) for x in self.sender))
        self.receiver_k = list(chain.from_iterable(repeat(x, m) for x in self.receiver))
        channels: dict[tuple, list[int]] = {}
        for i, pair in enumerate(zip(self.sender, self.receiver)):
            channels.setdefault(pair, []).append(i)
        self.channels = list(channels.values())

    def _tables(self, place: list[list[int]], ranks: int, links: list[tuple]) -> list[dict]:
        m = self.m
        consumers = (OpKind.F.value, OpKind.B.value)
        # per rank, op and pipe: stage -> codes, for the stages the rank holds or messages (a dict each:
        # a list per stage on every rank grew with the square of the device count; a missing stage
        # fails the lookup, as an index past the end of a tuple did)
        cells = [{op: [{} for _ in place] for op in (*sorted(COMM), *consumers)} for _ in range(ranks)]
        for p, where in enumerate(place):
            for s, r in enumerate(where):
                for kind in consumers:
                    cells[r][kind][p][s] = self.local
        for i, (p, s, kind, other) in enumerate(links):
            ends = zip((*message(kind), kind),
                       (self.sender[i], self.receiver[i], self.receiver[i]), (s, s, other), (_SENT, _POSTED, _USED))
            for op, r, stage, j in ends:
                # a range, not a tuple of its codes: indexed alike (an int in range, else a failed
                # lookup), without an int object per message held for the check's length
                cells[r][op][p][stage] = range(3 * i * m + j, 3 * (i + 1) * m + j, 3)
        tables = [{op: pipes[0] if self.flat else tuple(pipes) for op, pipes in mine.items()} for mine in cells]
        for table in tables:
            for kind in GRADIENT:
                table[kind] = table[OpKind.B.value]
        return tables

    def codes(self, r: int, ops: tuple, stages: tuple, mbs: tuple, pipes: tuple) -> list:
        """The code of each instruction of rank r, from its columns (C-level lookups, level by level)."""
        top = self.top[r]
        if not {int, type(None)}.issuperset(map(type, stages)):  # a dict takes 1.0 and True for 1: ints only
            raise TypeError("a stage that is not an int")
        if self.flat:
            return list(map(getitem, map(getitem, map(top.__getitem__, ops), stages), mbs))
        return list(map(getitem, map(getitem, map(getitem, map(top.__getitem__, ops), pipes), stages), mbs))


@dataclass
class _Layout:
    """A step program's instructions numbered one after another from 1 (0: none), each rank's followed by
    an end position: the rank and the peer field at each position, where each message K is sent,
    received and used (0 for a K not in the program), and what each position waits for."""

    owner: array       # rank per position; ranks at 0 ("none") and ranks + 1 at the extra last one
    peers: list
    ends: list[int]
    sent: array        # by K: the positions (int arrays, as `waits`)
    posted: array
    used: array
    missing: int       # how many K in range(links.size) are not in the program
    waits: array       # the position a SEND's receive, a use's SEND is at; 0 for none (`_completes` marks
    # its stops in it)
    syncs: list[tuple]


def _zeros(size: int, top: int) -> array:
    """size zeros in an int array whose items hold values up to top: 32-bit where they fit (at 10^6 ops
    the positions and codes in 64-bit items would hold a tenth of a GiB more while the check runs)."""
    code = "i" if top < 2 ** 31 else "q"
    return array(code, bytes(array(code).itemsize * size))


def _scatter(target: list, keys, values) -> None:
    """target[k] = v for each pair in turn (a later pair wins), in one C-level pass."""
    consume(map(setitem, repeat(target), keys, values))


def _layout(streams: list, links: _Links) -> _Layout | None:
    """Codes every instruction and scatters positions by code; None when a code is met twice, a stage,
    microbatch or pipeline is negative, or (one pipeline) a pipe field is neither 0 nor None."""
    # code -> position of its instruction; slot 0 collects code 0. Positions are kept in arrays here and
    # in `waits`, not as an int object each (at 10^6 ops, a tenth of a GiB while the check runs).
    positions = sum(map(len, streams)) + len(streams) + 1
    slots = _zeros(3 * links.size + 1, positions)
    owner = array("i" if len(streams) < 2 ** 31 - 1 else "q", [len(streams)])
    peers, ends, syncs, zeros, values, pipes_seen = [None], [], [], 0, set(), set()
    for r, stream in enumerate(streams):
        start = len(peers)
        if stream:
            ops, stages, mbs, pipes, peer = islice(zip(*stream), 5)
            values.update(stages, mbs)
            pipes_seen.update(pipes)
            codes = links.codes(r, ops, stages, mbs, pipes)
            _scatter(slots, codes, count(start))
            zeros += codes.count(0)
            peers += peer
            if not COLLECTIVE.isdisjoint(ops):
                syncs += [(r, start + n, tuple(stream[n][5] or ()), communicator(op, stream[n][5]),
                           identity(op, stages[n])) for n, op in enumerate(ops) if op in COLLECTIVE]
        ends.append(len(peers))
        peers.append(None)
        owner += array(owner.typecode, (r,)) * (len(stream) + 1)  # repeated in C
    owner.append(len(streams) + 1)   # owner[-1]: the rank `_completes` reads for a wait of -1 (stop)
    slots[0] = 0
    # A code met twice: each instruction with a nonzero code writes its position (>= 1) into its code's
    # slot, so with all codes distinct the filled slots number the instructions (all positions but 0 and
    # the ends) less those of code 0; a repeated code overwrites a slot and leaves one fewer. A message
    # has three codes: filled % 3 refuses most half-present ones and keeps `missing` exact.
    filled = len(slots) - slots.count(0)
    if (min((values | pipes_seen) - {None}, default=0) < 0 or links.flat and not pipes_seen <= {None, 0}
            or filled != len(peers) - 1 - len(streams) - zeros or filled % 3):
        return None
    sent, posted, used = slots[_SENT::3], slots[_POSTED::3], slots[_USED::3]
    waits = _zeros(len(peers), len(peers))
    _scatter(waits, sent, posted)    # a SEND waits for its receive to be posted
    _scatter(waits, used, sent)      # a consumer waits for the SEND of its tensor
    return _Layout(owner, peers, ends, sent, posted, used, links.size - filled // 3, waits, syncs)


def _matched(lay: _Layout, links: _Links) -> bool:
    """Every message is sent, received and used (the tables put each on the rank of its stage); the peer
    fields name the other end; it is received before it is used; each channel keeps its order."""
    sent, posted, used, to, source = lay.sent, lay.posted, lay.used, links.receiver_k, links.sender_k
    if lay.missing:
        if not sent.count(0) == posted.count(0) == used.count(0) == lay.missing:
            return False
        sent, posted, used, to, source = (list(compress(x, lay.sent)) for x in (sent, posted, used, to, source))
        if 0 in posted or 0 in used:
            return False
    to_peer, from_peer = list(map(lay.peers.__getitem__, sent)), list(map(lay.peers.__getitem__, posted))
    return (to_peer == to and from_peer == source and type(sum(to_peer)) is type(sum(from_peer)) is int
            and all(map(lt, posted, used)) and _in_order(lay, links))


def _in_order(lay: _Layout, links: _Links) -> bool:
    """Taken in the order they are sent, a channel's messages are received at increasing positions (a
    stage's microbatches are runs, so the sorts are merges)."""
    m = links.m
    for ids in links.channels:
        sends = sorted(chain.from_iterable(lay.sent[i * m:(i + 1) * m] for i in ids))
        receives = list(map(lay.waits.__getitem__, sends))
        if receives != sorted(receives):
            return False
    return True


def _collectives(syncs: list[tuple]) -> dict[int, tuple] | None:
    """Collective position -> the positions of its collective (the j-th of its communicator on each
    member); None unless every collective is issued by exactly its group's ranks, as one collective
    (pairs.identity)."""
    seen: dict[tuple, int] = {}
    members: dict[tuple, list] = {}
    for r, x, group, order, ident in syncs:
        j = seen[(r, order)] = seen.get((r, order), -1) + 1
        members.setdefault((order, j), []).append((r, x, ident))
    meets = {}
    for ((_, group), _), issued in members.items():
        if sorted(r for r, _, _ in issued) != sorted(group) or any(s != issued[0][2] for _, _, s in issued):
            return None
        meets.update(dict.fromkeys((x for _, x, _ in issued), tuple(x for _, x, _ in issued)))
    return meets


def _completes(lay: _Layout, ranks: int) -> bool:
    """Runs the ranks round after round, each as far as its waits allow (a wait is over once the rank it
    names has passed the awaited position), until a round moves nothing: complete when every rank is at
    its end. A visit costs little, and a round moves every rank that can move, where an event queue would
    stop at nearly every wait (pipeline neighbours take turns). Library plans take a third of a visit per
    instruction; a plan that needs many more rounds is left to the replay."""
    meets = _collectives(lay.syncs)
    if meets is None:
        return False
    waits = lay.waits                      # and -1: stop (a rank's end, a collective), in place: its last reader
    for x in chain(lay.ends, meets):
        waits[x] = -1
    owner = lay.owner
    # passed[r]: the first position rank r has not passed (its first instruction to start with). Two
    # sentinel "ranks" follow: owner[0] == ranks has passed everything, so a wait for position 0 (none)
    # is always over; owner[-1] == ranks + 1 has passed nothing, so a wait of -1 never is.
    passed = [e + 1 for e in [0, *lay.ends[:-1]]][:ranks] + [len(waits), -1]
    for _ in range(_ROUNDS_PER_POSITION * len(waits) // max(ranks, 1) + _EXTRA_ROUNDS):
        moved = False
        for r in range(ranks):
            g = here = passed[r]
            while passed[owner[waits[g]]] > waits[g]:
                g += 1
            if g != here:
                passed[r] = g
                moved = True
        if not (moved or meets and _release(meets, passed[:ranks], passed, owner)):
            return passed[:ranks] == lay.ends
    return False


def _release(meets: dict[int, tuple], at: list[int], passed: list[int], owner: list[int]) -> bool:
    """Lets through every collective whose members all wait at it, found from where the ranks stand
    (`at`): a stall costs the ranks, not the collectives (declared ones follow nearly every op)."""
    waiting = {meets[x] for x in at if x in meets}
    done = [c for c in waiting if all(passed[owner[x]] == x for x in c)]
    for x in chain.from_iterable(done):
        passed[owner[x]] = x + 1
    return bool(done)
