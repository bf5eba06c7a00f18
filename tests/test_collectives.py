"""Collectives in the plan: the declared instructions (ALL_TO_ALL, ALL_GATHER, REDUCE_SCATTER,
ALL_REDUCE), plan version 2, the fields a declaration must have, and what --ep declares. The check's
replay of them is in tests/test_check_channels.py."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from schedc.cli import main
from schedc.plan import Instr, PlanError, load_plan, plan_from_json
from schedc.plan.write import write_plan

HANG = FIXTURES / "collectives" / "a2a_hang.json"


def test_a_declared_collective_round_trips_in_text_and_json():
    instr = Instr("ALL_TO_ALL", 1, 3, 0, group=(0, 2))
    assert str(instr) == "ALL_TO_ALL stage=1 mb=3 pipe=0 group=0,2"
    assert Instr.parse(str(instr)) == instr == Instr.from_json(json.loads(instr.json_text()))
    assert instr.short() == "ALL_TO_ALL(1,3)"


def test_a_plan_that_declares_collectives_is_version_2_and_written_as_its_forms(tmp_path):
    plan = load_plan(HANG)
    assert json.loads(HANG.read_text())["version"] == 2 and plan.to_json()["version"] == 2
    written, _ = write_plan(plan, tmp_path)
    assert written.hash == plan.hash
    assert json.loads((tmp_path / "plan.json").read_text()) == plan.to_json()
    assert (tmp_path / "rank0.txt").read_text().splitlines()[3] == "ALL_TO_ALL stage=0 mb=0 pipe=0 group=0,1"


def test_a_plan_without_them_stays_version_1(tmp_path):
    from conftest import compile_library
    written, _ = write_plan(compile_library("1f1b", p=2, m=2).plan, tmp_path)
    assert json.loads((tmp_path / "plan.json").read_text())["version"] == 1


def _edited(change) -> dict:
    obj = json.loads(HANG.read_text())
    change(obj)
    return obj


def test_version_1_cannot_declare_collectives():
    obj = _edited(lambda o: o.update(version=1))
    with pytest.raises(PlanError, match="declares collectives .* need version 2"):
        plan_from_json(obj, verify=False)
    with pytest.raises(PlanError, match=r"expected one of 1, 2"):
        plan_from_json(_edited(lambda o: o.update(version=3)), verify=False)


@pytest.mark.parametrize("group,message", [([1], "holds rank 0"), ([0, 0, 1], "distinct ranks"),
                                           (None, "needs a stage and a group")])
def test_a_declaration_names_a_group_with_its_own_rank(group, message):
    def change(o):
        instr = o["ranks"][0]["steps"][0][1]
        assert instr["op"] == "ALL_TO_ALL"
        if group is None:
            del instr["group"]
        else:
            instr["group"] = group
    with pytest.raises(PlanError, match=r"steps\[0\]\[1\]\.group: ALL_TO_ALL needs a stage and a group") as caught:
        plan_from_json(_edited(change), verify=False)
    assert message.split()[-1] in str(caught.value)


def test_a_declaration_is_of_an_op_on_its_rank():
    def change(o):
        o["ranks"][0]["steps"][0][1]["stage"] = 1           # stage 1 is on rank 1
    with pytest.raises(PlanError, match=r"steps\[0\]\[1\]: ALL_TO_ALL .* runs stage 1 on rank 0"):
        plan_from_json(_edited(change), verify=False)


def test_check_reports_the_fixtures_hang_and_exits_1():
    result = CliRunner().invoke(main, ["check", str(HANG)])
    assert result.exit_code == 1, result.output
    assert "rank 0 blocks at ALL_TO_ALL(0,0) (instruction 1)" in result.output
    assert "rank 1 blocks at F(1,0) (instruction 1)" in result.output


# What --ep declares ------------------------------------------------------------------------------------

def _expert_setting(ep: int, first_k_dense: int):
    from schedc.costmodel import Setting
    from schedc.costmodel.specs import load_cluster
    from schedc.descriptions import ModelFacts
    from schedc.layout import Layout
    model = ModelFacts(8, 64, 4, 16, 256, 256, experts=4, top_k=2, moe_ffn=64, first_k_dense=first_k_dense)
    return Setting(model, load_cluster("dgx-h100-80gb"), Layout(dp=2, ep=ep, recompute="none"))


def test_expert_parallelism_declares_two_all_to_alls_per_exchanging_op_on_stages_with_experts():
    from schedc.costmodel.experts import expert_collectives
    issued = expert_collectives(_expert_setting(2, first_k_dense=4), 2)   # 8 layers: 4 dense on stage 0
    assert [(i.kind, i.collective) for i in issued] == [(k, "ALL_TO_ALL") for k in "FBIR" for _ in range(2)]
    assert {i.stages for i in issued} == {frozenset({1})}
    assert {i.stages for i in expert_collectives(_expert_setting(2, first_k_dense=1), 2)} == {frozenset({0, 1})}
    assert expert_collectives(_expert_setting(1, first_k_dense=1), 2) == ()


def test_compile_with_ep_declares_them_and_the_plan_passes(tmp_path):
    args = ["compile", "1f1b", "-D", "p=4", "-D", "m=8", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-80gb",
            "--tp", "2", "--distributed-optimizer"]
    with_ep = CliRunner().invoke(main, [*args, "--dp", "8", "--ep", "8", "-o", str(tmp_path / "ep")])
    assert with_ep.exit_code == 0, with_ep.output
    plan = load_plan(tmp_path / "ep" / "plan.json")
    rank1 = plan.ranks[1][0]
    at = rank1.index(Instr("F", 1, 0, 0))
    assert rank1[at + 1:at + 3] == (Instr("ALL_TO_ALL", 1, 0, 0, group=(1,)),) * 2
    assert sum(i.op == "ALL_TO_ALL" for r in plan.ranks for i in r[0]) == 2 * 2 * 4 * 8  # (F + B) x 4 stages x 8
    assert CliRunner().invoke(main, ["check", str(tmp_path / "ep" / "plan.json")]).exit_code == 0
    without = CliRunner().invoke(main, [*args, "--dp", "8", "-o", str(tmp_path / "dense")])
    assert without.exit_code == 0, without.output
    assert json.loads((tmp_path / "dense" / "plan.json").read_text())["version"] == 1


# What --zero 2/3 and --cp declare -----------------------------------------------------------------------

SHARDED_MODEL = 'layers = 8\nhidden = 64\nheads = 4\nseq = 256\nvocab = 100\nattention = "flash"\n'
LIBRARY = {"1f1b": [], "gpipe": [], "interleaved_1f1b": ["-D", "v=2"], "interleaved_1f1b_recompute": ["-D", "v=2", "--recompute", "none"],
           "interleaved_zb": ["-D", "v=2"], "looped_bfs": ["-D", "v=2"], "zb_h1": [], "zb_h2": [], "zb_2p": [],
           "zbv": [], "v_half": [], "v_min": [], "dualpipe": [], "dualpipev": [], "chimera": [],
           "combined_1f1b": [], "offload_1f1b": [], "seq1f1b": []}


def _sharded_compile(tmp_path, name: str, layout: list[str], out: str):
    model = tmp_path / "model.toml"
    model.write_text(SHARDED_MODEL)
    return CliRunner().invoke(main, ["compile", name, "-D", "p=4", *LIBRARY[name], "--model", str(model),
                                     "--cluster", "dgx-h100-80gb", "--dp", "2", *layout, "-o", str(tmp_path / out)])


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_every_library_schedule_declares_zero_3_and_cp_collectives_and_passes_the_check(tmp_path, name):
    """--zero 3 (resharding: every computing op gathers its stage, every op finishing a microbatch's
    weight gradients reduce-scatters them) with --cp 2 (F and R gather keys and values, B and I
    reduce-scatter their gradients): compiled, the plan declares them and its channel check passes."""
    result = _sharded_compile(tmp_path, name, ["--zero", "3", "--cp", "2"], "plan")
    assert result.exit_code == 0, result.output
    plan = load_plan(tmp_path / "plan" / "plan.json")
    instrs = [i for rank in plan.ranks for step in rank for i in step]
    units = [u.op for i in instrs for u in i.units()]
    gathers = sum(i.op == "ALL_GATHER" for i in instrs)
    assert gathers == sum(op in "FBIWR" for op in units) + sum(op in "FR" for op in units)  # ZeRO's, CP's
    assert CliRunner().invoke(main, ["check", str(tmp_path / "plan" / "plan.json")]).exit_code == 0


def test_zero_1_declares_nothing_and_zero_3_without_resharding_its_reduce_scatters_alone(tmp_path):
    """--zero 1 declares nothing (the plan stays version 1); --zero 3 without resharding (a stage
    gathered once a step, at whichever op of it comes first) declares a REDUCE_SCATTER after each
    backward and no ALL_GATHER."""
    result = _sharded_compile(tmp_path, "1f1b", ["--zero", "1"], "one")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "one" / "plan.json").read_text())["version"] == 1
    result = _sharded_compile(tmp_path, "1f1b", ["--zero", "3", "--no-reshard-after-forward"], "kept")
    assert result.exit_code == 0, result.output
    instrs = [i for rank in load_plan(tmp_path / "kept" / "plan.json").ranks for i in rank[0]]
    declared = [(i.op, i.stage, i.mb) for i in instrs if i.op in ("ALL_GATHER", "REDUCE_SCATTER")]
    assert declared and declared == [("REDUCE_SCATTER", i.stage, i.mb) for i in instrs if i.op == "B"]


def test_collectives_out_of_order_between_two_ranks_of_a_group_are_reported_naming_both(tmp_path):
    """DualPipe holds each stage on two ranks (0 and 3 hold stages 0 and 3), so ZeRO's collectives of
    those stages are over the group [0, 3]. Rank 0's first ALL_GATHER and REDUCE_SCATTER over it swapped:
    the check reports both of the group's collectives that now differ, each naming rank 0's and rank 3's."""
    from schedc.checks.channels import check_channels
    from schedc.plan import Plan
    result = _sharded_compile(tmp_path, "dualpipe", ["--zero", "3"], "dp")
    assert result.exit_code == 0, result.output
    plan = load_plan(tmp_path / "dp" / "plan.json")
    assert check_channels(plan) == []
    stream = list(plan.ranks[0][0])
    ours = [k for k, i in enumerate(stream) if i.group == (0, 3)]
    first = next(k for k in ours if stream[k].op == "ALL_GATHER")
    scatter = next(k for k in ours if stream[k].op == "REDUCE_SCATTER")
    stream[first], stream[scatter] = stream[scatter], stream[first]
    mutated = Plan(plan.meta, ((tuple(stream), *plan.ranks[0][1:]), *plan.ranks[1:]))
    messages = [d.message for d in check_channels(mutated)]
    assert any("#0 of group [0, 3]: rank 0 REDUCE_SCATTER, rank 3 ALL_GATHER" in m for m in messages), messages
    assert any(" of group [0, 3]: rank 0 ALL_GATHER, rank 3 REDUCE_SCATTER" in m for m in messages), messages
