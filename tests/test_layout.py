"""layout: one value, one set of options. The runtime's flags written for a Layout read back into the
same value; the rank order is a bijection with tensor innermost."""
from __future__ import annotations

import itertools

import pytest

from schedc.layout import SWITCHES, Layout, coordinates, flag, rank_at, run_flags, switches_on


@pytest.mark.parametrize("layout", [
    Layout(tp=2, dp=1, microbatch_size=4, recompute="selective", sequence_parallel=True),
    Layout(tp=1, dp=2, microbatch_size=2, recompute="none", distributed_optimizer=True, scatter_gather=False),
    Layout(tp=4, dp=3, microbatch_size=1, recompute="full")])
def test_the_runtime_reads_back_the_layout_its_flags_describe(layout):
    from schedc.runtime.process.options import parse_options
    assert parse_options(["plan.json", *run_flags(layout)]).layout == layout


def test_the_rank_order_is_tensor_innermost_and_invertible():
    t, d, p = 2, 3, 4
    ranks = [rank_at(pp, dd, tt, t, d) for pp, dd, tt in itertools.product(range(p), range(d), range(t))]
    assert ranks == list(range(t * d * p))  # pipeline outermost, tensor innermost: in order
    assert all(rank_at(*(lambda c: (c.pipeline, c.data, c.tensor))(coordinates(r, t, d)), t, d) == r for r in ranks)


def test_the_switches_are_named_once():
    assert [name for name, _, _ in SWITCHES] == ["sequence_parallel", "overlap_grad_reduce", "blocking_p2p",
                                                "distributed_optimizer", "tp_comm_overlap", "overlap_param_gather",
                                                "fp8", "post_validation", "eager", "fp8_current_scaling"]
    assert flag("sequence_parallel") == "--sequence-parallel"
    assert switches_on(Layout(sequence_parallel=True, blocking_p2p=True)) == ["sequence parallel", "blocking sends"]
    assert switches_on({"distributed_optimizer": True}) == ["distributed optimizer"]


# One table of layout options (LAYOUT_OPTIONS): the compiler's click options and the runtime's argparse
# options are both made from it.

def _click_options(verb: str) -> dict[str, object]:
    from schedc.cli import main
    return {opt: param for param in main.commands[verb].params for opt in (*param.opts, *param.secondary_opts)}


def _runtime_actions() -> dict[str, object]:
    from schedc.runtime.process.options import build_parser
    return {opt: action for action in build_parser()._actions for opt in action.option_strings}


def test_every_layout_field_is_one_option_of_the_table():
    from dataclasses import fields
    from schedc.layout import LAYOUT_OPTIONS
    assert sorted(o.field for o in LAYOUT_OPTIONS) == sorted(f.name for f in fields(Layout))
    assert len({o.flag for o in LAYOUT_OPTIONS}) == len(LAYOUT_OPTIONS)


def test_the_runtime_and_simulate_spell_type_and_choose_each_layout_option_alike():
    """`python -m schedc.runtime --help` and `schedc simulate --help` agree: each runtime option of the
    table under the same flag, with the same choices and help; the runtime's default is the table's."""
    import argparse
    from schedc.layout import LAYOUT_OPTIONS
    runtime, simulate = _runtime_actions(), _click_options("simulate")
    for option in LAYOUT_OPTIONS:
        assert option.flag in simulate, option.flag
        assert simulate[option.flag].help.startswith(option.help)
        if not option.runtime:
            assert option.flag not in runtime
            continue
        action = runtime[option.flag]
        assert action.dest == option.field and action.help.startswith(option.help)
        assert tuple(action.choices or ()) == option.choices == tuple(getattr(simulate[option.flag].type, "choices", ()))
        assert action.default == option.default("runtime")
    hidden = runtime["--mb-size"]
    assert hidden.dest == "microbatch_size" and hidden.help == argparse.SUPPRESS


def test_the_runtime_takes_the_old_spelling_of_the_microbatch_size_unshown():
    from schedc.runtime.process.options import build_parser, parse_options
    assert parse_options(["plan.json", "--mb-size", "3"]).layout.microbatch_size == 3
    assert parse_options(["plan.json", "--microbatch-size", "3"]).layout == Layout(microbatch_size=3, recompute="none")
    text = build_parser().format_help()
    assert "--microbatch-size" in text and "--mb-size" not in text


def test_recompute_has_one_choice_list_and_each_verbs_default_in_its_help():
    from schedc.layout import OPTION, RECOMPUTE, RECOMPUTE_FORMS, SELECTIVE_OPS
    from schedc.runtime.execution.recompute import MODES
    assert set(MODES) == set(RECOMPUTE) and OPTION["recompute"].choices == RECOMPUTE_FORMS
    assert RECOMPUTE_FORMS == RECOMPUTE + (SELECTIVE_OPS,)  # the runtime refuses the last by name
    assert _click_options("simulate")["--recompute"].help.endswith("default full).")
    assert _click_options("calibrate")["--recompute"].help.endswith("default none).")
    assert _runtime_actions()["--recompute"].help.endswith("(default none)")
    assert _click_options("tune")["--recompute"].metavar == ",".join(RECOMPUTE_FORMS)


@pytest.mark.parametrize("verb", ["compile", "simulate", "render", "tune", "calibrate", "check"])
def test_each_verb_takes_the_layout_options_from_the_table(verb):
    """Each layout flag a verb has carries the table's help (searched ones tune's own): no second
    declaration with its own wording."""
    from schedc.layout import LAYOUT_OPTIONS
    options = _click_options(verb)
    taken = [o for o in LAYOUT_OPTIONS if o.flag in options]
    assert taken
    for option in taken:
        want = f"{option.searched}." if verb == "tune" and option.searched else option.help
        assert options[option.flag].help.startswith(want), (verb, option.flag)


def test_the_layer_split_and_its_flags_are_the_layouts():
    """The cost model's and the elaboration's splits are split_layers' (earlier stages taking the
    remainder), and a --stage-layers the runtime refuses is the compiler's refusal too."""
    from schedc.costmodel.hardware import stage_layers
    from schedc.costmodel.specs import ModelSpec
    from schedc.layout import split_layers
    from schedc.runtime.process.options import OptionError, parse_options
    model = ModelSpec.__new__(ModelSpec)
    object.__setattr__(model, "layers", 10)
    assert stage_layers(model, 4) == split_layers(10, 4) == (3, 3, 2, 2)
    assert stage_layers(model, 4, Layout(account_for_loss=True)) == split_layers(10, 4, loss=True)
    with pytest.raises(OptionError, match="give one layer count per stage"):
        parse_options(["plan.json", "--stage-layers", "2,x"])


def test_the_options_read_back_into_a_layout_with_each_verbs_defaults():
    import click
    from schedc.cli.options import layout_from
    assert layout_from({}) == Layout()  # --cluster: Layout's own defaults (recompute full)
    assert layout_from({}, "calibrate") == Layout(recompute="none")
    assert layout_from({"tp": 2, "stage_layers": "1, 2", "scatter_gather": False, "sequence_parallel": None}) == \
        Layout(tp=2, stage_layers=(1, 2), scatter_gather=False)
    with pytest.raises(click.UsageError, match="give one layer count per stage"):
        layout_from({"stage_layers": "1,x"})
