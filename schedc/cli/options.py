"""The options more than one command takes, each declared once: -D, the measured costs, --latency, --with,
--cluster and its layout (the layout's switches in one table, LAYOUT_SWITCHES, for simulate/compile/render and tune
alike), and tune's search."""
from __future__ import annotations


import click

import functools
from typing import Any

from ..diagnostics import SchedError
from ..layout import RECOMPUTE, SHARDING_NAMES, SPLIT_NAMES, SWITCH_NAMES, SWITCHES, ZERO_LEVELS, sharding_fields as layout_sharding, ClusterRequest, Layout, SplitError, flag, parse_stage_layers
from ..search import GROUPS
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
    click.option("--microbatch-size", type=int, default=None,
                 help="The row of the --profile CSV to use; with --cluster (or check --model), the microbatch "
                      "size b."),
)


def costs_option(command):
    """--costs FILE.json, or --profile FILE.csv --microbatch-size B; the command gets `costs`,
    `profile` and `microbatch_size`, which profile_choice checks and folds together."""
    for option in reversed(_COST_OPTIONS):
        command = option(command)
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


def split_options(where: str) -> tuple:
    """The layer split's options (schedc.layout.SPLIT_NAMES), for --cluster and for tune."""
    return (
        click.option("--stage-layers", "stage_layers", default=None, metavar="N,N,...",
                     help=f"Transformer layers of each stage ({where}; default: an even split)."),
        click.option("--account-for-embedding", "account_for_embedding", is_flag=True, default=False,
                     help=f"Count the embedding as a layer of the first stage in the even split ({where})."),
        click.option("--account-for-loss", "account_for_loss", is_flag=True, default=False,
                     help=f"Count the output layer and loss as a layer of the last stage in the even split "
                          f"({where})."),
    )


def sharding_options(where: str) -> tuple:
    """The ZeRO level, level 3's resharding and context parallelism (schedc.layout's zero,
    reshard_after_forward and cp), for --cluster and for tune."""
    return (
        click.option("--zero", type=click.Choice([str(n) for n in ZERO_LEVELS]), default=None,
                     help=f"ZeRO level over data parallelism ({where}): 1 the optimizer state (the distributed "
                          "optimizer), 2 + gradients, 3 + parameters gathered for each stage's compute."),
        click.option("--reshard-after-forward/--no-reshard-after-forward", "reshard_after_forward", default=None,
                     help=f"With --zero 3 ({where}): free a stage's gathered parameters after each forward "
                          "(FSDP2's default) or keep them until its last backward."),
        click.option("--cp", type=int, default=None,
                     help=f"Context-parallel size: the sequence over cp GPUs in 2·cp chunks ({where}; default 1)."),
    )


def sharding_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The Layout fields of --zero, --reshard-after-forward and --cp (schedc.layout.sharding_fields); a
    usage error (exit 2) for resharding without --zero 3."""
    fields = layout_sharding(values["zero"], values["reshard_after_forward"], values["cp"])
    if isinstance(fields, str):
        raise click.UsageError(fields)
    return fields


# --cluster and its layout (simulate, compile, render, check) ----------------------------------------

_CLUSTER_OPTIONS = (
    click.option("--cluster", "cluster_name", default=None, metavar="NAME|FILE",
                 help="Predict on a cluster: a library name (dgx-a100-80gb, dgx-h100-80gb) or a TOML file; "
                      "needs --model, takes --microbatch-size as the microbatch size b."),
    click.option("--tp", type=int, default=None, help="Tensor-parallel size t (with --cluster; default 1)."),
    click.option("--dp", type=int, default=None, help="Data-parallel size d (with --cluster; default 1)."),
    click.option("--global-batch", type=int, default=None,
                 help="Global batch B in sequences (with --cluster): m = B / (b d) unless -D m= is given."),
    click.option("--recompute", type=click.Choice(RECOMPUTE), default=None,
                 help="Activation recomputation (with --cluster; default full, as in Megatron-LM's Table 1)."),
    *(click.option(flag(name), is_flag=True, default=False, help=f"{text}, with --cluster.")
      for name, _, text in SWITCHES),
    *split_options("with --cluster"),
    *sharding_options("with --cluster"),
)
_MODEL_OPTION = click.option("--model", "model_file", type=click.Path(dir_okay=False), default=None,
                             help="Model description (a TOML file: layers, hidden, heads, seq, vocab; or a "
                                  "library name such as gpt-175b), with --cluster; the same --model check, tune "
                                  "and the runtime read (model code is the runtime's --model-code).")
_CLUSTER_NAMES = ("cluster_name", "tp", "dp", "global_batch", "recompute", *SWITCH_NAMES, *SPLIT_NAMES, *SHARDING_NAMES)


def cluster_options(command):
    """Add the cluster options (and --model) to a command; it gets `model_file` and `cluster`: a
    ClusterRequest or None. The command's own `microbatch_size` (the --profile row option) is the
    microbatch size b with --cluster, and is passed on as None then."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        values = {name: kwargs.pop(name) for name in _CLUSTER_NAMES}
        kwargs["cluster"] = request_from(values, kwargs.get("model_file"), kwargs.get("microbatch_size"),
                                         kwargs.get("costs"), kwargs.get("profile"), option_given("latency"))
        if kwargs["cluster"] is not None:
            kwargs["microbatch_size"] = None
        return command(*args, **kwargs)

    for option in reversed((*_CLUSTER_OPTIONS, _MODEL_OPTION)):
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
        given = [flag(n) for n in _CLUSTER_NAMES[1:] if values[n] not in (None, False)]
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
    def given(value: int | None) -> int:  # 0 is refused by Layout as a negative is, never taken as 1
        return 1 if value is None else value

    layout = Layout(tp=given(values["tp"]), dp=given(values["dp"]), microbatch_size=given(microbatch_size),
                    global_batch=values["global_batch"], recompute=values["recompute"] or "full",
                    stage_layers=stage_layers(values["stage_layers"]),
                    account_for_embedding=values["account_for_embedding"], account_for_loss=values["account_for_loss"],
                    **{**{name: values[name] for name in SWITCH_NAMES}, **sharding_fields(values)})
    return ClusterRequest(model_file, values["cluster_name"], layout)


