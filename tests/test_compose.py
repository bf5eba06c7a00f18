"""frontend/compose.py: `extends`, `use` and `--with`: one declaration list from several files, add-on
params namespaced, errors located in the right file; PipeFisher's K-FAC add-on on every library
schedule."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, SCHEDULES
from schedc.cli import main
from schedc.driver import compile_file, compile_source
from schedc.diagnostics import SchedError
from schedc.frontend.elaborate import Options
from schedc.frontend.parse import read_source

COMPOSE = FIXTURES / "compose"
BERT_LARGE = Path(__file__).resolve().parent / "data" / "bert-large_time_memory_v100.csv"


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def stats(*args: str) -> dict:
    result = run("simulate", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def flat_pipefisher() -> str:
    """pipefisher.sched written out without composition: chimera.sched with p = 8 by default, then
    the add-on's declarations (the `addon` header dropped, its params under their own names)."""
    chimera = (SCHEDULES / "chimera.sched").read_text().replace('param p = 4 "pipeline devices (even)"',
                                                                'param p = 8 "pipeline devices (even)"')
    kfac = (SCHEDULES / "addons" / "kfac.sched").read_text()
    body = "\n".join(line for line in kfac.splitlines() if not line.startswith("addon "))
    return chimera.replace("schedule chimera", "schedule pipefisher", 1) + "\n" + body + "\n"


def test_pipefisher_is_chimera_with_the_kfac_addon(tmp_path):
    """The few-line pipefisher.sched compiles to what its written-out text does: same orders, tasks,
    cycle and stats (the add-on's params differ only in name: kfac.kron vs kron)."""
    flat = tmp_path / "flat.sched"
    flat.write_text(flat_pipefisher())
    options = Options({"m": "8"})
    composed = compile_source(read_source(SCHEDULES / "pipefisher.sched"), options)
    written = compile_source(read_source(flat), options)
    assert composed.ok and written.ok
    assert composed.schedule.params == {"p": 8, "m": 8, "kfac.save_err": 0.41, "kfac.kron": 0.48}
    assert [[str(op) for op in order] for step in composed.schedule.steps for order in step] == \
        [[str(op) for op in order] for step in written.schedule.steps for order in step]
    assert composed.stats == written.stats


@pytest.mark.parametrize("base,params", [("1f1b", ["-D", "p=4"]), ("gpipe", []),
                                         pytest.param("chimera", [], marks=pytest.mark.slow),
                                         pytest.param("interleaved_1f1b", ["-D", "p=4", "-D", "v=2"],
                                                      marks=pytest.mark.slow),
                                         ("zb_h1", ["-D", "p=4", "-D", "m=8"]),
                                         pytest.param("dualpipev", ["-D", "p=4", "-D", "m=8"], marks=pytest.mark.slow)])
def test_kfac_addon_applies_to_any_base(base, params, tmp_path):
    """`--with kfac` on each library schedule: checks pass, the K-FAC tasks are all placed, and with
    BERT-Large's V100 profile at micro-batch 32 the bubbles fill to >= 0.90. A profile row has no I or
    W (a split schedule refuses it): the split bases get the row as a costs file with I = W = B / 2."""
    row = ["--profile", str(BERT_LARGE), "--microbatch-size", "32"]
    profile, costs = (str(BERT_LARGE), 32), None
    if base in ("zb_h1", "dualpipev"):
        from schedc.interop.profiles import read_profile, read_profile_memory
        measured = read_profile(str(BERT_LARGE), 32)
        measured.update(I=measured["B"] / 2, W=measured["B"] / 2, memory=read_profile_memory(str(BERT_LARGE), 32))
        measured = {k: v for k, v in measured.items() if k != "B" or base == "dualpipev"}
        (tmp_path / "costs.json").write_text(json.dumps(measured))
        row, profile, costs = ["--costs", str(tmp_path / "costs.json")], None, str(tmp_path / "costs.json")
    checked = run("check", base, *params, *row, "--with", "kfac")
    assert checked.exit_code == 0, checked.output
    filled = stats(base, *params, *row, "--with", "kfac")
    assert filled["utilization"] >= 0.90 > filled["utilization_unfilled"]
    result = compile_file(base, params[1::2], costs, profile=profile, addons=("kfac",))
    placed = {op.kind for step in result.schedule.steps for order in step for op in order if op.is_task}
    assert placed == {"curvature_A", "curvature_B", "inversion", "precondition"}


def test_kfac_addon_from_a_file_in_one_line(tmp_path):
    """`use kfac` in a .sched file next to its base (found there before the library)."""
    (tmp_path / "base.sched").write_text((SCHEDULES / "interleaved_1f1b.sched").read_text())
    (tmp_path / "mine.sched").write_text('schedule mine "interleaved with K-FAC"\nextends base\nuse kfac\n')
    assert stats(str(tmp_path / "mine.sched")) == stats("interleaved_1f1b", "--with", "kfac")


