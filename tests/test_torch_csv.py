"""torch CSV import/export: round trip, torch's own loader and simulator accept our exports, refusals."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import reference_orders as R
from conftest import compile_library
from schedc.cli import main
from schedc.diagnostics import SchedError, Source
from schedc.interop.torch_csv import export_csv, schedule_from_csv_text

SKIP = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}
EXPORTABLE = [("1f1b", dict(p=4, m=8)), ("gpipe", dict(p=4, m=8)), ("interleaved_1f1b", dict(p=4, v=2, m=8))]


def keys(schedule):
    return [[(op.kind, op.stage, op.mb) for op in order] for order in schedule.orders]


@pytest.mark.parametrize("name,params", EXPORTABLE, ids=[n for n, _ in EXPORTABLE])
def test_export_then_import_gives_the_same_orders(name, params):
    schedule = compile_library(name, **params).schedule
    text = export_csv(schedule)
    back = schedule_from_csv_text(Source("x.csv", text))
    assert keys(back) == keys(schedule)
    assert back.pipelines[0].placement == schedule.pipelines[0].placement
    assert back.microbatches == schedule.microbatches
    assert back.orders[0][1].span.line == 1 and back.orders[1][0].span.line == 2


@pytest.mark.parametrize("name,params", EXPORTABLE, ids=[n for n, _ in EXPORTABLE])
def test_torch_loads_and_simulates_our_export(name, params, tmp_path):
    from torch.distributed.pipelining import schedules
    schedule = compile_library(name, **params).schedule
    path = tmp_path / f"{name}.csv"
    path.write_text(export_csv(schedule))
    p, stages = schedule.devices, schedule.stages
    runtime = schedules._PipelineScheduleRuntime([R._MockStage(s, stages, 0, p) for s in range(0, stages, p)],
                                                 schedule.microbatches)
    runtime._load_csv(str(path))
    assert runtime.stage_index_to_group_rank == dict(enumerate(schedule.pipelines[0].placement))
    # torch's simulator knows compute and send/recv only: drop the FSDP/grad-reduce actions it added
    lowered = {rank: [a for a in actions if a is not None and a.computation_type.value not in SKIP]
               for rank, actions in runtime.pipeline_order_with_comms.items()}
    simulated = schedules._simulate_comms_compute(lowered, lambda s: runtime.stage_index_to_group_rank[s],
                                                  stages)  # raises "Schedule is not progressing" on a deadlock
    assert sum(a is not None and a.is_compute_op for row in simulated.values() for a in row) == schedule.op_count()


def test_cli_export_and_check_the_csv(tmp_path):
    out = tmp_path / "o.csv"
    result = CliRunner().invoke(main, ["export", "1f1b", "-D", "p=2", "-D", "m=2", "--format", "torch-csv",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    result = CliRunner().invoke(main, ["check", str(out)])
    assert result.exit_code == 0 and "ok" in result.output
    result = CliRunner().invoke(main, ["simulate", str(out)])
    assert result.exit_code == 0 and "makespan" in result.output


def test_export_refuses_replicated_stages(tmp_path):
    result = CliRunner().invoke(main, ["export", "chimera", "-o", str(tmp_path / "c.csv")])
    assert result.exit_code == 1
    assert "cannot represent" in result.output and "replicated stages" in result.output
    assert not (tmp_path / "c.csv").exists()


def test_export_refuses_tasks_at_their_declaration(tmp_path):
    """K-FAC's tasks (--with kfac): the refusal points at the first task's line in the add-on, not at
    the base schedule's pipeline."""
    result = CliRunner().invoke(main, ["export", "1f1b", "--with", "kfac", "-o", str(tmp_path / "k.csv")])
    assert result.exit_code == 1 and not (tmp_path / "k.csv").exists()
    assert "addons/kfac.sched:" in result.output and "runs the tasks curvature_A" in result.output
    assert "  task curvature_A(s, i)" in result.output


def test_import_skips_non_compute_cells_and_reads_overlap():
    text = "0F0,,0F1,(0B0;0F2)OVERLAP_F_B,0B1,0B2,0REDUCE_GRAD\n1F0,1B0,1F1,1B1,1F2,1B2\n"
    schedule = schedule_from_csv_text(Source("x.csv", text))
    assert [str(op) for op in schedule.orders[0]] == ["F(0,0)", "F(0,1)", "B(0,0)", "F(0,2)", "B(0,1)", "B(0,2)"]