def stage_layers(text: str | None) -> tuple[int, ...] | None:
    """--stage-layers 2,3,3,2 -> (2, 3, 3, 2); a usage error (exit 2) for anything but counts."""
    if text is None:
        return None
    try:
        return parse_stage_layers(text)
    except SplitError as exc:
        raise click.UsageError(str(exc)) from None




# tune's configuration search ------------------------------------------------------------

_TUNE_OPTIONS = (
    click.option("--model", "model", type=click.Path(dir_okay=False),
                 help="Model description: a TOML file (layers, hidden, heads, seq, vocab) or a library "
                      "name such as gpt-175b."),
    click.option("--cluster", "cluster", metavar="NAME|FILE",
                 help="A library cluster (dgx-a100-80gb, dgx-h100-80gb) or a TOML file."),
    click.option("--gpus", type=click.IntRange(min=1), help="GPUs N = t x p x d."),
    click.option("--global-batch", type=click.IntRange(min=1), help="Sequences per step B."),
    click.option("--memory-limit", "memory_limit", default=None,
                 help="Memory per GPU, e.g. 80GiB (default: the cluster's GPU memory)."),
    click.option("--schedules", default=None, metavar="A,B,...",
                 help="Schedules to search (library names or files; default: every library schedule the "
                      "search can set: params p, m and optionally v, no tasks)."),
    click.option("--recompute", "recompute", default=None, metavar="full,selective,none",
                 help="Recomputation choices to search (default all three)."),
    click.option("--tp", "tp", default=None, metavar="T,...", help="Only these tensor-parallel sizes."),
    click.option("--pp", "pp", default=None, metavar="P,...", help="Only these pipeline sizes."),
    click.option("--microbatch-size", "microbatch", default=None, metavar="B,...",
                 help="Only these microbatch sizes (sequences)."),
    click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Rows to rank."),
    click.option("--per", type=click.Choice(GROUPS), default=None,
                 help="Rank the --top best of each schedule (or t, p, v, b, recompute) instead."),
    click.option("--exhaustive", is_flag=True,
                 help="Simulate every candidate that fits (no bound, no cache): the reference."),
    *(click.option(flag(name), is_flag=True, help=f"{text}, for every candidate.") for name, _, text in SWITCHES),
    *split_options("every candidate; --stage-layers keeps those with as many stages"),
    *sharding_options("every candidate; --gpus is then t x cp x p x d"),
    click.option("--pruned", "pruned", default="12", show_default=True, metavar="N|all",
                 help="Pruned families to list, with why (all: every one)."),
    click.option("--why", "why", default=None, metavar="'[SCHEDULE] t=T p=P [v=V b=B recompute=R]'",
                 help="Where this configuration (at its best over what is not given) ranks, exactly, and "
                      "part by part why it loses to the winner."),
)


_TUNE_NAMES = ("model", "cluster", "gpus", "global_batch", "memory_limit", "schedules", "recompute", "tp", "pp", "microbatch", "top",
          "per", "exhaustive", *SWITCH_NAMES, *SPLIT_NAMES, *SHARDING_NAMES, "pruned", "why")


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


def schedule_options(command):
    """What compile and simulate take to compile FILE: -D, the measured costs, --latency, --cluster and its
    layout, --with (in this order in --help)."""
    for option in reversed((define_option, costs_option, latency_option, cluster_options, with_option)):
        command = option(command)
    return command
