"""What tune searches: the request (the command line's model, cluster, GPUs, batch and limits), the
library schedules it can set, and the candidates: t, p, d, v, b, m and recomputation per schedule."""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..budget import TUNE_WALK
from ..diagnostics import SchedError, usage
from ..layout import RECOMPUTE, SELECTIVE_OPS, Layout




SEARCHED = ("p", "v", "m")        # the params the search sets; a schedule's others keep their defaults
MOE_ONLY = "combined_1f1b"      # searched by default for a model with experts only (Megatron-Core asserts ep > 1)


GROUPS = ("schedule", "t", "p", "v", "b", "recompute", "cp", "zero")  # --per: the K best of each value

# The layout options the search sets per candidate (t, d, b, recomputation) or takes as its own (the
# global batch); every other one (schedc.layout.LAYOUT_OPTIONS) is every candidate's, as given.
SET_PER_CANDIDATE = ("tp", "dp", "microbatch_size", "global_batch", "recompute", "ep")


@dataclass(frozen=True)
class Request:
    """What `schedc tune` was asked: files, sizes, limit and the space's restrictions."""

    model: str
    cluster: str
    gpus: int
    global_batch: int
    schedules: tuple[str, ...] = ()          # () -> the library's schedules the search can set
    memory_limit: float | None = None        # bytes per GPU; None -> the cluster's GPU memory
    recompute: tuple[str, ...] = RECOMPUTE
    tp: tuple[int, ...] | None = None        # restrict t (and p) to these values
    pp: tuple[int, ...] | None = None
    top: int = 10
    per: str | None = None                   # one of GROUPS: the top K of each group, exactly
    exhaustive: bool = False
    microbatch: tuple[int, ...] | None = None  # restrict b to these values
    layout: Layout = Layout()                # every candidate's switches and layer split; the search sets t,
    #                                          d, b, the global batch and recomputation per candidate
    seq: int | None = None                   # --seq: the run's sequence length over the model description's
    ep: tuple[int, ...] | None = None        # restrict ep to these values (None: every one an MoE model takes)
    cp: tuple[int, ...] | None = None        # context-parallel sizes: None the layout's alone; () every size the
    #                                          model's sequence (2·cp chunks) and attention kernel allow
    zero: tuple[int, ...] | None = None      # ZeRO levels: None the layout's alone; () every level its switches allow
    walk_ops: int = TUNE_WALK.limit          # the walk's budget (budget.TUNE_WALK); 0: none


@dataclass(frozen=True, slots=True, order=True)
class Candidate:
    """One point of the space; m = B / (b d) microbatches per pipeline."""

    schedule: str
    t: int
    p: int
    d: int
    v: int | None
    b: int
    m: int
    recompute: str
    cp: int = 1          # last: the order of candidates without context parallelism or sharding is as before
    zero: int = 0
    ep: int = 1          # expert parallelism, carved from d x cp (1 for a dense model)

    def params(self) -> dict[str, str]:
        out = {"p": str(self.p), "m": str(self.m)}
        if self.v is not None:
            out["v"] = str(self.v)
        return out

    def structure_key(self) -> tuple:
        return (self.schedule, self.p, self.v, self.m)

    def describe(self) -> str:
        v = f" v={self.v}" if self.v is not None else ""
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        zero = f" zero={self.zero}" if self.zero else ""
        ep = f" ep={self.ep}" if self.ep != 1 else ""
        return (f"{self.schedule} t={self.t}{cp} p={self.p} d={self.d}{v}{ep} b={self.b} recompute {self.recompute}"
                f"{zero}")

    def group(self, per: str | None) -> Any:
        return None if per is None else getattr(self, per)


@dataclass(frozen=True)
class Entry:
    """A schedule the search may set: its parsed declaration and what decides how it is evaluated."""

    name: str     # as given: a library name or a path
    decl: Any
    source: Any
    params: tuple[str, ...]
    split: bool
    plain: bool   # the order depends on costs, or tasks/fill/memory/R, O, L ops: compiled whole per candidate
    mixed: bool = False  # a mixed backward (B or I + W per microbatch)
    filled: bool = False  # `fill bubbles with`: each candidate's compile searches a fill (about a second)
    pairs: bool = True  # its programs may place overlapped F & B pairs (`F & B`): a pair's F saves time
    squeezed: bool = False  # `squeeze` moves its ops after the programs ran (V-Half, V-Min): no start, more work

    @property
    def chunked(self) -> bool:
        return "v" in self.params


