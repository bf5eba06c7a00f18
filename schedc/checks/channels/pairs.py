"""check_channels, pairwise: for every ordered pair of ranks (a, b) the sends of a to b are, one for
one, the receives b posts from a (kind, stage, microbatch, pipeline: plan/channels.py's matching, which
the runtime checks too); every message goes between the
ranks of its producing and consuming stages; the j-th SYNC_GRAD of a group is issued by every member,
for one stage. Used to name the faults of a step program that the replay finds stuck or faulty.

    rank 0 sends F(0,0) F(0,1), rank 1 posts RECV_F(0,1) RECV_F(0,0)
    -> error: messages from rank 0 to rank 1 do not match: 2 sent, 2 received; first difference at message 0
"""
from __future__ import annotations

from operator import itemgetter

from ...diagnostics import Diagnostic, error
from ...ops import COLLECTIVE, LINKED, RECVS, SENDS, Opcode, OpKind, link_ends, own_stage, peer_stage
from ...plan.channels import mismatches

LINK = itemgetter(0, 1, 3, 4)    # op, stage, pipe, peer
COMPUTE = itemgetter(0, 1, 3)    # op, stage, pipe
SHOWN = 8  # mismatches listed per pair


def pair_errors(streams: list, place: list[list[int]], step: int, steps: int) -> list[Diagnostic]:
    """Every pair's sends against its receives, and every message's ranks against its stages' placement."""
    ranks, diags = len(streams), []
    for r, stream in enumerate(streams):
        sends = [ins for ins in stream if ins[0] in SENDS]
        recvs = [ins for ins in stream if ins[0] in RECVS]
        links = sorted(set(map(LINK, sends + recvs)), key=str)
        diags += [_bad_link(r, link, place, ranks, step, steps, _first(stream, lambda ins: LINK(ins) == link))
                  for link in links if not _link_ok(r, link, place, ranks)]
        diags += [error(f"{where(step, steps)}rank {r}: {op}({stage}) of pipeline {pipe} is not a stage of the plan",
                        at=(r, step, _first(stream, lambda ins: COMPUTE(ins) == (op, stage, pipe))))
                  for op, stage, pipe in sorted(set(map(COMPUTE, stream)), key=str)
                  if op in LINKED and not _stage_ok(stage, pipe, place)]
    diags += [_mismatch(*m.pair, m.index, m.sent, m.received, step, steps, streams) for m in mismatches(streams)]
    return diags


def _first(stream, test, nth: int = 0) -> int | None:
    """The index of the nth instruction of `stream` that passes `test` (None when there are fewer): where
    a diagnostic points (Diagnostic.at), found once a fault is known."""
    for n, ins in enumerate(stream):
        if test(ins):
            if not nth:
                return n
            nth -= 1
    return None


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


def _bad_link(r: int, link: tuple, place, ranks: int, step: int, steps: int, index: int | None) -> Diagnostic:
    op, stage, pipe, peer = link
    return error(f"{where(step, steps)}rank {r}: {op} of stage {stage} "
                 f"{'to' if op in SENDS else 'from'} rank {peer}, but the stages it links are on "
                 f"{_ends(op, stage, pipe or 0, place)}", at=(r, step, index))


def communicator(op: str, group) -> tuple:
    """The order a collective is matched in: NCCL matches a communicator's collectives by issue order
    alone. SYNC_GRAD's all-reduce has a communicator per group; the collectives ops declare (ALL_TO_ALL,
    ALL_GATHER, ...) share another per group."""
    return op == Opcode.SYNC_GRAD, tuple(group or ())


def identity(op: str, stage) -> tuple:
    """What the members of one collective must agree on: its kind, and for SYNC_GRAD the stage whose
    gradients it sums (a declared collective's members may hold different stages)."""
    return (op, stage) if op == Opcode.SYNC_GRAD else (op,)


def sync_errors(streams: list, step: int, steps: int) -> list[Diagnostic]:
    """The j-th collective of a communicator is issued by every member of its group, as one collective
    (SYNC_GRAD for one stage; a declared one of one kind): members reach a group's collectives in one
    order."""
    issued: dict[tuple, list[tuple[int, tuple]]] = {}
    for r, stream in enumerate(streams):
        count: dict[tuple, int] = {}
        for ins in stream:
            if ins[0] in COLLECTIVE:
                key = communicator(ins[0], ins[5])
                count[key] = count.get(key, 0) + 1
                issued.setdefault((key, count[key] - 1), []).append((r, identity(ins[0], ins[1])))
    diags = []
    for ((sync, group), j), members in sorted(issued.items()):
        ranks = sorted(r for r, _ in members)
        if sync:
            stages = sorted({ident[1] for _, ident in members}, key=str)
            if ranks != sorted(group) or len(stages) != 1:
                diags.append(error(f"{where(step, steps)}SYNC_GRAD #{j} of group {list(group)} is issued by ranks "
                                   f"{ranks} for stages {stages}; every rank of the group must issue it, for one stage"))
        elif ranks != sorted(group) or len({ident for _, ident in members}) != 1:
            what = ", ".join(f"rank {r} {ident[0]}" for r, ident in sorted(members))
            diags.append(error(f"{where(step, steps)}collective #{j} of group {list(group)}: {what}; every rank of "
                               "the group must reach the group's collectives in one order (NCCL matches them by "
                               "issue order)", at=(members[0][0], step, None)))
    return diags


def _mismatch(a: int, b: int, k: int, sent: list, got: list, step: int, steps: int, streams: list) -> Diagnostic:
    """Located at the receive that differs at message k (rank b expects it), or at the send when b posts none."""
    at = ((b, step, _first(streams[b], lambda ins: ins[0] in RECVS and ins[4] == a, k)) if k < len(got) else
          (a, step, _first(streams[a], lambda ins: ins[0] in SENDS and ins[4] == b, k)))
    first = (f"message {k}: rank {a} sends {_message(sent[k]) if k < len(sent) else 'nothing'}, rank {b} "
             f"expects {_message(got[k]) if k < len(got) else 'nothing'}")
    notes = tuple(f"message {i}: sent {_short(sent, i)}, received {_short(got, i)}"
                  for i in range(k, min(k + SHOWN, max(len(sent), len(got)))))
    return error(f"{where(step, steps)}messages from rank {a} to rank {b} do not match: {len(sent)} sent, "
                 f"{len(got)} received; first difference at {first}", notes=notes, at=at)


def _short(messages: list, i: int) -> str:
    if i >= len(messages):
        return "-"
    direction, stage, mb, pipe = messages[i]
    return f"{direction}({stage},{mb})" + (f".{pipe}" if pipe else "")


def where(step: int, steps: int) -> str:
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