@pytest.mark.parametrize("text,where,fragment", [
    ("", "1:1", "no compute cells"),
    ("1RECV_B0\n", "1:1", "no compute cells: only message cells"),  # found by the fuzzer (a traceback)
    ("0F0,0SEND_F\n", "1:5", "bad cell '0SEND_F'"),  # compute_comms cells are read (test_library_zb.py)
    ('0F0,"0B0\n', "1:5", "unterminated"),
    ("0F0, 0Q0\n", "1:6", "bad cell '0Q0'"),
])
def test_bad_csv_is_a_located_usage_error(text, where, fragment):
    with pytest.raises(SchedError) as info:
        schedule_from_csv_text(Source("x.csv", text))
    assert info.value.exit_code == 2
    assert f"x.csv:{where}: error:" in info.value.render() and fragment in info.value.render()


def test_a_csv_a_spreadsheet_wrote_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf0F0,0B0\n1F0,1B0\n")
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 0, result.output
    assert "ok (4 ops on 2 devices" in result.output


def test_microbatch_count_can_be_given():
    text = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    from schedc.frontend.elaborate import Options
    assert schedule_from_csv_text(Source("x.csv", text), Options({"m": "3"})).microbatches == 3
    with pytest.raises(SchedError) as info:
        schedule_from_csv_text(Source("x.csv", text), Options({"p": "3"}))
    assert info.value.exit_code == 2


def _refusal(text: str, *args: str):
    from schedc.frontend.elaborate import Options
    with pytest.raises(SchedError) as caught:
        schedule_from_csv_text(Source("x.csv", text), Options(dict(a.split("=", 1) for a in args)))
    return caught.value


@pytest.mark.parametrize("text,where,message", [
    ("99999999F0,0F0,0B0\n", (1, 1), "stage 99999999 makes the schedule expand to 100,000,000 stages"),
    ("0F0,0B0,0F" + "9" * 5000 + "\n", (1, 9), "the microbatch number has more than 9 digits"),
    ("9" * 400 + "B0\n", (1, 1), "the stage number has more than 9 digits"),
])
def test_sizes_a_csv_implies_are_bounded_before_anything_is_built(text, where, message):
    exc = _refusal(text)
    diag = exc.diagnostics[0]
    assert exc.exit_code == 2 and (diag.span.line, diag.span.column) == where and message in diag.message


def test_a_stray_huge_microbatch_is_out_of_range_at_its_cell(tmp_path):
    """The microbatch count is the number of distinct forwards most stages run, not the largest
    microbatch + 1: a stray 0F99999999 builds no schedule of 10^8 microbatches, it is out of range."""
    path = tmp_path / "x.csv"
    path.write_text("0F0,0B0\n0F99999999,0B0\n")
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 1
    assert "x.csv:2:1: error: F(0,99999999) on device 1: microbatch 99999999 is outside the microbatches" in result.output


def test_a_huge_microbatch_override_is_refused_naming_it():
    exc = _refusal("0F0,0B0\n", "m=100000000")
    assert exc.exit_code == 2 and exc.diagnostics[0].message.startswith("-D m=100000000: the schedule would expand")


def test_bad_cells_are_reported_twenty_then_counted():
    exc = _refusal(",".join(["xx"] * 10_000) + "\n")
    assert len(exc.diagnostics) == 21
    assert exc.diagnostics[-1].message == "and 9,980 more bad cells like these"
    assert len(exc.render()) < 10_000  # each shows a window of the 30,000-character line, not all of it


def test_too_many_ranks_are_refused_at_the_first_row_past_the_limit():
    from schedc.interop.torch_csv import MAX_RANKS
    exc = _refusal("0F0,0B0\n" * (MAX_RANKS + 1))
    assert exc.exit_code == 2 and exc.diagnostics[0].span.line == MAX_RANKS + 1
    assert f"at most {MAX_RANKS:,}" in exc.diagnostics[0].message


def test_export_makes_the_output_directory_and_refuses_unwritable_paths(tmp_path):
    out = tmp_path / "missing" / "dir" / "x.csv"
    result = CliRunner().invoke(main, ["export", "1f1b", "-D", "p=2", "-D", "m=2", "-o", str(out)])
    assert result.exit_code == 0 and out.read_text().startswith("0F0,")
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(main, ["export", "1f1b", "-o", str(tmp_path / "file" / "x.csv")])
    assert result.exit_code == 2 and f"{tmp_path / 'file'} is not a directory" in result.output
    assert not list(tmp_path.glob("**/*.tmp"))


