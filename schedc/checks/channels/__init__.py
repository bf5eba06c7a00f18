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

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import chain, compress, count, groupby, islice, repeat
from operator import getitem, itemgetter, lt, setitem

from ...diagnostics import Diagnostic, error
from ...grid import elide, format_grid
from ...ir import consume
from ...ops import COMM, GRADIENT, LINKED, RECVS, SENDS, Opcode, OpKind, carries, fed_by, feeds, link_ends, message
from ...ops import own_stage, peer_stage
from ...plan import Instr, Plan

DIRECTION = {op: carries(op) for op in COMM}  # the kind a message is named by, F or B
OP, PEER = itemgetter(0), itemgetter(4)
FIELDS = itemgetter(1, 2, 3)     # stage, mb, pipe
LINK = itemgetter(0, 1, 3, 4)    # op, stage, pipe, peer
COMPUTE = itemgetter(0, 1, 3)    # op, stage, pipe
SHOWN = 8  # mismatches listed per pair
_F, _B, _SEND, _RECV, _SYNC = 1, 2, 3, 4, 5
_KIND = {OpKind.F.value: _F, **dict.fromkeys(GRADIENT, _B), **dict.fromkeys(SENDS, _SEND),
         **dict.fromkeys(RECVS, _RECV), Opcode.SYNC_GRAD.value: _SYNC}


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
        streams = [plan.ranks[r][step] if step < len(plan.ranks[r]) else () for r in range(plan.devices)]
        if certify(streams, place, microbatches):
            continue
        state = replay(streams, place)
        if state.clean:
            continue
        found = _pairs(streams, place, step, plan.cycle_steps) + _syncs(streams, step, plan.cycle_steps)
        diags += found or _replay_errors(streams, state, step, plan.cycle_steps)
    return diags


# Pairwise sequences (C-level: filters, stable sorts and tuple comparisons) --------------------------

def _messages(instrs: list) -> list[tuple]:
    """(direction, stage, mb, pipe) of each message, as both ends name it."""
    return list(zip(map(DIRECTION.__getitem__, map(OP, instrs)), *zip(*map(FIELDS, instrs)))) if instrs else []


def _by_peer(instrs: list) -> dict[int, list]:
    return {peer: list(group) for peer, group in groupby(sorted(instrs, key=PEER), key=PEER)}


def _pairs(streams: list, place: list[list[int]], step: int, steps: int) -> list[Diagnostic]:
    ranks, sent, got, diags = len(streams), {}, {}, []
    for r, stream in enumerate(streams):
        sends = [ins for ins in stream if ins[0] in SENDS]
        recvs = [ins for ins in stream if ins[0] in RECVS]
        links = sorted(set(map(LINK, sends + recvs)), key=str)
        diags += [_bad_link(r, link, place, ranks, step, steps) for link in links
                  if not _link_ok(r, link, place, ranks)]
        diags += [error(f"{_where(step, steps)}rank {r}: {op}({stage}) of pipeline {pipe} is not a stage of the plan")
                  for op, stage, pipe in sorted(set(map(COMPUTE, stream)), key=str)
                  if op in LINKED and not _stage_ok(stage, pipe, place)]
        for peer, group in _by_peer(sends).items():
            sent[(r, peer)] = group
        for peer, group in _by_peer(recvs).items():
            got[(peer, r)] = group
    for pair in sorted(sent.keys() | got.keys(), key=str):
        ours, theirs = _messages(sent.get(pair, [])), _messages(got.get(pair, []))
        if ours != theirs:
            diags.append(_mismatch(*pair, ours, theirs, step, steps))
    return diags


def _stage_ok(stage, pipe, place: list[list[int]]) -> bool:
    pipe = pipe or 0
    return isinstance(stage, int) and isinstance(pipe, int) and 0 <= pipe < len(place) and 0 <= stage < len(
        place[pipe])


