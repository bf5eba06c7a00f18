"""The options more than one command takes, each declared once: -D, the measured costs, --latency, --with,
--cluster and its layout, and tune's search. Every layout option is an entry of schedc.layout.LAYOUT_OPTIONS
(the runtime's argparse options come from the same table), made a click option here (layout_option; tune's
searched ones by searched_option) and read back into a Layout by layout_from."""
from __future__ import annotations


import click

import functools
from dataclasses import replace
from typing import Any

from ..budget import COMPILE_OPS, TUNE_WALK
from ..diagnostics import SchedError
from ..layout import LAYOUT_OPTIONS, OPTION, ClusterRequest, Layout, SplitError, flag, reshard_problem
from ..search import GROUPS
from ..search.space import SET_PER_CANDIDATE
from ..text import agree




CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def check_defines(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """-D values must read NAME=VALUE (compiler.parse_defines); a bad one is click's usage error."""
    from ..driver import parse_defines
    try:
        parse_defines(values)
    except SchedError as exc:
        raise click.BadParameter(exc.diagnostics[0].message, param_hint="-D") from None
    return values


define_option = click.option("-D", "defines", multiple=True, metavar="NAME=VALUE", callback=check_defines,
                             help="Override a param of the schedule (repeatable).")


_COST_OPTIONS = (
    click.option("--costs", type=click.Path(dir_okay=False), default=None,
                 help="Measured costs: JSON from `schedc run --profile-out` (or written by hand)."),
    click.option("--profile", type=click.Path(dir_okay=False), default=None,
                 help="Measured costs from a PipeFisher profile CSV (bs,time_f,time_b,...); with --microbatch-size."),
    None,  # --microbatch-size: the microbatch size b, or the row of the --profile CSV to use (_cost_options)
)


def costs_option(command):
    """--costs FILE.json, or --profile FILE.csv --microbatch-size B; the command gets `costs`,
    `profile` and `microbatch_size`, which profile_choice checks and folds together."""
    size = layout_option("microbatch_size", "with --cluster (or check --model); without, the row of the --profile "
                         "CSV to use")
    for option in reversed(_COST_OPTIONS):
        command = (option or size)(command)
    return command


def profile_choice(costs: str | None, profile: str | None,
                    microbatch_size: int | None) -> tuple[str, int | None] | None:
    """The profile row to read, or None; refuses --costs with --profile, and --microbatch-size alone."""
    if costs and profile:
        raise click.UsageError("give measured costs as --costs or as --profile, not both")
    if microbatch_size is not None and not profile:
        raise click.UsageError("--microbatch-size picks a row of a --profile CSV; give --profile too")
    return (profile, microbatch_size) if profile else None


with_option = click.option("--with", "addons", multiple=True, metavar="ADDON",
                           help="Apply an add-on (schedc/schedules/addons/ or next to FILE), as `use ADDON` would.")


def check_latency(ctx, param, value: float) -> float:
    """--latency: a finite number of cost units >= 0 (NaN, inf and negative latencies were taken, and a
    correct plan then blamed or an infinite makespan printed)."""
    from ..ops import cost_range, in_cost_range
    if not in_cost_range(value):
        raise click.BadParameter(f"must be {cost_range()}, got {value}")
    return value


latency_option = click.option("--latency", type=float, default=0.0, show_default=True, callback=check_latency,
                              help="Simulated latency of every message between devices (>= 0).")


def layout_option(field: str, where: str, verb: str = "cluster", **click_kw):
    """One option of schedc.layout.LAYOUT_OPTIONS as a click option, named, typed and explained as the table
    says, `where` telling when it applies and the verb's default stated in --help. A value not given is
    None (a switch too), so that a command can tell a given option from a default (layout_from)."""
    option = OPTION[field]
    default = option.default(verb)
    if option.type is bool and option.both:  # --NAME/--no-NAME: None when neither is given
        return click.option(f"{flag(field)}/{'--no-' + field.replace('_', '-')}", field, default=None,
                            help=f"{option.help} ({where}).")
    if option.type is bool:
        return click.option(option.flag, field, flag_value=not default, default=None, help=f"{option.help} ({where}).")
    shown = "" if default is None else f"; default {default}"
    kind = click.Choice(option.choices) if option.choices else int if option.type is int else str
    return click.option(option.flag, field, **{"type": kind, "default": None, "metavar": option.metavar,
                                               "help": f"{option.help} ({where}{shown}).", **click_kw})


def searched_option(field: str, dest: str | None = None):
    """A layout option tune searches, as a comma-separated list of its values (tune's own help)."""
    option = OPTION[field]
    metavar = ",".join(option.choices) if option.choices else f"{option.metavar},..."
    return click.option(option.flag, dest or field, default=None, metavar=metavar, help=f"{option.searched}.")


def layout_from(values: dict[str, Any], verb: str = "cluster", **fixed) -> Layout:
    """The Layout the options give: each table option's value where given (a --stage-layers read by its
    parse, a bad one a usage error), else the verb's default; `fixed` as given."""
    given = {}
    for option in LAYOUT_OPTIONS:
        value = values.get(option.field)
        if option.field in fixed or value is None:
            continue
        try:
            given[option.field] = option.parse(value) if option.type is tuple else value
        except SplitError as exc:
            raise click.UsageError(str(exc)) from None
    defaults = {o.field: o.default(verb) for o in LAYOUT_OPTIONS  # a verb's own, where it has one
                if o.defaults and o.field not in fixed and o.default(verb) is not None}
    return Layout(**{**defaults, **given, **fixed})


# --cluster and its layout (simulate, compile, render, check) ----------------------------------------

_CLUSTER_OPTIONS = (
    click.option("--cluster", "cluster_name", default=None, metavar="NAME|FILE",
                 help="Predict on a cluster: a library name (dgx-a100-80gb, dgx-h100-80gb) or a TOML file; "
                      "needs --model, takes --microbatch-size as the microbatch size b."),
    # every layout option but the microbatch size (the cost options' --microbatch-size)
    *(layout_option(o.field, "with --cluster") for o in LAYOUT_OPTIONS if o.field != "microbatch_size"),
)
seq_option = click.option("--seq", "seq", type=click.IntRange(min=1), default=None, metavar="S",
                          help="Sequence length of the run, over the model description's (a Hugging Face "
                               "config.json has none: give it); with --model.")
_MODEL_OPTION = click.option("--model", "model_file", type=click.Path(dir_okay=False), default=None,
                             help="Model description (a TOML file: layers, hidden, heads, seq, vocab; a Hugging "
                                  "Face config.json; or a library name such as gpt-175b or llama3.1-70b), with --cluster; the same --model check, tune "
                                  "and the runtime read (model code is the runtime's --model-code).")
_CLUSTER_NAMES = ("cluster_name", *(o.field for o in LAYOUT_OPTIONS if o.field != "microbatch_size"))


def cluster_options(command):
    """Add the cluster options (and --model) to a command; it gets `model_file` and `cluster`: a
    ClusterRequest or None. The command's own `microbatch_size` (the --profile row option) is the
    microbatch size b with --cluster, and is passed on as None then."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        values = {name: kwargs.pop(name) for name in _CLUSTER_NAMES}
        seq = kwargs.pop("seq")
        kwargs["cluster"] = request_from(values, kwargs.get("model_file"), kwargs.get("microbatch_size"),
                                         kwargs.get("costs"), kwargs.get("profile"), option_given("latency"))
        if seq is not None and kwargs["cluster"] is None:
            raise click.UsageError("--seq needs --cluster and --model")
        if kwargs["cluster"] is not None:
            kwargs["cluster"] = replace(kwargs["cluster"], seq=seq)
            kwargs["microbatch_size"] = None
        return command(*args, **kwargs)

    for option in reversed((*_CLUSTER_OPTIONS, _MODEL_OPTION, seq_option)):
        wrapper = option(wrapper)
    return wrapper


def option_given(name: str) -> bool:
    """Whether the running command's option `name` was given by the user, not left at its default."""
    context = click.get_current_context(silent=True)
    return context is not None and name in context.params and \
        context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT


def request_from(values: dict[str, Any], model_file: str | None, microbatch_size: int | None,
                 costs: str | None, profile: str | None, latency: bool = False) -> ClusterRequest | None:
    """The request the options make, or None without --cluster; a usage error (exit 2) for layout
    options without --cluster, --cluster without --model, or with measured costs or a --latency
    (`latency`: whether one was given)."""
    if values["cluster_name"] is None:
        given = [OPTION[n].flag for n in _CLUSTER_NAMES[1:] if values[n] is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} {agree(len(given), 'needs', 'need')} --cluster")
        return None
    if model_file is None:
        raise click.UsageError("--cluster needs a model description: --model model.toml")
    if costs or profile:
        raise click.UsageError("--cluster derives the costs: give it without --costs or --profile")
    if latency:
        raise click.UsageError("--cluster derives each message's time from the cluster's links: give it "
                               "without --latency")
    problem = reshard_problem(values["reshard_after_forward"], values["zero"])
    if problem:
        raise click.UsageError(problem)
    layout = layout_from({**values, "microbatch_size": microbatch_size})
    return ClusterRequest(model_file, values["cluster_name"], layout)


# tune's configuration search ------------------------------------------------------------

# The layout options every candidate takes as given (a new one included): all but what the search sets.
TUNE_FIXED = tuple(o.field for o in LAYOUT_OPTIONS if o.field not in SET_PER_CANDIDATE)

_TUNE_OPTIONS = (
    click.option("--model", "model", type=click.Path(dir_okay=False),
                 help="Model description: a TOML file (layers, hidden, heads, seq, vocab), a Hugging Face "
                      "config.json or a library name such as gpt-175b or llama3.1-70b."),
    seq_option,
    click.option("--cluster", "cluster", metavar="NAME|FILE",
                 help="A library cluster (dgx-a100-80gb, dgx-h100-80gb) or a TOML file."),
    click.option("--gpus", type=click.IntRange(min=1), help="GPUs N = t x p x d."),
    layout_option("global_batch", "required", "tune", type=click.IntRange(min=1)),
    click.option("--memory-limit", "memory_limit", default=None,
                 help="Memory per GPU, e.g. 80GiB (default: the cluster's GPU memory)."),
    click.option("--schedules", default=None, metavar="A,B,...",
                 help="Schedules to search (library names or files; default: every library schedule the "
                      "search can set: params p, m and optionally v, no tasks)."),
    searched_option("recompute"),
    searched_option("tp"),
    click.option("--pp", "pp", default=None, metavar="P,...", help="Only these pipeline sizes."),
    searched_option("microbatch_size", "microbatch"),
    searched_option("ep"),
    click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Rows to rank."),
    click.option("--per", type=click.Choice(GROUPS), default=None,
                 help="Rank the --top best of each schedule (or t, p, v, b, recompute) instead."),
    click.option("--exhaustive", is_flag=True,
                 help="Simulate every candidate that fits (no bound, no cache): the reference."),
    click.option("--walk-ops", "walk_ops", type=click.IntRange(min=0), default=TUNE_WALK.limit, show_default=True,
                 metavar="N", help="The walk's budget: ops of the orders it builds (weighted) and simulates; "
                                   "past it the walk stops and says which rows are certain (0: no budget)."),
    # the layout options the search does not set: every candidate's, as given
    *(layout_option(field, "for every candidate" if field != "stage_layers" else
                    "every candidate; --stage-layers keeps those with as many stages", "tune")
      for field in TUNE_FIXED),
    click.option("--pruned", "pruned", default="12", show_default=True, metavar="N|all",
                 help="Pruned families to list, with why (all: every one)."),
    click.option("--why", "why", default=None, metavar="'[SCHEDULE] t=T p=P [v=V b=B recompute=R]'",
                 help="Where this configuration (at its best over what is not given) ranks, exactly, and "
                      "part by part why it loses to the winner."),
)


_TUNE_NAMES = ("model", "seq", "cluster", "gpus", "global_batch", "memory_limit", "schedules", "recompute", "tp", "pp", "microbatch", "ep",
               "top", "per", "exhaustive", "walk_ops", *TUNE_FIXED, "pruned", "why")


def tune_options(command):
    """Add the configuration search's options to a click command; it gets them as `options` (a dict
    for request_from, which cli.tune.run_search calls)."""
    import functools

    @functools.wraps(command)
    def wrapper(*args, **kw):
        kw["options"] = {name: kw.pop(name) for name in _TUNE_NAMES}
        return command(*args, **kw)

    for option in reversed(_TUNE_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


max_ops_option = click.option("--max-ops", "max_ops", type=click.IntRange(min=1), default=COMPILE_OPS.limit,
                              show_default=True, metavar="N",
                              help="The most ops the schedule may expand to (memory and time grow with them).")


def schedule_options(command):
    """What compile and simulate take to compile FILE: -D, the measured costs, --latency, --cluster and its
    layout, --with, --max-ops (in this order in --help)."""
    for option in reversed((define_option, costs_option, latency_option, cluster_options, with_option,
                            max_ops_option)):
        command = option(command)
    return command


# --reshard-after-forward on export: where the compute_comms CSV puts FSDP's UNSHARD/RESHARD (--zero 3's
# rule, schedc/runtime/model/zero.py); not given, torch's own prefetch window
reshard_option = click.option("--reshard-after-forward/--no-reshard-after-forward", "reshard_after_forward",
                              default=None,
                              help="With --format torch-comms: UNSHARD and RESHARD around each compute cell of a "
                                   "stage (FSDP2's reshard_after_forward, as --zero 3 runs it), or from a stage's "
                                   "first cell to the row's end (--no-...); default torch's prefetch window.")