def test_addon_params_are_namespaced():
    """knob's params k and m live as knob.k and knob.m: Chimera's loop variable k and its param m are
    untouched, `-D knob.k=5` sets the add-on's, and a bare `-D k=5` is no param at all."""
    path = str(COMPOSE / "chimera_knob.sched")
    result = compile_file(path, ["knob.k=5"])
    assert result.ok and result.schedule.params == {"p": 4, "m": 8, "knob.k": 5, "knob.m": 0.5}
    assert {op.cost for op in result.schedule.unplaced} == {2.5}  # shared by Chimera's two replicas
    assert result.schedule.microbatches == 8
    refused = run("simulate", path, "-D", "k=5")
    assert refused.exit_code == 2 and "unknown param 'k'" in refused.output and "knob.k" in refused.output


def test_a_declaration_of_the_extending_file_replaces_the_base_one():
    result = compile_file(str(COMPOSE / "override.sched"))
    assert result.ok and result.schedule.devices == 6 and result.schedule.memory_limit == (6.0,) * 6


@pytest.mark.parametrize("name,where,message", [
    ("unknown_base.sched", "unknown_base.sched:2:1", "unknown schedule 'nosuch' (the library's: 1f1b, chimera"),
    ("unknown_addon.sched", "unknown_addon.sched:3:1", "unknown add-on 'nosuch' (the library's: kfac)"),
    ("cycle_a.sched", "cycle_b.sched:2:1", "a cycle of `extends`: cycle_a -> cycle_b -> cycle_a"),
    ("clash.sched", "kfac.sched:35:1", "name clash: add-on 'kfac' declares task 'curvature_A', already "
                                        "declared at clash.sched:3"),
    ("extends_addon.sched", "extends_addon.sched:2:1", "'kfac' is an add-on: `use kfac`, not `extends`"),
    ("use_schedule.sched", "use_schedule.sched:3:1", "'chimera' is a schedule, not an add-on"),
    ("uses_shaped.sched", "shaped.sched:2:1", "an add-on cannot declare a pipeline"),  # was "microbatch 0 of
    # pipeline 'x' is already owned by pipeline 'main'", or an error located in the library's 1f1b.sched
    ("self_extends.sched", "self_extends.sched:2:1", "a cycle of `extends`: self_extends -> self_extends"),
    ("uses_twice.sched", "uses_twice.sched:4:1", "add-on 'kfac' is applied twice: `use kfac` at uses_twice.sched:4 "
                                                 "after `use kfac` at uses_twice.sched:3"),
])
def test_composition_errors_are_located(name, where, message):
    """Each error points at the line that names the file (or, for a clash, at the add-on's own
    declaration, in the add-on's file) and exits 1."""
    result = run("check", str(COMPOSE / name))
    assert result.exit_code == 1, result.output
    first = result.output.splitlines()[0]
    assert where in first and message in first, result.output
    assert "Traceback" not in result.output


def test_with_an_unknown_addon_and_an_addon_alone_are_usage_errors():
    unknown = run("simulate", "1f1b", "--with", "nosuch")
    assert unknown.exit_code == 2 and "unknown add-on 'nosuch'" in unknown.output
    alone = run("simulate", str(SCHEDULES / "addons" / "kfac.sched"))
    assert alone.exit_code == 2 and "kfac.sched:17:1: error: 'kfac' is an add-on, not a schedule" in alone.output


def test_an_error_inside_a_base_is_reported_in_the_base_file(tmp_path):
    (tmp_path / "base.sched").write_text('schedule base "x"\nparam p = 2\nparam m = 2\n'
                                         'pipeline main { stages p; device s -> s; microbatches m }\n'
                                         'on device d { F * m ; B * (m + 1) }\n')
    (tmp_path / "top.sched").write_text('schedule top "y"\nextends base\n')
    with pytest.raises(SchedError) as info:
        compile_file(str(tmp_path / "top.sched"))
    assert f"{tmp_path / 'base.sched'}:5:" in info.value.render()


KFAC_TASKS = {"curvature_A", "curvature_B", "inversion", "precondition"}
SMALL_MODEL = "layers = 8\nhidden = 1024\nheads = 16\nseq = 512\nvocab = 8192\n"


def placed_kinds(schedule) -> set[str]:
    return {op.kind for step in schedule.steps for order in step for op in order}


@pytest.mark.parametrize("file,defines,addons,tasks", [
    ("1f1b", ["p=2"], ("kfac",), KFAC_TASKS),
    (str(COMPOSE / "uses_kfac.sched"), [], (), KFAC_TASKS),
    ("pipefisher_1f1b", ["p=2"], (), KFAC_TASKS),
    ("pipefisher", ["p=2", "m=4"], (), KFAC_TASKS),
    (str(COMPOSE / "chain" / "sub" / "top.sched"), ["p=2"], (), set()),
])
def test_a_composed_schedule_is_the_same_schedule_with_cluster_costs(tmp_path, file, defines, addons, tasks):
    """`use`, `--with` and `extends` are resolved on the --cluster path as compile_file resolves them:
    the same params (the base's and the add-on's, namespaced), the same tasks placed, the same
    microbatches; only the costs are the model's on the cluster."""
    from schedc.layout import Layout
    from schedc.driver import parse_defines
    from schedc.driver.cluster import compile_on_cluster
    from schedc.layout import ClusterRequest
    model = tmp_path / "small.toml"
    model.write_text(SMALL_MODEL)
    plain = compile_file(file, defines, addons=addons)
    on = compile_on_cluster(file, parse_defines(defines), ClusterRequest(str(model), "dgx-a100-80gb", Layout()),
                            lower=False, addons=addons)
    assert plain.ok and on.compiled.ok, on.compiled.diagnostics
    assert on.compiled.schedule.params == plain.schedule.params
    assert on.compiled.schedule.microbatches == plain.schedule.microbatches
    assert placed_kinds(on.compiled.schedule) == placed_kinds(plain.schedule) == {"F", "B"} | tasks