def test_nested_overlap_cells_are_refused_not_recursed_into():
    exc = _refusal("(" * 20_000 + "0F0" + ")OVERLAP_F_B" * 20_000 + "\n")
    assert exc.exit_code == 2 and "not another OVERLAP_F_B" in exc.diagnostics[0].message
    assert (exc.diagnostics[0].span.line, exc.diagnostics[0].span.column) == (1, 1)


# torch's compute_comms format: a channel fault is located at the cell of the instruction it is about.
# 1F1B on 2 ranks, 2 microbatches, written by hand (torch names a receive by its receiving stage).
COMMS_GOOD = ("0F0,0SEND_F0,0RECV_B0,0F1,0SEND_F1,0B0,0RECV_B1,0B1\n"
              "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n")
COMMS_FAULTS = {
    # rank 1's second receive names microbatch 0: the pair's messages differ at that receive
    "wrong receive": (COMMS_GOOD.replace("1RECV_F1", "1RECV_F0"), "2:27",
                      "messages from rank 0 to rank 1 do not match: 2 sent, 2 received; first difference at message 1"),
    # rank 1 uses F(0,0)'s activation before receiving it: rank 0 blocks at its first send
    "use before receive": (COMMS_GOOD.replace("1RECV_F0,1F0", "1F0,1RECV_F0"), "1:5",
                           "the plan hangs under blocking sends: rank 0 blocks at SEND_F(0,0)>1"),
    # a send from the last stage: its consumer stage 2 does not exist
    "send past the last stage": (COMMS_GOOD.replace("1B1,1SEND_B1", "1B1,1SEND_F1,1SEND_B1"), "2:44",
                                 "rank 1: SEND_F of stage 1 to rank -1"),
}