def _link_ok(r: int, link: tuple, place: list[list[int]], ranks: int) -> bool:
    """A message goes between the ranks of its producing and consuming stages."""
    op, stage, pipe, peer = link
    pipe = pipe or 0
    if not isinstance(peer, int) or not 0 <= peer < ranks or peer == r or not 0 <= pipe < len(place):
        return False
    where = place[pipe]
    other, mine = (peer_stage(op, stage), own_stage(op, stage)) if isinstance(stage, int) else (-1, -1)
    return 0 <= other < len(where) and 0 <= mine < len(where) and where[other] == peer and where[mine] == r


def _bad_link(r: int, link: tuple, place, ranks: int, step: int, steps: int) -> Diagnostic:
    op, stage, pipe, peer = link
    return error(f"{_where(step, steps)}rank {r}: {op} of stage {stage} "
                 f"{'to' if op in SENDS else 'from'} rank {peer}, but the stages it links are on "
                 f"{_ends(op, stage, pipe or 0, place)}")


def _syncs(streams: list, step: int, steps: int) -> list[Diagnostic]:
    """The j-th SYNC_GRAD of a group is issued by every member, for one stage."""
    issued: dict[tuple, list[tuple[int, int]]] = {}
    for r, stream in enumerate(streams):
        count: dict[tuple, int] = {}
        for ins in stream:
            if ins[0] == Opcode.SYNC_GRAD:
                group = tuple(ins[5] or ())
                count[group] = count.get(group, 0) + 1
                issued.setdefault((group, count[group] - 1), []).append((r, ins[1]))
    diags = []
    for (group, j), members in sorted(issued.items()):
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


def _ends(op: str, stage, pipe: int, place: list[list[int]]) -> str:
    where = place[pipe] if 0 <= pipe < len(place) else []
    pair = sorted(link_ends(op, stage)) if isinstance(stage, int) else ()
    ranks = [f"stage {s} on rank {where[s]}" for s in pair if 0 <= s < len(where)]
    return " and ".join(ranks) or "no rank (the stage does not exist)"


def _message(message: tuple) -> str:
    direction, stage, mb, pipe = message
    what = "activation" if direction == OpKind.F.value else "gradient"
    return f"the {what} of stage {stage}, microbatch {mb}" + (f", pipeline {pipe}" if pipe else "")


# The rendezvous replay -------------------------------------------------------------------------------