def test_cluster_command_lines_take_use_with_and_extends(tmp_path):
    """simulate --cluster of `--with kfac` reports the fill (a cycle of K steps) that plain 1F1B has
    not, `use kfac` in a file fills as `--with kfac` does, and the extends chain takes its base's p
    from -D (before: `unknown param 'p'`)."""
    model = tmp_path / "small.toml"
    model.write_text(SMALL_MODEL)
    cluster = ["--model", str(model), "--cluster", "dgx-a100-80gb"]
    bare, kfac = stats("1f1b", "-D", "p=2", *cluster), stats("1f1b", "-D", "p=2", "--with", "kfac", *cluster)
    assert bare["cycle_steps"] == 1 and "utilization_unfilled" not in bare
    assert "utilization_unfilled" in kfac and kfac["iteration_s"] > bare["iteration_s"]
    assert stats(str(COMPOSE / "uses_kfac.sched"), *cluster)["utilization_unfilled"] == \
        pytest.approx(stats("1f1b", "-D", "p=2", "-D", "m=4", "--with", "kfac", *cluster)["utilization_unfilled"])
    chain = stats(str(COMPOSE / "chain" / "sub" / "top.sched"), "-D", "p=2", *cluster)
    assert chain["ops"] == 2 * 6 * 2  # p = 2 stages, mid.sched's m = 6, F and B


def test_the_same_addon_twice_from_the_command_line_is_one_usage_error():
    """`--with kfac --with kfac` and `pipefisher --with kfac` (which says `use kfac` already) are one
    error naming both applications, exit 2, not a name clash per task pointing at itself."""
    twice = run("simulate", "1f1b", "--with", "kfac", "--with", "kfac")
    assert twice.exit_code == 2, twice.output
    assert twice.output.count("error:") == 1 and "name clash" not in twice.output
    assert "--with: error: add-on 'kfac' is applied twice: --with kfac after --with kfac" in twice.output
    again = run("simulate", "pipefisher", "--with", "kfac")
    assert again.exit_code == 2 and again.output.count("error:") == 1, again.output
    assert "add-on 'kfac' is applied twice: --with kfac after `use kfac` at pipefisher.sched:6" in again.output


def test_an_addon_named_as_the_schedule_says_it_needs_a_base():
    result = run("check", "kfac")
    assert result.exit_code == 2, result.output
    assert "kfac.sched:17:1: error: 'kfac' is an add-on, not a schedule: `use kfac` in one, or " \
           "`schedc compile BASE --with kfac`" in result.output
    assert "cannot read file" not in result.output


def test_a_negative_addon_memory_param_names_the_memory():
    result = run("simulate", "1f1b", "--with", "kfac", "-D", "kfac.kron=-1")
    assert result.exit_code == 1, result.output
    assert "kfac.sched:27:1: error: memory of curvature_A must be a finite number >= 0 and at most 1e+15, got -0.5" in (
        result.output)
    assert "kfac.kron=-1" in result.output and "cost of" not in result.output


def test_a_note_about_an_addon_task_is_located_in_the_addon():
    """limit_kfac.sched (3 lines) extends pipefisher_1f1b and exceeds its limit: the notes naming the
    tasks that keep outputs alive point at kfac.sched's lines 35 and 36, not at the 3-line file."""
    result = run("check", str(COMPOSE / "limit_kfac.sched"))
    assert result.exit_code == 1, result.output
    assert "note: the limit is declared at limit_kfac.sched:3" in result.output
    assert "note: task 'curvature_A' keeps outputs alive: declared at kfac.sched:35" in result.output
    assert "note: task 'curvature_B' keeps outputs alive: declared at kfac.sched:36" in result.output
    assert "limit_kfac.sched:35" not in result.output


def test_a_base_requirement_failed_by_a_derived_param_names_where_it_was_set(tmp_path):
    """`extends chimera` with `param p = 3`: the failed require is the base's, and a note names the
    derived file's line that set p (the hypothesis fuzz found the derived file unnamed)."""
    derived = tmp_path / "odd.sched"
    derived.write_text('schedule odd "Chimera at an odd p"\nextends chimera\nparam p = 3\n')
    result = CliRunner().invoke(main, ["check", str(derived)])
    assert result.exit_code == 1 and "requirement failed: p must be even" in result.output
    assert f"note: p is set at {derived}:3:1" in result.output
    given = CliRunner().invoke(main, ["check", "chimera", "-D", "p=3"])
    assert "note: p was given with -D p=3" in given.output
