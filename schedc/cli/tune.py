"""`schedc tune`: the configuration search and its report (with progress bars), or --synthesize."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from functools import partial

import click

from typing import Any

from ..diagnostics import usage
from ..diagnostics import EXIT_CODES, SCHEDULE, SchedError
from ..text import agree, plural
from .group import main
from .options import TUNE_FIXED, check_defines, check_latency, option_given, tune_options
from .common import end, fail, fail_json, progress_line




_SYNTHESIZE_ONLY = ("defines", "costs", "costs_file", "activation_limit", "out", "latency")
_IN_BYTES = ("model", "microbatch", "recompute", "memory_limit")  # --synthesize's too, in bytes with --model
_ON_CLUSTER = ("model", "seq", "cluster", "microbatch", "recompute", "tp", *TUNE_FIXED)  # --synthesize --cluster


@main.command("tune")
@click.option("--synthesize", "synth", is_flag=True,
              help="Find a per-device order within --activation-limit and write it as a .sched file.")
@click.option("-D", "defines", multiple=True, metavar="NAME=VALUE", callback=check_defines,
              help="With --synthesize: -D p=N (devices) and -D m=N (microbatches).")
@click.option("--cost", "costs", multiple=True, metavar="KIND=VALUE[,...]",
              help="With --synthesize: cost of F, B, or split I and W; one value or one per stage (defaults F=1, "
                   "B=2; I=W=1); over --costs.")
@click.option("--costs", "costs_file", type=click.Path(dir_okay=False), default=None,
              help="With --synthesize: measured costs of F, B (or I and W) per stage, JSON from "
                   "`schedc run --profile-out`, as for simulate.")
@click.option("--activation-limit", "activation_limit", default=None, metavar="N[,...]",
              help="With --synthesize: activations a device may hold, one value or one per device.")
@click.option("--latency", type=float, default=0.0, show_default=True, callback=check_latency,
              help="With --synthesize: latency of every message between devices (>= 0).")
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False),
              help="With --synthesize: the .sched file to write (default or -: print it).")
@tune_options
@click.option("--json", "as_json", is_flag=True,
              help="Print the ranked list as JSON, best first (with --synthesize: the order's summary).")
def tune_cmd(synth, defines, costs, costs_file, activation_limit, latency, out, options, as_json):
    """Search schedules and parallel layouts (t, p, d, v, b, recomputation) for a model on a cluster,
    ranked by the predicted iteration time of each schedule's simulated order; or, with --synthesize,
    find a per-device order for given costs under an activation-memory limit."""
    from ..diagnostics import usage
    ctx = click.get_current_context()
    flags = {param.name: param.opts[0] for param in ctx.command.params}  # --microbatch-size, not its dest

    def given(names) -> list[str]:
        return [flags[name] for name in names if option_given(name)]

    failing = fail_json if as_json else fail
    if synth and options["cluster"] is not None:  # the row's own costs: ZB-1p, ZB-2p
        search_only = given(name for name in options if name not in _ON_CLUSTER)
        if search_only:
            failing(usage(f"{', '.join(search_only)}: not {agree(len(search_only), 'an option', 'options')} of "
                          "--synthesize --cluster (it takes --model, the layout's options, -D p= and -D m=)"))
        return _synthesize(defines, costs, latency, activation_limit, out, costs_file, as_json,
                           on_cluster=_on_cluster(options, failing))
    if synth:
        in_bytes = options["model"] is not None  # then the memory is the model's bytes
        search_only = given(name for name in options if not (in_bytes and name in _IN_BYTES))
        if search_only:
            hint = (" (with --synthesize the limit is --activation-limit N, activations per device, or with "
                    "--model, --microbatch-size b, --memory-limit in bytes)" if "--memory-limit" in search_only else "")
            failing(usage(f"{', '.join(search_only)}: {agree(len(search_only), 'option', 'options')} of the "
                          f"configuration search, not of --synthesize{hint}"))
        from ..synthesize.options import InBytes
        return _synthesize(defines, costs, latency, activation_limit, out, costs_file, as_json,
                           InBytes(options["model"], options["microbatch"], options["recompute"],
                                   options["memory_limit"]) if in_bytes else None)
    synthesis_only = given(_SYNTHESIZE_ONLY)
    if synthesis_only:
        failing(usage(f"{', '.join(synthesis_only)} {agree(len(synthesis_only), 'goes', 'go')} with --synthesize"))
    try:
        click.echo(run_search(options, as_json))
    except SchedError as exc:
        failing(exc)  # under --json: {"valid": false, "diagnostics": [...]} on stdout, the error on stderr


def _on_cluster(options, failing):
    """The model, the cluster and one layout of --synthesize --cluster: --microbatch-size and --recompute
    one value each (default b = 1, no recomputation), --tp one size, the fixed switches as given."""
    from .tune_report import _layout
    from ..synthesize.cluster import OnCluster
    from ..layout import RECOMPUTE
    if options["model"] is None:
        failing(usage("--synthesize --cluster needs --model (the row's costs are the cost model's)"))
    try:
        values = {"microbatch_size": int(options["microbatch"] or 1), "tp": int(options["tp"] or 1)}
    except ValueError:
        failing(usage("--synthesize --cluster takes one --microbatch-size and one --tp (integers)"))
    recompute = options["recompute"] or "none"
    if recompute not in RECOMPUTE:
        failing(usage(f"--recompute {recompute!r}: with --synthesize one of {', '.join(RECOMPUTE)}"))
    try:
        layout = replace(_layout(options), recompute=recompute, **values)
    except SchedError as exc:
        failing(exc)
    return OnCluster(options["model"], options["cluster"], layout, options.get("seq"))


def _synthesize(defines, costs, latency, activation_limit, out, costs_file, as_json, in_bytes=None,
                on_cluster=None) -> None:
    """`schedc tune --synthesize`: the order, written or printed, and its report (--json: the summary
    on stdout, with the text in it when there is no -o)."""
    from ..driver import parse_defines
    from ..synthesize.options import run_tune
    if as_json and out == "-":
        out = None  # the text goes into the JSON, as without -o
    shown = sys.stderr.isatty() and not as_json
    try:
        made = run_tune(parse_defines(defines), costs, latency, activation_limit, out,
                        partial(progress_line, "synthesizing: greedy variant") if shown else None, costs_file,
                        in_bytes, on_cluster)
    except SchedError as exc:
        if as_json:
            fail_json(exc)
        fail(exc)
    finally:
        if shown:
            click.echo("\r\033[K", err=True, nl=False)
    if as_json:
        click.echo(json.dumps({**made.summary, **({"sched": made.text} if out is None else {})}, indent=1))
    else:
        if out is None:
            click.echo(made.text, nl=False)
        click.echo(made.report, err=True)
    end(0 if made.ok else EXIT_CODES[SCHEDULE])


def run_search(options: dict[str, Any], as_json: bool) -> str:
    """`schedc tune` without --synthesize: search (a progress bar on stderr unless --json), then the
    table or the JSON list. SchedError when nothing fits (exit 1) or on bad input (exit 2)."""
    from ..search import Searcher, candidates, distinct_figures
    from ..text import GIB
    from .tune_report import (
        assumption_notes, matching, no_layout, nothing_fits, parse_why, pruned_lines, pruned_report, report,
        request_from, stop_notes, why_lines)
    request = request_from(options)
    shown = pruned_lines(options["pruned"])
    searcher = Searcher(request)
    wanted = parse_why(options["why"]) if options["why"] is not None else None
    if searcher.limit > searcher.cluster.memory_bytes:
        asked, has = distinct_figures(searcher.limit / GIB, searcher.cluster.memory_bytes / GIB)
        raise usage(f"--memory-limit {asked} GiB is more than the {has} "
                    f"GiB of the cluster's GPUs: a configuration beyond them would not run (simulate and compile "
                    f"check the GPU's memory); describe a larger GPU in a cluster file instead")
    space = candidates(searcher.model, list(searcher.entries.values()), request)
    chosen = matching(space, wanted) if wanted is not None else []
    if wanted is not None and not chosen:
        raise usage(f"--why {options['why']!r}: no candidate of this search is that ({searcher.describe_space(space)})")
    refuse_fills(space, [e.name for e in searcher.entries.values() if e.filled])
    refuse_whole(space, [e.name for e in searcher.entries.values() if e.plain and not e.filled])
    whole = [e.name for e in searcher.entries.values() if e.plain]
    if whole and not as_json:
        n = sum(c.schedule in whole for c in space)
        click.echo(f"schedc tune: note: {', '.join(whole)} {'is' if len(whole) == 1 else 'are'} compiled whole for "
                   f"each of up to {plural(n, 'candidate')} " + ("(--post-validation: two steps are timed back to back"
                   if request.layout.post_validation else "(tasks, a fill, a greedy order or placed R, O, L ops")
                   + ": no cache, no bound), seconds each where a fill is searched", err=True)
    sharded = sum(c.zero >= 2 and not searcher.entries[c.schedule].plain and searcher.compiled_whole(c) for c in space)
    if sharded and request.zero is None and not as_json:  # --zero 2 or 3 given: every candidate
        click.echo(f"schedc tune: note: --zero {request.layout.zero}: each of up to {plural(sharded, 'candidate')} is "
                   "compiled whole (its collectives are timed on each device's lane), those whose bound (the "
                   "busiest lane, the compute, the memory) already loses or does not fit are not", err=True)
    if not as_json and not sys.stderr.isatty():
        click.echo(f"schedc tune: searching {plural(len(space), 'candidate')} ...", err=True)
    if as_json or not sys.stderr.isatty():
        outcome = searcher.run(space)
    else:
        with _progress(len(space), "tune") as bar:
            searcher.progress = bar.update
            outcome = searcher.run(space)
    if not outcome.ranked:
        raise no_layout(outcome) if outcome.counts["layers"] == outcome.counts["candidates"] else \
            nothing_fits(outcome, shown)
    why = why_lines(searcher, outcome, space, options["why"], chosen, bar=_progress if not as_json and sys.stderr.isatty() else None) \
        if chosen else []
    if as_json:  # the list on stdout; where the walk stopped, why families were pruned, as in the table, and --why on stderr
        for lines in ([f"note: {note}" for note in stop_notes(outcome)], pruned_report(outcome, shown), why):
            for n, line in enumerate(lines):
                click.echo(f"schedc tune: {line}" if n == 0 else line, err=True)
        return json.dumps([r.to_json() for r in outcome.ranked], indent=1)
    return "\n".join([report(outcome, shown, assumption_notes(searcher, outcome)), *why])



def _progress(length: int, label: str):
    """A progress bar on stderr (tune's walk and --why's ranking)."""
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)


def refuse_whole(space, whole: list[str]) -> None:
    """Candidates compiled whole (placed R, O, L ops, tasks, a greedy order) take time that grows with
    their count and their stages x microbatches: past TUNE_WHOLE or TUNE_WHOLE_UNITS the search is
    refused before it starts, naming the limit."""
    from ..budget import TUNE_WHOLE, TUNE_WHOLE_UNITS
    chosen = [c for c in space if c.schedule in whole]
    what = f"{', '.join(whole)}: the search would compile whole"
    refused = TUNE_WHOLE.refusal(len(chosen), what) or TUNE_WHOLE_UNITS.refusal(
        sum(c.p * (c.v or 1) * c.m for c in chosen), what)
    if refused:
        raise usage(refused)


def refuse_fills(space, filled: list[str]) -> None:
    """Candidates whose compile searches a fill (PipeFisher's) take about a second each: past
    TUNE_FILLS of them the search is refused before it starts, naming the limit."""
    from ..budget import TUNE_FILLS
    count = sum(c.schedule in filled for c in space)
    refused = TUNE_FILLS.refusal(count, f"{', '.join(filled)}: the search would compile and fill")
    if refused:
        raise usage(refused)