@pytest.mark.parametrize("fault", sorted(COMMS_FAULTS))
def test_channel_faults_of_a_compute_comms_csv_point_at_the_cell(tmp_path, fault):
    good = tmp_path / "good.csv"
    good.write_text(COMMS_GOOD)
    result = CliRunner().invoke(main, ["check", str(good)])
    assert result.exit_code == 0 and "channels match" in result.output, result.output
    text, where, message = COMMS_FAULTS[fault]
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    result = CliRunner().invoke(main, ["check", str(bad)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"{bad}:{where}: error: {message}" in result.output, result.output


# torch's compute_comms format: the actions torch's runtime needs --------------------------------

TORCH_EXPORTABLE = ["1f1b", "gpipe", "interleaved_1f1b", "looped_bfs", "interleaved_zb", "zb_h1", "zb_h2", "zbv",
                    "v_half", "v_min", "dualpipev"]
ACTIONS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")


def _not_messages(row: list[str]) -> list[str]:
    return [cell for cell in row if "SEND" not in cell and "RECV" not in cell]


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("name", TORCH_EXPORTABLE)
def test_comms_export_puts_torchs_actions_where_torchs_own_lowering_does(name, p):
    """The independent construction is torch's own: its `_PipelineScheduleRuntime` lowers our compute-only
    export (UNSHARD/RESHARD with its prefetch of 3 stages, REDUCE_GRAD after a stage's last B or W);
    our compute_comms export, messages left aside, holds the same cells in the same order."""
    from torch.distributed.pipelining import schedules
    from schedc.interop.torch_comms import export_comms_csv
    m = 2 * p if name != "dualpipev" else 2 * p + 2
    compiled = compile_library(name, p=p, m=m)
    placement = compiled.schedule.pipelines[0].placement
    stages = [R._MockStage(s, len(placement), 0, p) for s in range(len(placement)) if placement[s] == 0]
    runtime = schedules._PipelineScheduleRuntime(stages, m)
    actions = {r: [schedules._Action.from_str(c) for c in row.split(",")]
               for r, row in enumerate(export_csv(compiled.schedule).splitlines())}
    runtime._prepare_schedule_with_comms(actions)
    theirs = [_not_messages([str(a) for a in runtime.pipeline_order_with_comms[r]]) for r in range(p)]
    ours = [_not_messages(row.split(",")) for row in export_comms_csv(compiled.plan).splitlines()]
    assert ours == theirs
    assert sum(cell.endswith("REDUCE_GRAD") for row in ours for cell in row) == len(placement)


def _checked(tmp_path, text: str):
    path = tmp_path / "x.csv"
    path.write_text(text)
    return CliRunner().invoke(main, ["check", str(path)])


GOOD_COMMS = ("0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD,0RESHARD\n"
              "1RECV_F0,1UNSHARD,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1REDUCE_GRAD,1RESHARD,1SEND_B1\n")
# = `schedc export 1f1b -D p=2 -D m=2 --format torch-comms`


def test_check_accepts_a_compute_comms_csv_with_torchs_actions(tmp_path):
    result = _checked(tmp_path, GOOD_COMMS)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output


@pytest.mark.parametrize("edit,where,fragment", [
    (("0B1,0REDUCE_GRAD", "0B1"), "1:58", "stage 0's gradients are never reduced"),
    (("0B0,0RECV_B1", "0B0,0REDUCE_GRAD,0RECV_B1"), "1:49", "0REDUCE_GRAD after 1 of stage 0's 2 backwards"),
    (("1REDUCE_GRAD,", "1REDUCE_GRAD,1REDUCE_GRAD,"), "2:66", "1REDUCE_GRAD again"),
    (("0UNSHARD,0F0", "0F0"), "1:1", "0F0 computes on stage 0 while its FSDP weights are sharded"),
    (("0REDUCE_GRAD,0RESHARD", "0REDUCE_GRAD"), "1:62", "rank 0 ends the step with stage 0 unsharded"),
    (("1UNSHARD,", "1UNSHARD,1UNSHARD,"), "2:19", "1UNSHARD: stage 1 is unsharded already"),
    (("0REDUCE_GRAD,0RESHARD", "0REDUCE_GRAD,0RESHARD,0RESHARD"), "1:84", "0RESHARD: stage 0 is not unsharded"),
    (("0RESHARD\n", "0RESHARD,1RESHARD\n"), "1:84", "1RESHARD on rank 0: stage 1 is on rank 1"),
])
def test_check_refuses_torch_actions_torchs_runtime_would_get_wrong(tmp_path, edit, where, fragment):
    result = _checked(tmp_path, GOOD_COMMS.replace(*edit, 1))
    assert result.exit_code == 1, result.output
    assert f"x.csv:{where}: error: {fragment}" in result.output


def test_check_warns_of_a_compute_comms_csv_without_torchs_actions(tmp_path):
    text = "\n".join(",".join(c for c in row.split(",") if not c.endswith(ACTIONS))
                     for row in GOOD_COMMS.splitlines()) + "\n"
    result = _checked(tmp_path, text)
    assert result.exit_code == 0, result.output
    assert "x.csv:1:1: warning: no UNSHARD, RESHARD or REDUCE_GRAD cells" in result.output
    assert "2 times too large" in result.output


@pytest.mark.parametrize("text,where,fragment", [
    ("0F0,0F1,0F3,0B0,0B1,0B3\n1F0,1B0,1F1,1B1,1F3,1B3\n", "1:9", "F(0,3) on device 0: microbatch 3 is outside"),
    ("0F0,0F1,0B0,0F1,0B1\n1F0,1B0,1F1,1B1\n", "1:13", "F(0,1) runs twice"),
    ("0F0,0F1,0B0,0I1,0W1,0B1\n1F0,1B0,1F1,1B1\n", "1:21", "B(0,1) on device 0 runs the backward that I(0,1)"),
    ("0F0,0F1xyz,0B0,0B1\n1F0,1B0,1F1,1B1\n", "1:5", "bad cell '0F1xyz'"),
    ("0F0,0F1,0B0,0B1,UNSHARD\n1F0,1B0,1F1,1B1\n", "1:17", "bad cell 'UNSHARD': torch's UNSHARD"),
])
def test_check_refuses_what_torchs_validator_lets_through(tmp_path, text, where, fragment):
    """torch 2.13's _validate_schedule accepts the first three (it counts sets of microbatches: a shifted
    microbatch keeps the count, a duplicate is one element, B and I/W of one microbatch balance), and
    _Action.from_str reads 0F1xyz as 0F1 (re.match, not fullmatch); schedc refuses each at its cell."""
    from torch.distributed.pipelining import schedules
    if "xyz" in text:
        assert str(schedules._Action.from_str("0F1xyz")) == "0F1"
    result = _checked(tmp_path, text)
    assert result.exit_code in (1, 2), result.output
    assert f"x.csv:{where}: error: {fragment}" in result.output


def test_the_one_line_schedule_object_holds_the_compiled_order():
    """schedc.torch.schedule builds torch's _PipelineScheduleRuntime with the compute_comms export's
    cells; stage_indices says which stages a rank builds; stages that contradict the placement are
    refused naming the ones it needs."""
    import schedc.torch as st
    assert st.stage_indices("zbv", rank=0, p=2) == (0, 3)
    stages = [R._MockStage(s, 4, 0, 2) for s in (0, 3)]
    runtime = st.schedule("zbv", stages, 4)
    assert [[str(a) for a in runtime.pipeline_order_with_comms[r]] for r in range(2)] == st.orders("zbv", 2, 4)
    assert runtime.stage_index_to_group_rank == {0: 0, 1: 1, 2: 1, 3: 0}
    with pytest.raises(st.ScheduleError, match=r"puts stages \(0, 3\) on rank 0, but this rank's PipelineStages are \(0, 2\)"):
        st.schedule("zbv", [R._MockStage(s, 4, 0, 2) for s in (0, 2)], 4)
    with pytest.raises(st.ScheduleError, match="DualPipeV needs at least 2p microbatches"):
        st.schedule("dualpipev", stages, 2)
    with pytest.raises(st.ScheduleError, match="cannot represent"):
        st.schedule("chimera", [R._MockStage(0, 2, 0, 2)], 4)


def test_export_writes_the_placement_beside_the_csv_and_check_holds_a_csv_to_it(tmp_path):
    import json
    out = tmp_path / "v.csv"
    result = CliRunner().invoke(main, ["export", "zbv", "-D", "p=2", "-D", "m=4", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert 'pipeline_parallel_schedule = "ZBVZeroBubble"' in result.output
    stated = json.loads((tmp_path / "v.placement.json").read_text())
    assert stated["placement"] == "v" and stated["rank_stages"] == [[0, 3], [1, 2]]
    assert stated["torchtitan"]["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    assert CliRunner().invoke(main, ["check", str(out), "--placement", "v"]).exit_code == 0
    bad = CliRunner().invoke(main, ["check", str(out), "--placement", "loop"])
    assert bad.exit_code == 1
    assert "v.csv:1:13: error: 3F0 runs stage 3 on rank 0 (12 cells of it there, the first here), but the loop" in bad.output
    loop = tmp_path / "i.csv"
    assert CliRunner().invoke(main, ["export", "interleaved_1f1b", "-D", "p=2", "-D", "m=4", "-o", str(loop)]).exit_code == 0
    assert json.loads((tmp_path / "i.placement.json").read_text())["placement"] == "loop"
    assert CliRunner().invoke(main, ["check", str(loop), "--placement", "loop"]).exit_code == 0
    single = CliRunner().invoke(main, ["check", str(loop), "--placement", "single"])
    assert single.exit_code == 1 and "the single placement needs p = 2 stages" in single.output


def test_a_measured_overlap_cost_is_taken_for_a_csv_with_overlapped_cells(tmp_path):
    """The cell regex named OVERLAP shadowed ops.OVERLAP (the cost kind FB), so a costs file timing the
    overlapped pair of an imported DualPipeV CSV was refused ('no program overlaps a forward and a
    backward')."""
    csv, costs = tmp_path / "d.csv", tmp_path / "c.json"
    assert CliRunner().invoke(main, ["export", "dualpipev", "-D", "p=2", "-D", "m=4", "-o", str(csv)]).exit_code == 0
    costs.write_text('{"F": 1, "B": 2, "I": 1, "W": 1, "FB": 2.5}')
    result = CliRunner().invoke(main, ["simulate", str(csv), "--costs", str(costs)])
    assert result.exit_code == 0, result.output
    assert "makespan 24 " in result.output


def test_zero_3_places_fsdp_actions_as_the_runtime_reshards():
    """--reshard-after-forward: each cell's stages unsharded before it and resharded after it (an
    overlapped cell's two stages together); --no-reshard-after-forward: from a stage's first cell to the
    row's end; REDUCE_GRAD after the m-th backward either way."""
    from schedc.interop.torch_comms import torch_actions
    units = [((0, "F"),), ((2, "F"),), ((2, "B"), (0, "F")), ((2, "B"),), ((0, "B"),), ((0, "B"),)]
    assert torch_actions(units, 2, True) == [
        (["0UNSHARD"], ["0RESHARD"]), (["2UNSHARD"], ["2RESHARD"]), (["2UNSHARD", "0UNSHARD"], ["2RESHARD", "0RESHARD"]),
        (["2UNSHARD"], ["2REDUCE_GRAD", "2RESHARD"]), (["0UNSHARD"], ["0RESHARD"]),
        (["0UNSHARD"], ["0REDUCE_GRAD", "0RESHARD"])]
    assert torch_actions(units, 2, False) == [
        (["0UNSHARD"], []), (["2UNSHARD"], []), ([], []), ([], ["2REDUCE_GRAD"]), ([], []),
        ([], ["0REDUCE_GRAD", "0RESHARD", "2RESHARD"])]