@dataclass
class Replay:
    """Where the replay of one step program stopped: each rank's position, why a stuck rank waits, and
    faults seen on the way (a message that differs from its receive, a tensor received twice or never
    used, a message to the wrong rank, a malformed instruction)."""

    position: list[int]
    blocked: dict[int, str] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)

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
    instructions; one tight loop without allocation on the common path: the hot path of `schedc check`).
    Channels (sender * ranks + receiver) are kept only where messages go, so memory is linear in the
    instructions, not quadratic in the ranks."""
    ranks = len(streams)
    sources, peer_of = _tables(place, ranks)
    state = Replay([0] * ranks)
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
                    if expected[channel][k] != (DIRECTION[ins[0]], ins[1], ins[2], pipe) \
                            or peer_of[ins[0]][pipe][ins[1]] != ins[4]:
                        state.faults.append(f"rank {r}: {Instr.short(ins)} does not match its receive")
                    sent[channel] = k + 1
                    if channel in wait_send:
                        ready.append(wait_send.pop(channel))
                elif kind == _RECV:
                    channel = ins[4] * ranks + r
                    pipe = ins[3] or 0
                    message = (DIRECTION[ins[0]], ins[1], ins[2], pipe)
                    where = (channel, posted[channel])
                    if mine.setdefault(message, where) is not where or peer_of[ins[0]][pipe][ins[1]] != ins[4]:
                        state.faults.append(f"rank {r}: {Instr.short(ins)} is received twice or from the wrong rank")
                    expected[channel].append(message)
                    posted[channel] += 1
                    if channel in wait_post:
                        ready.append(wait_post.pop(channel))
                elif not syncs.meet(state, r, ins, ready):
                    break
                n += 1
            state.position[r] = n
    except (IndexError, KeyError, TypeError) as exc:
        state.faults.append(f"malformed instruction ({type(exc).__name__}: {exc})")
        return state
    state.blocked = {r: _why(streams[r][n], r, n, received[r], sent, posted, ranks) for r, n in
                     enumerate(state.position) if n < len(streams[r])}
    state.faults += [f"rank {r}: receives {len(received[r]) - used[r]} tensors it never uses"
                     for r in range(ranks) if used[r] != len(received[r]) and r not in state.blocked]
    state.faults += [f"rank {c % ranks} posts {posted[c] - sent[c]} receives from rank {c // ranks} that are "
                     "never sent" for c in sorted(posted) if posted[c] != sent[c] and not state.blocked]
    return state


def _why(ins, r: int, n: int, received: dict, sent: list, posted: list, ranks: int) -> str:
    """What a rank stuck at instruction ins waits for."""
    op, stage, mb, pipe = ins[0], ins[1], ins[2], ins[3] or 0
    if op in SENDS:
        return f"until rank {ins[4]} posts its receive #{sent[r * ranks + ins[4]]} from rank {r}"
    if op == Opcode.SYNC_GRAD:
        return f"until every rank of group {list(ins[5] or ())} reaches it"
    got = received.get((*fed_by(op, stage), mb, pipe))
    if got is None:
        return "and uses a tensor from another rank that it has not received"
    return f"until rank {got[0] // ranks} sends it (message #{got[1]})"


class _Syncs:
    """SYNC_GRAD collectives: the j-th one of a group on each member rank meet."""

    def __init__(self, ranks: int):
        self.seen = [{} for _ in range(ranks)]     # rank -> group -> collectives passed
        self.arrived: dict[tuple, set[int]] = {}
        self.waiting: dict[tuple, list[int]] = {}
        self.stage: dict[tuple, object] = {}       # collective -> the stage its first member named

    def meet(self, state: Replay, r: int, ins, ready: list) -> bool:
        """True once every rank of the group has reached its matching SYNC_GRAD. A rank outside the group,
        or a stage other than the first member's, is a fault."""
        group = tuple(ins[5] or ())
        key = (group, self.seen[r].get(group, 0))
        if r not in group or self.stage.setdefault(key, ins[1]) != ins[1]:
            state.faults.append(f"rank {r}: SYNC_GRAD #{key[1]} of group {list(group)} for stage {ins[1]}: every "
                                "rank of the group must issue it, for one stage")
        members = self.arrived.setdefault(key, set())
        members.add(r)
        if len(members) < len(group):
            self.waiting.setdefault(key, []).append(r)
            return False
        self.seen[r][group] = key[1] + 1
        for other in self.waiting.pop(key, ()):
            self.seen[other][group] = key[1] + 1
            state.position[other] += 1
            ready.append(other)
        return True


def _replay_errors(streams: list, state: Replay, step: int, steps: int) -> list[Diagnostic]:
    diags = [error(f"{_where(step, steps)}{fault}") for fault in state.faults]
    if not state.blocked:
        return diags
    stuck = sorted(state.blocked)
    reasons = [f"rank {r} blocks at {Instr.short(streams[r][state.position[r]])} (instruction {state.position[r]}) "
               f"{state.blocked[r]}" for r in stuck]
    grid = format_grid(streams, {(r, state.position[r]): "stuck" for r in stuck}, Instr.short)
    return diags + [error(f"{_where(step, steps)}the plan hangs under blocking sends: "
                          + elide(reasons, 6, "ranks", sep="; "), detail=grid,
                          notes=("a SEND waits until its peer posts the matching RECV; a consumer waits for "
                                 "the SEND",))]