def library_entries(names: Iterable[str]) -> list[Entry]:
    """The schedules named (library names or files); () -> every library schedule whose params the
    search sets (p and m, optionally v) and that declares no tasks. Unknown names are a usage error."""
    from ..frontend import ast
    from ..frontend.library import library_files, resolve
    from ..driver import load_declaration, read_source
    names = list(names)
    default = not names
    if default:
        names = [path.stem for path in library_files()]
    entries, seen = [], {}
    for name in names:
        path = resolve(name)
        if not path.exists() or path.suffix != ".sched":
            known = ", ".join(p.stem for p in library_files())
            raise usage(f"--schedules: no library schedule or .sched file named {name!r} (library: {known})")
        if path.resolve() in seen:  # one schedule named twice (`1f1b` and its path) is searched once
            continue
        seen[path.resolve()] = name
        source = read_source(path)
        decl = load_declaration(source)  # as every compile loads it: extends and use resolved
        params = tuple(d.name for d in decl.decls if isinstance(d, ast.Param))
        tasks = any(isinstance(d, (ast.TaskDecl, ast.Fill)) for d in decl.decls)
        placed = any(isinstance(d, (ast.Recompute, ast.Offload)) for d in decl.decls)  # the layout's recompute
        if default and (tasks or placed or not set(params) <= set(SEARCHED)):  # decides those, not the order
            continue
        if "p" not in params or "m" not in params:
            raise usage(f"--schedules: {name} has no param {'p' if 'p' not in params else 'm'}: the search sets "
                        f"p (pipeline devices) and m (microbatches), and v where the schedule has it")
        plain = tasks or placed or any(isinstance(d, (ast.Greedy, ast.MemoryDecl)) for d in decl.decls)
        split = any(isinstance(d, ast.SplitBackward) for d in decl.decls)
        mixed = any(isinstance(d, ast.MixedBackward) for d in decl.decls)
        filled = any(isinstance(d, ast.Fill) for d in decl.decls)
        pairs = any(ast.contains(d, ast.Overlap) for d in decl.decls if isinstance(d, ast.Program))
        squeezed = any(isinstance(d, ast.Squeeze) for d in decl.decls)
        entries.append(Entry(path.stem if default else name, decl, source, params, split, plain, mixed, filled,
                             pairs, squeezed))
    return entries


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (trial division up to its square root)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


_SIZES = ("heads", "hidden", "ffn", "vocab", "kv_heads")  # what t must divide


