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
    ("0F0,0B0\n0F99999999,0B0\n", (2, 1), "microbatch 99999999 makes the schedule expand to 1 stages x 100,000,000"),
    ("0F0,0B0,0F" + "9" * 5000 + "\n", (1, 9), "the microbatch number has more than 9 digits"),
    ("9" * 400 + "B0\n", (1, 1), "the stage number has more than 9 digits"),
])
def test_sizes_a_csv_implies_are_bounded_before_anything_is_built(text, where, message):
    exc = _refusal(text)
    diag = exc.diagnostics[0]
    assert exc.exit_code == 2 and (diag.span.line, diag.span.column) == where and message in diag.message


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