# The static certificate ------------------------------------------------------------------------------
#
# Every wait of the replay is known before it runs: a SEND waits for the receive its message is matched
# to, a consumer for the SEND of its tensor, a SYNC_GRAD for the rest of its collective. So a good step
# program is cleared by whole-list passes (a code per instruction from table lookups, positions scattered
# into lists indexed by message) and a run that stops at waits only; anything unusual goes to the replay.

_SENT, _POSTED, _USED = 1, 2, 3   # an instruction's code is 3K + one of these, K its message
# `_completes` gives up (the plan goes to the replay) after this many rounds per position of an average
# rank, plus a margin for tiny programs; library plans use a sixth to a quarter of the allowance.
_ROUNDS_PER_POSITION, _EXTRA_ROUNDS = 2, 64


def certify(streams: list, place: list[list[int]], microbatches: int) -> bool:
    """True only when `replay(streams, place)` is sure to come back clean (no fault, no rank blocked) and
    every SYNC_GRAD collective is issued by its whole group, for one stage; False whenever in doubt (a
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
    consumer on r that reads another rank (the replay's `reads` table), 0 for one the replay neither
    waits on nor for (a local consumer, STEP, SYNC_GRAD, tasks). Tables are tuples: an index past the
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
        m, codes = self.m, tuple(range(3 * self.size + 1))
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
                cells[r][op][p][stage] = codes[3 * i * m + j:3 * (i + 1) * m + j:3]
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

    owner: list[int]   # rank per position; ranks at 0 ("none") and ranks + 1 at the extra last one
    peers: list
    ends: list[int]
    sent: list[int]
    posted: list[int]
    used: list[int]
    missing: int       # how many K in range(links.size) are not in the program
    waits: list[int]   # the position a SEND's receive, a use's SEND is at; 0 for none
    syncs: list[tuple]


def _scatter(target: list, keys, values) -> None:
    """target[k] = v for each pair in turn (a later pair wins), in one C-level pass."""
    consume(map(setitem, repeat(target), keys, values))


def _layout(streams: list, links: _Links) -> _Layout | None:
    """Codes every instruction and scatters positions by code; None when a code is met twice, a stage,
    microbatch or pipeline is negative, or (one pipeline) a pipe field is neither 0 nor None."""
    slots = [0] * (3 * links.size + 1)   # code -> position of its instruction; slot 0 collects code 0
    owner, peers, ends, syncs, zeros, values, pipes_seen = [len(streams)], [None], [], [], 0, set(), set()
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
            if Opcode.SYNC_GRAD in ops:
                syncs += [(r, start + n, tuple(stream[n][5] or ()), stages[n]) for n, op in enumerate(ops)
                          if op == Opcode.SYNC_GRAD]
        ends.append(len(peers))
        peers.append(None)
        owner += repeat(r, len(stream) + 1)
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
    waits = [0] * len(peers)
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
    """SYNC_GRAD position -> the positions of its collective (the j-th of its group on each member); None
    unless every collective is issued by exactly its group's ranks, for one stage."""
    seen: dict[tuple, int] = {}
    members: dict[tuple, list] = {}
    for r, x, group, stage in syncs:
        j = seen[(r, group)] = seen.get((r, group), -1) + 1
        members.setdefault((group, j), []).append((r, x, stage))
    meets = {}
    for (group, _), issued in members.items():
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
    waits = lay.waits[:]                   # and -1: stop (a rank's end, a SYNC_GRAD)
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
        if not (moved or _release(set(meets.values()), passed, owner)):
            return passed[:ranks] == lay.ends
    return False


def _release(collectives: set[tuple], passed: list[int], owner: list[int]) -> bool:
    """Lets through every SYNC_GRAD collective whose members all wait at it."""
    done = [c for c in collectives if all(passed[owner[x]] == x for x in c)]
    for x in chain.from_iterable(done):
        passed[owner[x]] = x + 1
    return bool(done)
