"""`schedc tune --model M --cluster C --gpus N --global-batch B`: the command line of the configuration
search (schedc/search.py) and what it prints: the ranked table, the pruned families, the winner's
command lines and, with --why, where a given configuration ranks and why; or a JSON list best first
on stdout, the pruned families and --why on stderr.

    schedc tune --model gpt.toml --cluster dgx-a100-80gb --gpus 3072 --global-batch 3072 \\
        --schedules 1f1b,interleaved_1f1b --top 5 [--memory-limit 80GiB] [--json] [--exhaustive]
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from ..diagnostics import usage
from ..layout import LAYOUT_OPTIONS, RECOMPUTE, RECOMPUTE_FORMS, Layout, SplitError, option_flags, parse_stage_layers, reshard_problem, run_flags
from ..diagnostics import SCHEDULE, SchedError
from ..costmodel.fit import sharding_words
from ..text import GIB, more, ordinal, plural, rate
from ..search.results import Outcome, Refusal
from ..search.searcher import Searcher
from ..search.space import SET_PER_CANDIDATE, Request
from .runnable import PLAN_SHOWN, LocalRun, run_refusal


# The command line ---------------------------------------------------------------------------------

def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise usage(f"{name}: expected positive integers separated by commas, got {text!r}")
    return tuple(dict.fromkeys(values))  # each once, in the order given


def _names(text: str | None, name: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",")) if text is not None else ()
    if text is not None and (not values or not all(values)):
        raise usage(f"{name}: expected a list separated by commas, got {text!r}")
    bad = [x for x in values if allowed is not None and x not in allowed]
    if bad:
        raise usage(f"{name}: unknown value {bad[0]!r} (choose from {', '.join(allowed)})")
    return tuple(dict.fromkeys(values))  # each once, in the order given




def request_from(o: dict[str, Any]) -> Request:
    """The Request of the command line's options; bad values are usage errors (exit 2). --model,
    --cluster, --gpus and --global-batch are checked here, not by click, so that the same command can
    take other modes (--synthesize) without them."""
    from ..checks.memory import parse_bytes
    missing = [f"--{k.replace('_', '-')}" for k in ("model", "cluster", "gpus", "global_batch") if o[k] is None]
    if missing:
        raise usage(f"the configuration search needs {', '.join(missing)}")
    limit = None
    if o["memory_limit"] is not None:
        try:
            limit = parse_bytes(o["memory_limit"])
        except SchedError as exc:
            raise usage(exc.diagnostics[0].message.replace("or 1e10)", "or 1e10 bytes)")) from None
        if limit < 2**20:
            raise usage(f"--memory-limit {o['memory_limit']}: {limit:g} bytes per GPU, less than 1 MiB; give a unit "
                        f"(e.g. 80GiB)")
    return Request(o["model"], o["cluster"], o["gpus"], o["global_batch"],
                   schedules=_names(o["schedules"], "--schedules"), memory_limit=limit,
                   recompute=_names(o["recompute"], "--recompute", RECOMPUTE_FORMS) or RECOMPUTE,
                   tp=_ints(o["tp"], "--tp"), pp=_ints(o["pp"], "--pp"), top=o["top"], per=o["per"],
                   exhaustive=o["exhaustive"], walk_ops=o["walk_ops"], microbatch=_ints(o["microbatch"], "--microbatch-size"),
                   layout=_layout(o), seq=o.get("seq"), ep=_ints(o.get("ep"), "--ep"),
                   # --cp not given: cp 1, not searched: the cost model's attention under the ring over-predicts
                   # as cp grows (docs/benchmarks.md, torchtitan's Table 6), so a searched cp would win on that error
                   cp=(1,) if o.get("cp") is None else None,
                   zero=() if o.get("zero") is None and not o.get("distributed_optimizer") else None)


def _layout(o: dict[str, Any]) -> Layout:
    """Every candidate's layout: the layout options given (not None) among `o`, the rest Layout's
    defaults (the search sets t, d, b and recomputation per candidate); a usage error for a bad
    --stage-layers or --stage-layers with an --account-for-* flag."""
    split = {opt.field: o[opt.field] for opt in LAYOUT_OPTIONS
             if opt.field not in SET_PER_CANDIDATE and o.get(opt.field) is not None}
    if split.get("stage_layers") is not None:
        try:
            split["stage_layers"] = parse_stage_layers(split["stage_layers"])
        except SplitError as exc:
            raise usage(str(exc)) from None
        if split.get("account_for_embedding") or split.get("account_for_loss"):
            raise usage("--stage-layers gives every stage's layers; --account-for-embedding and --account-for-loss "
                        "only change the even split: give one or the other")
    problem = reshard_problem(o.get("reshard_after_forward"), o.get("zero"))
    if problem:
        raise usage(problem)
    return Layout(**split)


_WHY_KEYS = {"t": int, "p": int, "d": int, "v": int, "b": int, "recompute": str, "cp": int, "zero": int, "ep": int}
PARTS = (("compute_s", "compute"), ("tensor_parallel_comm_s", "tensor-parallel comm"), ("bubble_s", "bubble"),
         ("pipeline_comm_s", "pipeline comm"), ("data_parallel_comm_s", "data-parallel comm"),
         ("optimizer_s", "optimizer"))  # the breakdown's parts, as --why compares them


def parse_why(text: str) -> dict[str, Any]:
    """--why '[SCHEDULE] t=8 p=1 ...': the schedule (the one word without '='), and t, p, d, v, b,
    recompute as given; a usage error (exit 2) for anything else."""
    wanted: dict[str, Any] = {}
    for word in text.replace(",", " ").split():
        key, eq, value = word.partition("=")
        if not eq:
            if "schedule" in wanted:
                raise usage(f"--why {text!r}: two schedules ({wanted['schedule']!r}, {word!r}); give one")
            wanted["schedule"] = word
            continue
        kind = _WHY_KEYS.get(key)
        if kind is None or key in wanted:
            why = f"{key}= is given twice" if key in wanted else f"unknown key {key!r}"
            raise usage(f"--why {text!r}: {why} (give a schedule and any of {', '.join(_WHY_KEYS)}, as t=8)")
        if kind is int and not (value.isascii() and value.isdigit() and len(value) <= 18
                                and int(value) >= (key != "zero")):  # zero=0 is a level
            shown = value if len(value) <= 20 else f"{value[:12]}... ({len(value):,} characters)"
            asked = text if len(text) <= 80 else text[:60] + "..."
            raise usage(f"--why {asked!r}: {key} must be a positive integer, got {shown!r}")
        wanted[key] = kind(value)
        if key == "recompute" and value not in RECOMPUTE_FORMS:
            raise usage(f"--why {text!r}: recompute is one of {', '.join(RECOMPUTE_FORMS)}, got {value!r}")
    if not wanted:
        raise usage("--why: give a configuration, as --why '1f1b t=8 p=1'")
    return wanted


def why_lines(searcher: Searcher, outcome: Outcome, space: list, text: str, chosen: list,
              bar: Callable[[int, str], Any] | None = None) -> list[str]:
    """Where the best of `chosen` (the candidates --why's `text` matches, matching()) ranks among
    `space`, exactly, and its breakdown against the winner's, part by part; or why none of them runs.
    bar(length, label): a progress bar (a context manager with update(n)) for the ranking walk."""
    results = [(searcher.evaluate(c), c) for c in chosen]
    running = sorted((r.iteration_s, c) for r, c in results if not isinstance(r, Refusal))
    head = f"why {text.strip()} ({plural(len(chosen), 'candidate')} of the search)"
    if not running:
        # the schedule's own fault first (a deadlock at every size), then the least over memory
        refusal, c = min(((r, c) for r, c in results),
                         key=lambda rc: (not rc[0].fault, rc[0].memory is None, rc[0].memory or 0, rc[1]))
        return [f"{head}: none runs; the nearest, {c.describe()}: {refusal.message}"]
    best = running[0][1]
    if bar:
        with bar(len(space), "why") as progress:
            searcher.progress = progress.update
            overall, family = searcher.rank(best, space)
    else:
        overall, family = searcher.rank(best, space)
    mine, winner = searcher.evaluate(best, free=True), outcome.ranked[0]
    lines = [f"{head}: its best, {best.describe()}: {mine.iteration_s:.4f} s, {rate(mine.tflops_per_gpu)} TFLOP/s "
             f"per GPU, {mine.memory_bytes / GIB:.1f} GiB",
             f"  ranks {ordinal(overall)} of the search, {ordinal(family)} among {best.schedule}"]
    if best == winner.candidate:
        return lines + a2a_lines(mine, winner.prediction) + tp_overlap_lines(searcher, best, mine) + ["  it is the winner"]
    lines[-1] += (f"; {100 * (mine.iteration_s / winner.iteration_s - 1):.1f} % slower than the winner "
                  f"({winner.candidate.describe()}, {winner.iteration_s:.4f} s)")
    lines.append(f"  against the winner (s): {breakdown_difference(mine, winner.prediction)} (memory GiB "
                 f"{mine.memory_bytes / GIB:.1f} against {winner.prediction.memory_bytes / GIB:.1f})")
    lines.append(f"  memory against the winner (GiB): {memory_difference(mine, winner.prediction)}")
    return lines + a2a_lines(mine, winner.prediction) + tp_overlap_lines(searcher, best, mine)


def a2a_lines(mine, winner) -> list[str]:
    """For a model with experts: the expert-parallel all-to-all of a step on the critical device, left
    exposed and hidden under the other half of overlapped pairs (F & B), this configuration's and the
    winner's."""
    if "a2a_hidden_s" not in mine.extra:
        return []
    def split(p) -> str:
        return f"{p.extra['a2a_exposed_s']:.4f} s exposed, {p.extra['a2a_hidden_s']:.4f} s hidden"
    return [f"  expert all-to-all per step (critical device): {split(mine)} in overlapped pairs; the winner's "
            f"{split(winner)}"]


def tp_overlap_lines(searcher: Searcher, best, mine) -> list[str]:
    """With t > 1: the tensor-parallel communication a layer exposes per microbatch and forward with and
    without --tp-comm-overlap (each GEMM hides what it can of its all-gather or reduce-scatter), and
    the step's as the candidate runs."""
    if best.t == 1:
        return []
    from ..costmodel.stages import tp_exposure
    overlapped, plain = tp_exposure(searcher.setting(best))
    running = "with" if searcher.request.layout.tp_comm_overlap else "without"
    return [f"  tensor-parallel comm per layer and microbatch (forward; again in the backward): "
            f"{1e3 * overlapped:.3f} ms exposed with --tp-comm-overlap, {1e3 * plain:.3f} ms without; "
            f"this step's, {running} it: {mine.breakdown['tensor_parallel_comm_s']:.4f} s"]


MEMORY_PARTS = (("weights_gradients_optimizer", "weights, gradients and optimizer"), ("activations", "activations"),
                ("optimizer_step", "optimizer step"), ("allocator_and_context", "allocator and context"))


def memory_difference(mine, other) -> str:
    """Two predictions' memory on their largest device, part by part in GiB (mine minus other's), the
    activations' deferred weight gradients (held from I to W) named apart."""
    def deferred(p) -> float:
        return p.extra.get("deferred_w_gib", 0.0)
    parts = [f"{name} {round((mine.memory_parts[key] - other.memory_parts[key]) / GIB, 2) + 0.0:+.2f}"
             for key, name in MEMORY_PARTS]
    parts[1] += (f" (deferred W {deferred(mine):.2f} against {deferred(other):.2f})"
                 if deferred(mine) or deferred(other) else "")
    return ", ".join(parts)


def matching(space: list, wanted: dict[str, Any]) -> list:
    """The candidates of `space` that are what --why gives."""
    return [c for c in space if all(getattr(c, k) == v for k, v in wanted.items())]


def breakdown_difference(mine, other) -> str:
    """Two predictions' breakdowns, part by part in seconds (mine minus other's)."""
    parts = PARTS + ((("context_parallel_comm_s", "context-parallel comm"),)
                     if "context_parallel_comm_s" in mine.breakdown or "context_parallel_comm_s" in other.breakdown else ())
    return ", ".join(f"{name} {round(mine.breakdown.get(key, 0.0) - other.breakdown.get(key, 0.0), 4) + 0.0:+.4f}"
                     for key, name in parts)  # + 0.0: no -0.0000


def pruned_lines(text: str) -> int | None:
    """--pruned N or all (None: every line)."""
    if text.strip() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise usage(f"--pruned: expected a count or all, got {text!r}")
    return n


def _fit(r) -> str:
    """What a candidate's stages must do with the layers: fit the request's split, or divide them."""
    if r.layout.stage_layers is not None:
        return f"number {len(r.layout.stage_layers)}, as --stage-layers gives"
    if r.layout.account_for_embedding or r.layout.account_for_loss:
        return "fit the layer split (--account-for-*)"
    return "divide the model's layers"


def no_layout(outcome: Outcome) -> SchedError:
    r = outcome.request
    return usage(f"no layout of {r.gpus} GPUs whose pipeline stages {_fit(r)} "
                 f"(t x p x d = {r.gpus}, d dividing the global batch {r.global_batch}; {outcome.space})")


def nothing_fits(outcome: Outcome, shown: int | None = 8) -> SchedError:
    from ..diagnostics import Source, error
    limit = outcome.request.memory_limit
    rest = len(outcome.pruned) - shown if shown is not None else 0
    notes = outcome.pruned[:shown] + ((f"{more(rest, 'families')} (--pruned all lists them)",) if rest > 0 else ())
    what = f"{limit / GIB:g} GiB per GPU" if limit is not None else "the GPU's memory"
    counts = outcome.counts
    head = (f"no configuration fits in {what}"  # a deadlocking order runs in no memory
            if counts["over_memory"] and not counts["deadlocked"] else "no configuration runs")
    stop = outcome.stopped
    if stop is not None:  # not an answer: the walk stopped before one ran
        return usage(f"the walk's budget of {stop.limit:,} ops (--walk-ops) was spent "
                     f"before any candidate ran ({counts['over_memory']} over memory, {counts['refused']} refused "
                     f"by their schedule), {plural(stop.left, 'candidate')} left: raise --walk-ops (0: no budget) or "
                     f"narrow the search with --tp, --pp, --microbatch-size, --schedules or --zero")
    if counts["over_memory"] and counts["refused"]:  # not all for memory: the rest their schedule refused
        head += f" ({counts['over_memory']} over the memory, {counts['refused']} refused by their schedule)"
    return SchedError(error(f"{head} ({outcome.space})", notes=notes),
                      Source("schedc tune", ""), kind=SCHEDULE)


def pruned_report(outcome: Outcome, pruned_lines: int | None) -> list[str]:
    """The pruned families, at most `pruned_lines` of them (None: all), with a heading."""
    if outcome.pruned and pruned_lines == 0:
        return [f"{plural(len(outcome.pruned), 'pruned family', 'pruned families')} (--pruned all lists them)"]
    if not outcome.pruned:
        return []
    lines = [f"pruned families ({len(outcome.pruned)}; schedule, t, p none of whose candidates was simulated):"]
    lines += [f"  {text}" for text in outcome.pruned[:pruned_lines]]
    if pruned_lines is not None and len(outcome.pruned) > pruned_lines:
        lines.append(f"  {more(len(outcome.pruned) - pruned_lines)} (--pruned all lists them)")
    return lines


def stop_notes(outcome: Outcome) -> tuple[str, ...]:
    """Where the walk stopped at its budget, and which rows that leaves certain; () where it walked all."""
    stop = outcome.stopped
    if stop is None or not outcome.ranked:
        return ()
    exact = stop.exact(outcome.ranked)
    best = outcome.ranked[0].prediction.iteration_s
    certain = (f"rows 1 to {exact} are certain, the others may be passed by them" if exact > 1 else
               "row 1 is certain, the others may be passed by them" if exact == 1 else
               f"no row is certain: one of them may be up to {1 - stop.bound / best:.1%} faster than row 1")
    return (f"the walk stopped at its budget of {stop.limit:,} ops (--walk-ops) with "
            f"{plural(stop.left, 'candidate')} left, none faster than {stop.bound:.4g} s per iteration (their least "
            f"lower bound): {certain}; --walk-ops 0 walks them all",)


def report(outcome: Outcome, pruned_lines: int | None = 12, notes: tuple[str, ...] = ()) -> str:
    """The ranked table, the assumptions that decide its rows (`notes`: assumption_notes), the pruned
    families, the counts, and the winner's command lines."""
    r = outcome.request
    w = max([18] + [len(item.label()) for item in outcome.ranked])
    cp = any(item.candidate.cp > 1 for item in outcome.ranked)  # columns of the dimensions that vary
    zero = r.zero == ()
    experts = any(item.candidate.ep != 1 for item in outcome.ranked)  # an ep column only where one is searched
    head = (f"{'#':>3}  {'schedule':<{w}} {'t':>3}{'  cp' if cp else ''} {'p':>4} {'d':>4} {'v':>3}{' ep' if experts else ''}"
            f" {'b':>4} {'m':>5} {'recompute':<9}{' zero' if zero else ''}"
            f" {'TFLOP/s/GPU':>11} {'iteration s':>11} {'memory GiB':>10} {'bubble':>7} {'MFU':>5}")
    params = outcome.ranked[0].prediction.extra["parameters"] if outcome.ranked else None
    model = f" of {params / 1e9:.2f}e9 parameters" if params is not None else ""
    lines = [f"schedc tune: a model{model} on {plural(r.gpus, 'GPU')}{sharding_words(r.layout)}, global batch {r.global_batch}, {outcome.space}",
             head]
    for n, item in enumerate(outcome.ranked, 1):
        c, p = item.candidate, item.prediction
        v = "-" if c.v is None else str(c.v)
        ep = f" {c.ep:>2}" if experts else ""
        lines.append(f"{n:>3}  {item.label():<{w}} {c.t:>3}{f' {c.cp:>3}' if cp else ''} {c.p:>4} {c.d:>4} {v:>3}{ep}"
                     f" {c.b:>4} {c.m:>5} {c.recompute:<9}{f' {c.zero:>4}' if zero else ''}"
                     f" {p.tflops_per_gpu:>11.1f} {p.iteration_s:>11.4f} {p.memory_bytes / GIB:>10.1f}"
                     f" {item.bubble:>7.4f} {p.extra['mfu']:>5.3f}")
    lines += [f"note: {note}" for note in (*stop_notes(outcome), *notes)]
    counts = outcome.counts
    why = "ZeRO 2/3's collectives on each device's lane, or " if r.exhaustive and (r.zero == () or r.layout.zero >= 2) else ""
    whole = (f", {counts['compiled_whole']} compiled whole ({why}tasks, a fill, a greedy order or placed R, O, L ops)"
             if counts["compiled_whole"] else "")
    grouped = f", the {r.top} best of each {r.per}" if r.per else ""
    left = f"{counts['left']} left at the walk's budget, " if counts.get("left") else ""
    merged = f"{counts['merged']} merged into the row of the same order and layout, " if counts.get("merged") else ""
    lines.append(f"ranked by iteration time{grouped}; {counts['candidates']} candidates: "
                 f"{plural(counts['structures'], 'distinct order')} compiled, timed in "
                 f"{plural(counts['simulated'], 'simulation')} (one per cost vector and message times; the ranked are "
                 "timed once more without messages, for their bubble)"
                 f"{whole}, {counts['bounded']} bounded out before simulating, {left}{merged}"
                 f"{counts['over_memory']} over memory, {counts['refused']} refused by their schedule, "
                 f"{counts['layers']} with stages that do not {_fit(r)}; "
                 f"{outcome.seconds:.2f} s")
    lines += pruned_report(outcome, pruned_lines)
    lines.append("the winner:")
    lines += [f"  {command}" for command in winner_commands(outcome)]
    tiny = tiny_model(outcome.request)
    shown = f"a {TINY_HIDDEN}-wide {tiny[0]} of the same facts" if tiny else "the runtime's GPT"
    lines.append(f"the same layout scaled to this machine (the schedule, t, recomputation; p = 2, {shown}):")
    lines += [f"  {line}" for line in local_lines(outcome, tiny)]
    return "\n".join(lines)


def winner_commands(outcome: Outcome) -> list[str]:
    """The command lines that simulate, compile and render the best candidate."""
    import shlex
    r = outcome.request
    c = outcome.ranked[0].candidate
    defines = " ".join(f"-D {k}={v}" for k, v in c.params().items() if k != "m")
    fixed = [o.field for o in LAYOUT_OPTIONS if o.field not in SET_PER_CANDIDATE]
    chosen = replace(r.layout, cp=c.cp, zero=c.zero, distributed_optimizer=False)  # zero 1: the distributed optimizer
    flags = "".join(f" {word}" for word in option_flags(chosen, fixed))
    seq = f" --seq {r.seq}" if r.seq is not None else ""
    common = (f"{shlex.quote(c.schedule)} {defines} --model {shlex.quote(r.model)}{seq} --cluster {shlex.quote(r.cluster)} "
              f"--tp {c.t} --dp {c.d} --microbatch-size {c.b} --global-batch {r.global_batch} "
              f"--recompute {c.recompute}{flags}" + (f" --ep {c.ep}" if c.ep != 1 else ""))
    return [f"schedc simulate {common}", f"schedc compile {common} -o out/tune",
            f"schedc render {common} -o tune.svg"]


LOCAL_STAGES = 2  # the winner scaled to this machine: two pipeline devices of at most LOCAL_TP ranks, d = 1
LOCAL_TP = 2


TINY_HIDDEN, TINY_HEADS, TINY_SEQ, TINY_VOCAB = 64, 8, 64, 256  # the runtime's byte text needs vocab 256


def tiny_model(r: Request) -> tuple[str, tuple[str, ...]] | None:
    """A model of the request's family the runtime builds on CPU ranks, as its family and the runtime's
    options: --model as asked with hidden 64, 8 heads over 2 key/value heads where it groups them (t <= 2
    splits them), the MLP's width in the model's ratio to hidden (a multiple of 16), sequence 64 (or
    the learned positions' count, if fewer) and vocabulary 256. None for a GPT (the runtime's own, no --model needed), a mixture of experts or
    latent attention (the runtime builds those from a config.json only or not at all): the runtime's
    GPT stands in."""
    from ..costmodel.modelspec import load_model_spec
    spec = load_model_spec(r.model, r.seq)
    if spec.family == "gpt" or spec.moe or spec.mla or spec.head_size:
        return None
    kv_heads = TINY_HEADS if spec.kv_heads == spec.heads else LOCAL_TP
    ffn = max(16, 16 * round(spec.ffn * TINY_HIDDEN / spec.hidden / 16))
    seq = min(TINY_SEQ, spec.max_positions or TINY_SEQ)  # within GPT-2's learned positions
    return spec.family, ("--model", r.model, "--hidden", str(TINY_HIDDEN), "--heads", str(TINY_HEADS),
                         "--kv-heads", str(kv_heads), "--ffn", str(ffn), "--seq", str(seq),
                         "--vocab", str(TINY_VOCAB))


def local_run(outcome: Outcome, tiny: tuple[str, tuple[str, ...]] | None = None) -> LocalRun:
    """The winner's layout scaled to this machine: the same schedule, t (at most 2), recomputation and
    sequence parallelism, p = 2, m = 8, d = 1 (at most 4 CPU ranks), on `tiny` (tiny_model: a small
    model of the request's family) or the runtime's GPT."""
    r, c = outcome.request, outcome.ranked[0].candidate
    params = {**c.params(), "p": LOCAL_STAGES, "m": 4 * LOCAL_STAGES}
    t = min(c.t, LOCAL_TP)
    layout = Layout(tp=t, microbatch_size=min(c.b, 4), recompute=c.recompute,
                    sequence_parallel=r.layout.sequence_parallel and t > 1)
    layers = 4 * LOCAL_STAGES * int(params.get("v", 1))  # enough for V shapes and two-pipeline schedules
    return LocalRun(c.schedule, tuple(f"{k}={v}" for k, v in params.items()), t * LOCAL_STAGES,
                    ("--steps", "3", *(tiny[1] if tiny else ()), "--layers", str(layers), *run_flags(layout)))


def local_commands(run: LocalRun) -> list[str]:
    """The compile and the `schedc run` of a local run, as a user types them."""
    import shlex
    defines = " ".join(f"-D {d}" for d in run.defines)
    return [f"schedc compile {shlex.quote(run.schedule)} {defines} -o out/tune-local",
            f"schedc run {PLAN_SHOWN} --nproc {run.nproc} " + " ".join(shlex.quote(o) for o in run.options)]


def local_lines(outcome: Outcome, tiny: tuple[str, tuple[str, ...]] | None = None) -> list[str]:
    """The local run's commands, or, where the runtime's pre-launch check refuses the run, why."""
    run = local_run(outcome, tiny)
    refusal = run_refusal(run)
    if refusal:
        return [f"not runnable by schedc's runtime: {refusal}"]
    return local_commands(run)


REFERENCE_CLUSTER = "dgx-a100-80gb"  # the cluster whose efficiencies were fitted (docs/benchmarks.md, Table 1)
_EFFICIENCIES = (("gemm_efficiency", "GEMM"), ("gemm_half_dim", "GEMM half-speed dimension"),
                 ("hbm_efficiency", "HBM"), ("intra_efficiency", "NVLink"), ("inter_efficiency", "network"))


def assumption_notes(searcher: Searcher, outcome: Outcome) -> tuple[str, ...]:
    """What the ranked rows rest on beyond the search: a schedule's overlapped F & B pairs (what a pair
    hides), ZeRO 2/3's and context parallelism's hidden communication, and a cluster whose
    efficiencies are the A100's (the fitted cluster's, equal field for field) on another GPU."""
    from ..costmodel.specs import load_cluster
    rows = [item.candidate for item in outcome.ranked]
    notes = []
    paired = sorted({c.schedule for c in rows if searcher.entries[c.schedule].mixed and searcher.entries[c.schedule].pairs})
    if paired:
        notes.append(f"{', '.join(paired)}: an overlapped F & B pair hides each half's pipeline (and context-parallel) "
                     "messages under the other half's compute, never more than that compute; tensor-parallel "
                     "collectives stay exposed (DeepSeek-V3's and Megatron-Core's overlap)")
    if any(c.zero >= 2 for c in rows):
        notes.append("zero 2/3: each stage's gather is prefetched under the op before it and each reduce-scatter "
                     "runs behind its backward on the device's communication lane; the first gather and the last "
                     "reduce-scatter stay exposed")
    if any(c.cp > 1 for c in rows):
        notes.append("cp > 1: the K/V ring's messages are hidden under the attention blocks, up to what those take")
    reference, cluster = load_cluster(REFERENCE_CLUSTER), searcher.cluster
    same = [f"{word} {getattr(cluster, k):g}" for k, word in _EFFICIENCIES if getattr(cluster, k) == getattr(reference, k)]
    if cluster.peak_flops != reference.peak_flops and same:
        notes.append(f"{cluster.name}: efficiencies {', '.join(same)} are the A100's (fitted on {REFERENCE_CLUSTER}), "
                     "not measured on this GPU: every row's time assumes them")
    return tuple(notes)