def _all_layouts(model, n: int, batch: int, tp=None, pp=None) -> list[tuple[int, int, int]]:
    """The one layout rule: (t, p, d) with t p d = n, t dividing the model's sizes, d the batch; t and p
    among tp and pp when given."""
    return [(t, p, n // (t * p)) for t in divisors(n) if not any(getattr(model, k) % t for k in _SIZES)
            and (tp is None or t in tp) for p in divisors(n // t)
            if batch % (n // (t * p)) == 0 and (pp is None or p in pp)]


def layouts(model, request: Request) -> list[tuple[int, int, int, int]]:
    """(t, cp, p, d) with t cp p d = N for each context-parallel size searched (sharding_choices): t
    divides the heads (and hidden, ffn, vocab), d the global batch. None -> a usage error saying why
    (exit 2): the --tp (--pp) values that leave no layout even without the other restriction, else the
    two together."""
    out = []
    for cp in sorted({cp for cp, _ in sharding_choices(model, request)}):
        out += [(t, cp, p, d) for t, p, d in _layouts_of(model, request, cp)]
    if not out:  # every size searched leaves none: why, as for cp = 1 alone (exit 2)
        _layouts_of(model, replace(request, cp=None), 1)
    return out


def _layouts_of(model, request: Request, cp: int) -> list[tuple[int, int, int]]:
    """layouts of one context-parallel size: (t, p, d) of the N / cp GPUs of one context rank."""
    n, batch, tp, pp = request.gpus, request.global_batch, request.tp, request.pp
    if cp < 1 or n % cp:
        raise usage(f"--cp {cp} does not divide --gpus {n:,} (t x cp x p x d = N)")
    n //= cp  # the t x p x d GPUs of one context-parallel rank
    out = _all_layouts(model, n, batch, tp, pp)
    if out or request.cp == ():  # a searched size that leaves no layout is left out
        return out
    reasons = []
    for t in tp or ():
        bad = [k for k in _SIZES if getattr(model, k) % t]
        if bad:
            reasons.append(f"--tp {t} does not divide the model's {bad[0]} ({getattr(model, bad[0]):,})")
        elif not _all_layouts(model, n, batch, (t,)):
            reasons.append(f"--tp {t}: no {t} x p x d = {n} GPUs with d dividing the global batch {batch}")
    for p in pp or ():
        if not _all_layouts(model, n, batch, None, (p,)):
            reasons.append(f"--pp {p}: no t x {p} x d = {n} GPUs with d dividing the global batch {batch}")
    if tp is not None and pp is not None and len(reasons) < len(tp) + len(pp):
        reasons.append(f"--tp {','.join(map(str, tp))} with --pp {','.join(map(str, pp))}: no t x p x d = {n} "
                       f"GPUs among them with d dividing the global batch {batch}")
    if reasons:
        raise usage(f"no layout of {n} GPUs: " + "; ".join(reasons))
    raise usage(f"no layout of {n} GPUs: t x p x d = {n} with t dividing the {model.heads} heads "
                f"(and hidden, ffn, vocab) and d dividing the global batch {batch}")


def candidates(model, entries: list[Entry], request: Request) -> list[Candidate]:
    """Every point of the space, in a fixed order (the stages' fit to the layers is checked later);
    counted first, and refused past budget.TUNE_CANDIDATES before any is made (exit 2)."""
    from ..budget import TUNE_CANDIDATES
    found = layouts(model, request)
    recomputes, experts = _per_layout(model, request, found)
    refused = TUNE_CANDIDATES.refusal(_count(model, entries, request, found, recomputes, experts),
                                      "the search would bound")
    if refused:
        raise usage(refused)
    out = []
    levels = sharding_choices(model, request)
    for t, cp, p, d in found:
        per_replica = request.global_batch // d
        zeros = [zero for c, zero in levels if c == cp and _shards(request, zero, d * cp)]
        for entry in entries:
            for v in (chunk_choices(model, request, p) if entry.chunked else [None]):
                for b in divisors(per_replica):
                    if request.microbatch is not None and b not in request.microbatch:
                        continue
                    for recompute in recomputes[t, cp]:
                        out += [Candidate(entry.name, t, p, d, v, b, per_replica // b, recompute, cp, zero, ep)
                                for zero in zeros for ep in experts[t, d, cp]]
    if not out and request.microbatch is not None:
        shares = sorted({request.global_batch // d for _, _, _, d in found})
        raise usage(f"--microbatch-size {','.join(map(str, request.microbatch))}: no value divides the "
                    f"sequences per pipeline, B / d = {', '.join(map(str, shares))}")
    return out


def _per_layout(model, request: Request, found: list[tuple[int, int, int, int]]) -> tuple[dict, dict]:
    """The recomputations of each (t, cp) and the expert-parallel sizes of each (t, d, cp) searched; where
    every layout refuses every value asked, the refusal simulate gives (exit 2)."""
    recomputes = {(t, cp): recompute_choices(model, request, t, cp) for t, cp, _, _ in found}
    if recomputes and not any(recomputes.values()):
        recompute_choices(model, request, *min(recomputes), given=True)
    experts = {(t, d, cp): expert_choices(model, request, t, d, cp) for t, cp, _, d in found}
    if experts and not any(experts.values()):
        expert_choices(model, request, *min(experts), given=True)
    return recomputes, experts


def _count(model, entries: list[Entry], request: Request, found: list[tuple[int, int, int, int]],
           recomputes: dict, experts: dict) -> int:
    """How many candidates `candidates` makes of these layouts, without making them."""
    total, levels = 0, sharding_choices(model, request)
    for t, cp, p, d in found:
        sizes = divisors(request.global_batch // d)
        b = len(sizes) if request.microbatch is None else sum(x in request.microbatch for x in sizes)
        chunked = len(chunk_choices(model, request, p))
        zeros = sum(c == cp and _shards(request, zero, d * cp) for c, zero in levels)
        total += (b * len(recomputes[t, cp]) * zeros * sum(chunked if e.chunked else 1 for e in entries)
                  * len(experts[t, d, cp]))
    return total


def recompute_choices(model, request: Request, t: int, cp: int, given: bool = False) -> list[str]:
    """The recomputations searched at t and cp: the request's, less those simulate refuses there
    (costmodel.specs.check_layout: torchtitan's per-op policy where specs.op_policy_refusal says it is not
    modelled, --eager's block at t > 1). At t and cp `given`, the first refusal is raised (exit 2)."""
    from ..costmodel.specs import check_layout
    lay = request.layout
    if SELECTIVE_OPS not in request.recompute and not lay.eager:
        return list(request.recompute)
    out = []
    for recompute in request.recompute:
        try:
            check_layout(model, Layout(tp=t, cp=cp, recompute=recompute, fp8=lay.fp8, eager=lay.eager,
                                       sequence_parallel=lay.sequence_parallel), request.model)
        except SchedError:
            if given:
                raise
            continue
        out.append(recompute)
    return out


def _shards(request: Request, zero: int, group: int) -> bool:
    """Whether a level is searched on a shard group of `group` GPUs: a searched level above 0 over one GPU
    is the unsharded run again (left out); a level the layout fixes is every candidate's."""
    return request.zero != () or zero == 0 or group > 1


def sharding_choices(model, request: Request) -> list[tuple[int, int]]:
    """The (cp, ZeRO level) pairs searched: the layout's own where the request fixes them (--cp, --zero,
    --distributed-optimizer; refused as the layout check refuses them), else every context-parallel
    size dividing the GPUs whose 2·cp chunks split the sequence under a flash kernel, and every level
    the layout's switches allow (costmodel.specs.check_layout, as a compile asks it)."""
    from ..costmodel.specs import check_layout
    from ..layout import ZERO_LEVELS
    lay = request.layout
    cps = [lay.cp] if request.cp is None else list(request.cp) or [
        c for c in divisors(request.gpus) if c == 1 or (model.flash and model.seq % (2 * c) == 0)]
    zeros = [lay.sharding] if request.zero is None else list(request.zero) or list(ZERO_LEVELS)
    def checked(cp: int, zero: int) -> Layout:
        return Layout(cp=cp, zero=zero, overlap_grad_reduce=lay.overlap_grad_reduce,
                      distributed_optimizer=lay.distributed_optimizer and zero == 1)

    if (request.cp is None and lay.cp > 1) or (request.zero is None and lay.sharding):  # given: refused as given
        check_layout(model, checked(lay.cp if request.cp is None else 1, lay.sharding if request.zero is None else 0),
                     request.model)
    out = []
    for cp in cps:
        for zero in zeros:
            if cp > 1 or zero:
                try:
                    check_layout(model, checked(cp, zero), request.model)
                except SchedError:  # a searched value the model or the switches refuse is left out
                    continue
            out.append((cp, zero))
    return out


def chunk_choices(model, request: Request, p: int) -> list[int | None]:
    """The chunks per device v >= 2 of an interleaved schedule on p devices: those whose v p stages the
    layer split fits evenly (the layers, with the embedding and the loss counted when the request says
    so), or the one --stage-layers gives; [None] (the schedule's own v, refused later) when none."""
    layout = request.layout
    if layout.stage_layers is not None:
        stages = len(layout.stage_layers)
        return [stages // p] if stages % p == 0 and stages // p >= 2 else [None]
    units = model.layers + layout.account_for_embedding + layout.account_for_loss
    return [v for v in divisors(units // p) if v >= 2] or [None] if units % p == 0 else [None]


def distinct_figures(a: float, b: float) -> tuple[str, str]:
    """a and b to 4 significant digits, or to as many more as tell them apart (at most 12)."""
    digits = 4
    while digits < 12 and f"{a:.{digits}g}" == f"{b:.{digits}g}":
        digits += 1
    return f"{a:.{digits}g}", f"{b:.{digits}g}"


def ep_choices(model, request: Request, d: int, cp: int) -> list[int]:
    """The expert-parallel sizes of a layout with d data and cp context ranks: --ep's values (filtered by
    expert_choices, as simulate checks them), else for a model with experts every ep dividing its experts
    and d x cp (Megatron-Core carves the expert-parallel groups from the data and context ranks), else 1."""
    if request.ep is not None:
        return list(request.ep)
    if not model.moe:
        return [1]
    ranks = d * cp
    return [ep for ep in divisors(model.experts) if ranks % ep == 0]


def expert_choices(model, request: Request, t: int, d: int, cp: int, given: bool = False) -> list[int]:
    """ep_choices of a layout of t x cp x d ranks, less the sizes simulate refuses there with the request's
    --etp and --moe-dispatcher (costmodel.specs.check_layout: ep dividing the experts and d x cp, or with
    --etp, etp x ep dividing t x cp x d; --etp a positive size, either over a model with experts). At t,
    d, cp `given`, the first refusal is raised (exit 2)."""
    from ..costmodel.specs import check_layout
    etp, dispatcher = request.layout.etp, request.layout.moe_dispatcher
    if request.ep is None and etp is None and not dispatcher:  # ep_choices' own sizes: simulate takes every one
        return ep_choices(model, request, d, cp)
    if request.ep is not None:
        sizes = list(request.ep)
    elif etp is None:
        sizes = ep_choices(model, request, d, cp)
    elif model.moe and etp > 0:  # the folded expert layout: etp x ep of a stage's t x cp x d GPUs
        sizes = [ep for ep in divisors(model.experts) if (t * cp * d) % (etp * ep) == 0] or [1]
    else:
        sizes = [1]
    out = []
    for ep in sizes:
        try:
            check_layout(model, Layout(tp=t, dp=d, cp=cp, ep=ep, etp=etp, moe_dispatcher=dispatcher), request.model)
        except SchedError:
            if given:
                raise
            continue
        out.append(ep)
    return out
