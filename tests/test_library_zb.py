"""The zero-bubble family, looped BFS, DualPipe and DualPipeV in the library: their orders equal the
independent references (tests/reference_zb.py: torch 2.13's own orders, or constructions from the
published rules; zb_2p: tests/zb_heuristic.py's ZB-H2 under 2p), their simulated bubbles equal the published formulas, and torch's DualPipeV CSV
artifact passes `schedc check` while edited copies are refused at the edit."""
from __future__ import annotations


import pytest
from click.testing import CliRunner

import reference_zb as Z
import zb_heuristic as H
from conftest import FIXTURES, SCHEDULES
from schedc.cli import main
from schedc.driver import compile_source, read_source
from schedc.diagnostics import SchedError, Source
from schedc.frontend.elaborate import Options
from schedc.interop.torch_csv import export_csv, schedule_from_csv_text

TORCH = FIXTURES / "torch"
ARTIFACT = TORCH / "dualpipev_4rank_10mb.csv"


def compile_zb(name: str, costs: dict | None = None, **params):
    options = Options({k: str(v) for k, v in params.items()}, costs=dict(costs or {}))
    return compile_source(read_source(SCHEDULES / f"{name}.sched"), options)


def neutral(schedule) -> list[list[tuple]]:
    """The schedule's orders in reference_zb's form: (kind, stage, mb[, pipeline]) per op, an
    overlapped pair as (forward, backward)."""
    named = len(schedule.pipelines) > 1

    def key(op):
        return (op.kind, op.stage, op.mb) + ((schedule.pipelines[op.pipe].name,) if named else ())
    partner = {id(f): b for f, b in schedule.fused}
    second = {id(b) for b in partner.values()}
    return [[(key(op), key(partner[id(op)])) if id(op) in partner else key(op)
             for op in order if id(op) not in second] for order in schedule.orders]


def sizes(p: int, at_least: int = 1) -> list[int]:
    """m below p, equal, not a multiple of p, below 2p, and large."""
    return sorted({m for m in (p - 1, p, p + 1, 2 * p - 1, 2 * p, 2 * p + 1, 3 * p + 2) if m >= max(1, at_least)})


CASES = []
for p in (2, 4, 8):
    for m in sizes(p):
        CASES += [("zb_h2", dict(p=p, m=m), lambda p=p, m=m: Z.zb_h2(p, m)),
                  ("zbv", dict(p=p, m=m), lambda p=p, m=m: Z.zbv(p, m)),
                  ("v_half", dict(p=p, m=m), lambda p=p, m=m: Z.v_half(p, m)),
                  ("v_min", dict(p=p, m=m), lambda p=p, m=m: Z.v_min(p, m))]
        for v in (2, 3):
            CASES.append(("looped_bfs", dict(p=p, v=v, m=m), lambda p=p, v=v, m=m: Z.looped_bfs(p, v, m)))
        if Z.torch_rounds_allow(p, m):
            CASES.append(("zb_h1", dict(p=p, m=m), lambda p=p, m=m: Z.zb_h1(p, m)))
            for v in (2, 3):
                CASES.append(("interleaved_zb", dict(p=p, v=v, m=m),
                              lambda p=p, v=v, m=m: Z.interleaved_zb(p, v, m)))
    for m in sizes(p) + [4 * p + 3]:  # ZB-H2's shape under ZB-2p's limit: the bounded reference
        CASES.append(("zb_2p", dict(p=p, m=m), lambda p=p, m=m: H.zb_h2(p, m)))
    for m in sizes(p, 2 * p) + [5 * p + 1]:
        CASES.append(("dualpipev", dict(p=p, m=m), lambda p=p, m=m: Z.dualpipev(p, m)))
        if m % 2 == 0:
            CASES.append(("dualpipe", dict(p=p, m=m), lambda p=p, m=m: Z.dualpipe(p, m)))


@pytest.mark.parametrize("name,params,reference", CASES,
                         ids=[f"{n}-" + "-".join(f"{k}{v}" for k, v in kw.items()) for n, kw, _ in CASES])
def test_orders_equal_the_references(name, params, reference):
    result = compile_zb(name, **params)
    assert result.ok, [d.message for d in result.diagnostics]
    assert neutral(result.schedule) == reference()


@pytest.mark.parametrize("name", ["zb_h1", "zb_h2", "zbv", "v_half", "v_min", "interleaved_zb", "looped_bfs",
                                  "dualpipe", "dualpipev"])
def test_library_files_are_short_cite_their_source_and_use_the_params(name):
    text = (SCHEDULES / f"{name}.sched").read_text()
    assert len(text.splitlines()) <= 40
    assert text.startswith("# ") and any(w in text for w in ("Qi et al", "torch 2.13", "DeepSeek", "Lamy-Poirier"))
    for param in ("p", "m") + (("v",) if name in ("interleaved_zb", "looped_bfs") else ()):
        assert f"param {param} =" in text


def idle(result) -> float:
    return max(result.stats["idle"])


@pytest.mark.parametrize("PP", [4, 8, 16])
@pytest.mark.parametrize("costs", [dict(F=1, B=2, I=1, W=1, FB=3), dict(F=2, B=3, I=2, W=1, FB=4)],
                         ids=["unit", "skewed"])
def test_dualpipe_readme_bubbles(PP, costs):
    F, B, W, FB = costs["F"], costs["B"], costs["W"], costs["FB"]
    formula = (PP // 2 - 1) * (FB + B - 3 * W)
    assert idle(compile_zb("dualpipe", costs, p=PP, m=2 * PP)) == formula
    assert idle(compile_zb("dualpipe", costs, p=PP, m=3 * PP)) == formula
    # DualPipeV: PP counts stages, PP/2 devices
    assert idle(compile_zb("dualpipev", costs, p=PP // 2, m=PP + 3)) == formula
    assert idle(compile_zb("1f1b", costs, p=PP, m=2 * PP)) == (PP - 1) * (F + B)
    if costs["F"] == costs["I"] == costs["W"]:
        assert idle(compile_zb("zb_h1", costs, p=PP, m=2 * PP)) == (PP - 1) * (F + B - 2 * W)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zero_bubble_rates(p):
    m = 3 * p
    unit = dict(F=1, I=1, W=1, B=2)
    one_f_one_b = idle(compile_zb("1f1b", unit, p=p, m=m))
    assert one_f_one_b == 3 * (p - 1)
    assert idle(compile_zb("zb_h1", unit, p=p, m=m)) * 3 == one_f_one_b
    assert max(compile_zb("zb_h2", unit, p=p, m=m).stats.idle_inside) == 0
    assert max(compile_zb("zbv", unit, p=p, m=m).stats.idle_inside) == 0
    bounded = compile_zb("zb_2p", unit, p=p, m=4 * m)  # ZB-2p's limit: no bubble inside, 2p at most held
    assert max(bounded.stats.idle_inside) == 0 and max(bounded.timing.peak_memory) == 2 * p
    assert max(compile_zb("zb_h2", unit, p=p, m=4 * m).timing.peak_memory) > 2 * p


@pytest.mark.parametrize("p", [2, 4, 8])
def test_peak_activation_memory(p):
    m = 3 * p
    assert max(compile_zb("zb_h1", p=p, m=m).stats["peak_memory"]) == p
    assert max(compile_zb("zbv", p=p, m=m).stats["peak_memory"]) == 2 * p  # chunk activations: p microbatches
    assert max(compile_zb("dualpipev", p=p, m=2 * p + 2).stats["peak_memory"]) == 2 * p + 1


# V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory"): with F = I = W = 1 per
# chunk a microbatch costs 6 on every device; 1F1B of the same model (a stage is two chunks: F = 2,
# B = 4) idles 6(p - 1). The sail-sg generator's orders (reference_zb.v_half / v_min) idle, between
# a device's first and last op and for m >= 2p, 3p - 7 (V-Half, p even) and 4p - 5 (V-Min, p not a
# multiple of 3): 1F1B's half less 4 and two thirds less 1 (its README: B/2 and 2B/3). Their peaks
# are the playground table's (p + 2) // 2 and (p + 4) // 3 microbatches, two chunk activations each.

@pytest.mark.parametrize("p", [4, 8, 16])
@pytest.mark.parametrize("m_of", [lambda p: 2 * p, lambda p: 3 * p + 1], ids=["m2p", "m3p1"])
def test_v_half_and_v_min_bubbles_are_a_half_and_two_thirds_of_1f1b(p, m_of):
    m = m_of(p)
    one_f_one_b = compile_zb("1f1b", dict(F=2, B=4), p=p, m=m).stats
    assert max(one_f_one_b.idle_inside) == max(one_f_one_b.idle) == 6 * (p - 1)
    half, vmin = compile_zb("v_half", p=p, m=m).stats, compile_zb("v_min", p=p, m=m).stats
    assert max(half.idle_inside) == max(half.idle) == 3 * p - 7 == 6 * (p - 1) // 2 - 4
    assert max(vmin.idle_inside) == max(vmin.idle) == 4 * p - 5 == 6 * (p - 1) * 2 // 3 - 1
    reference = dict(F=1, B=2, I=1, W=1)
    assert max(idle_of(Z.v_half(p, m), reference)) == 3 * p - 7
    assert max(idle_of(Z.v_min(p, m), reference)) == 4 * p - 5


@pytest.mark.parametrize("p", [4, 8, 16])
def test_v_half_and_v_min_peak_memory(p):
    m = 3 * p
    assert max(compile_zb("1f1b", p=p, m=m).stats["peak_memory"]) == p
    assert max(compile_zb("v_half", p=p, m=m).stats["peak_memory"]) == 2 * ((p + 2) // 2)
    assert max(compile_zb("v_min", p=p, m=m).stats["peak_memory"]) == 2 * ((p + 4) // 3)
    # the reference generator's own memory function on its building block gives the same peaks
    for kind, peak in (("half", 2 * ((p + 2) // 2)), ("min", 2 * ((p + 4) // 3))):
        blocks = [[[t + 6 * i for i in range(m)] for t in b] for b in Z.v_block(kind, p)]
        assert max(Z._peak(Z._fill_weights(rank, split=False)) for rank in blocks) == peak


def idle_of(orders, cost) -> list[float]:
    """Per rank, the idle time between its first and last op in the reference's own simulator."""
    from test_reference_zb import simulate
    return [row[-1][1] - row[0][0] - sum(e - s for s, e, _ in row) for row in simulate(orders, 2 * len(orders), cost)]


@pytest.mark.parametrize("name,block", [("v_half", Z.v_half_block), ("v_min", Z.v_min_block)])
@pytest.mark.parametrize("p,m", [(2, 3), (4, 9), (8, 16)])
def test_without_squeeze_the_v_schedules_are_their_building_blocks(name, block, p, m):
    text = (SCHEDULES / f"{name}.sched").read_text()
    assert "\nsqueeze\n" in text
    plain = compile_source(Source(f"{name}.sched", text.replace("\nsqueeze\n", "\n")),
                           Options({"p": str(p), "m": str(m)}))
    assert neutral(plain.schedule) == block(p, m)
    squeezed = compile_zb(name, p=p, m=m)
    assert max(squeezed.stats.idle_inside) <= max(plain.stats.idle_inside)


def test_overlap_cost_defaults_to_the_sum_of_its_halves():
    explicit = compile_zb("dualpipev", dict(FB=3), p=4, m=10)
    default = compile_zb("dualpipev", dict(FB=3), p=4, m=10)
    assert explicit.stats["makespan"] == default.stats["makespan"] == 66
    cheaper = compile_zb("dualpipev", dict(FB=2.5), p=4, m=10)
    assert cheaper.stats["makespan"] < 66


# torch's DualPipeV artifact and edited copies -------------------------------------------------------

def test_check_accepts_torchs_dualpipev_artifact():
    result = CliRunner().invoke(main, ["check", str(ARTIFACT)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output


def test_library_dualpipev_exports_torchs_artifact_byte_for_byte():
    schedule = compile_zb("dualpipev", p=4, m=10).schedule
    assert export_csv(schedule) == ARTIFACT.read_text()
    back = schedule_from_csv_text(Source("x.csv", export_csv(schedule)))
    assert neutral(back) == neutral(schedule) == Z.dualpipev(4, 10)
    assert back.split_of == schedule.split_of


@pytest.mark.parametrize("name,p,v,m", [("ScheduleZBVZeroBubble", 4, 2, 8), ("ScheduleInterleavedZeroBubble", 4, 2, 8),
                                        ("ScheduleDualPipeV", 2, 2, 6), ("ScheduleLoopedBFS", 2, 3, 4)])
def test_import_of_torchs_csv_gives_torchs_order(name, p, v, m):
    schedule = schedule_from_csv_text(Source("t.csv", Z.torch_csv(name, p, v, m)))
    assert neutral(schedule) == Z.torch_order(name, p, v, m)


@pytest.mark.parametrize("fixture,where,fragment", [
    ("dualpipev_w_before_i.csv", "1:274", "waits at W(0,6) for I(0,6), which device 0 runs later"),
    ("dualpipev_missing_b.csv", "4:1", "device 3 never runs B(4,6)"),
    ("dualpipev_swapped_overlap.csv", "3:66", "waits at F(4,4) & B(4,4) for B(5,4) on device 2"),
])
def test_check_refuses_edited_copies_at_the_edit(fixture, where, fragment):
    result = CliRunner().invoke(main, ["check", str(TORCH / fixture)])
    assert result.exit_code == 1
    assert f"{fixture}:{where}: error:" in result.output
    assert fragment in result.output


# the language: misspelt kinds, overlap shape, mixed backward ----------------------------------------

def compile_text(text: str):
    from schedc.driver import compile_source as compile_
    return compile_(Source("t.sched", text))


HEAD = "schedule t \"t\"\nparam p = 2\nparam m = 2\npipeline main { stages 2; device s -> s; microbatches m }\n"


@pytest.mark.parametrize("extra,program,where,fragment", [
    ("queue b by (i)\n", "F F B B", "5:1", "queue of b: unknown kind 'b' (kinds: B, F)"),
    ("cost X = 1\n", "F F B B", "5:1", "cost of X: unknown kind 'X'"),
    ("backward split\ncost B = 2\n", "F F I I W W", "6:1", "B does not run (give I and W)"),
    ("cost FB = 2\n", "F F B B", "5:1", "no program overlaps"),
    ("backward mixed\n", "F F W B B", "6:19", "no input gradient"),
    ("backward mixed\n", "F F ; B & F ; B", "6:21", "a forward and a backward"),
    ("", "F[2] F B B", "5:15", "this device holds chunks 0"),
    ("backward split\nbackward mixed\n", "F F B B", "6:1", "exclude each other"),
    ("", "F at 2 F at 1 B B", "5:27", "slot 1 is not after the slot of the device's previous op (F(0,0) in slot 2)"),
    ("", "F at (0 - 1) F B B", "5:21", "slot -1 is negative"),
])
def test_language_errors_are_located(extra, program, where, fragment):
    text = HEAD + extra + f"on device d {{ {program} }}\n"
    with pytest.raises(SchedError) as info:
        compile_text(text)
    rendered = info.value.render()
    assert f"t.sched:{where}: error:" in rendered, rendered
    assert fragment in rendered, rendered


def test_squeeze_needs_programs_of_built_in_ops():
    greedy = HEAD.replace("pipeline", "squeeze\npipeline") + "greedy\n"
    with pytest.raises(SchedError) as info:
        compile_text(greedy)
    assert "t.sched:4:1: error: 'squeeze' compacts the slots of per-device programs" in info.value.render()
    with pytest.raises(SchedError) as info:
        compile_text(HEAD + "backward mixed\nsqueeze\non device d { F ; F & B ; B }\n")
    assert "t.sched:6:1: error: 'squeeze' moves built-in ops in unit slots" in info.value.render()


def test_squeeze_takes_tasks_the_fill_places():
    """An add-on's tasks are not in the programs (the fill places them after the squeeze): V-Half with
    the K-FAC add-on compiles, passes its checks, and fills the squeezed order."""
    result = CliRunner().invoke(main, ["check", "v_half", "-D", "p=4", "-D", "m=8", "--with", "kfac"])
    assert result.exit_code == 0 and "v_half.sched: ok (" in result.output, result.output
    simulated = CliRunner().invoke(main, ["simulate", "v_half", "-D", "p=4", "-D", "m=8", "--with", "kfac"])
    assert simulated.exit_code == 0 and "filled" in simulated.output, simulated.output


def test_slots_keep_the_program_order_and_a_squeeze_keeps_a_block_without_free_slots_to_fill():
    program = ("on device d {\n  F at d F at (3 + d) F at (6 + d)\n"
               "  I at (9 - d) W I at (12 - d) W I at (15 - d) W\n}\n")
    head = HEAD.replace("param m = 2", "param m = 3") + "backward split\n"
    for text in (head + program, head + "squeeze\n" + program):
        orders = [" ".join(map(str, order)) for order in compile_text(text).schedule.orders]
        assert orders == [f"F({s},0) F({s},1) F({s},2) I({s},0) W({s},0) I({s},1) W({s},1) I({s},2) W({s},2)"
                          for s in (0, 1)]


def test_optional_pops_and_choices():
    text = HEAD + "backward mixed\non device d { F? * 5 ; (I | B) (I | B) ; W? * 3 ; B? }\n"
    schedule = compile_text(text).schedule
    assert [str(op) for op in schedule.orders[0]] == ["F(0,0)", "F(0,1)", "I(0,0)", "I(0,1)", "W(0,0)", "W(0,1)"]
    assert schedule.split_of == frozenset({(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)})


def test_mixed_backward_leftovers_name_the_backward_once():
    text = HEAD + "backward mixed\non device d { F F I }\n"
    with pytest.raises(SchedError) as info:
        compile_text(text)
    rendered = info.value.render()
    assert "leaves 2 ops unscheduled: W(0,0), B(0,1)" in rendered or "leaves 2 ops unscheduled: B(0,1), W(0,0)" in rendered


def test_kind_lists_rank_kinds_in_greedy_priorities():
    text = ("schedule g \"g\"\nparam p = 2\nparam m = 3\npipeline main { stages p; device s -> s; microbatches m }\n"
            "backward split\ngreedy by ([I, F, W], i)\n")
    last = [str(op) for op in compile_text(text).schedule.orders[1]]
    assert last == ["F(1,0)", "I(1,0)", "F(1,1)", "I(1,1)", "F(1,2)", "I(1,2)", "W(1,0)", "W(1,1)", "W(1,2)"]
    with pytest.raises(SchedError) as info:
        compile_text(text.replace("[I, F, W]", "[I, F, Q]"))
    assert "t.sched:6:12: error: unknown kind 'Q' in a list of kinds (kinds: F, I, W)" in info.value.render()


# torch's compute_comms format --------------------------------------------------------------------

SKIP = {"REDUCE_GRAD", "UNSHARD", "RESHARD"}


def torch_comms_csv(name: str, p: int, m: int) -> str:
    """torch's own lowered order as its compute_comms CSV (what `_dump_csv(format="compute_comms")`
    writes: compute, SEND/RECV, UNSHARD/RESHARD and REDUCE_GRAD cells)."""
    order = Z.torch_schedule(name, p, 2, m).pipeline_order_with_comms
    return "".join(",".join(str(a) for a in order[r]) + "\n" for r in range(p))


@pytest.mark.parametrize("name,p,m", [("ScheduleZBVZeroBubble", 2, 4), ("ScheduleDualPipeV", 2, 6),
                                      ("ScheduleZBVZeroBubble", 4, 8)])
def test_check_runs_the_channel_check_on_torchs_compute_comms(tmp_path, name, p, m):
    text = torch_comms_csv(name, p, m)
    good = tmp_path / "good.csv"
    good.write_text(text)
    result = CliRunner().invoke(main, ["check", str(good)])
    assert result.exit_code == 0, result.output
    rows = text.splitlines()
    cells = rows[1].split(",")
    first = next(n for n, c in enumerate(cells) if "RECV_F" in c)
    second = next(n for n, c in enumerate(cells) if "RECV_F" in c and n > first)
    cells[first], cells[second] = cells[second], cells[first]  # two receives from one peer, swapped
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([rows[0], ",".join(cells), *rows[2:]]) + "\n")
    result = CliRunner().invoke(main, ["check", str(bad)])
    assert result.exit_code == 1
    assert "messages from rank 0 to rank 1 do not match" in result.output


def _exported_to_torch(tmp_path, name: str):
    """`schedc export NAME -D p=2 -D m=4 --format torch-comms`, the file checked by `schedc check`
    (its channels match) and loaded by torch's runtime over mock V-shape stages; returns the runtime."""
    from torch.distributed.pipelining import schedules
    out = tmp_path / f"{name}.csv"
    result = CliRunner().invoke(main, ["export", name, "-D", "p=2", "-D", "m=4", "--format", "torch-comms",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    back = CliRunner().invoke(main, ["check", str(out)])
    assert back.exit_code == 0 and "channels match" in back.output
    runtime = schedules._PipelineScheduleRuntime([Z._MockStage(0, 4, 0, 2), Z._MockStage(3, 4, 0, 2)], 4)
    runtime._load_csv(str(out), format="compute_comms")
    return runtime


def test_compute_comms_export_loads_and_runs_in_torchs_simulator(tmp_path):
    from torch.distributed.pipelining import schedules
    runtime = _exported_to_torch(tmp_path, "zbv")
    # torch's simulator knows compute and send/recv only: drop the FSDP/grad-reduce actions
    lowered = {r: [a for a in acts if a is not None and a.computation_type.value not in SKIP]
               for r, acts in runtime.pipeline_order_with_comms.items()}
    simulated = schedules._simulate_comms_compute(lowered, lambda s: runtime.stage_index_to_group_rank[s], 4)
    assert sum(a is not None and a.is_compute_op for row in simulated.values() for a in row) == 48


def test_compute_comms_export_keeps_overlapped_instructions_as_torchs_units(tmp_path):
    """A plan's OVERLAP_F_B instructions are exported as torch's overlapped cells: torch reads them back
    as OVERLAP_F_B actions with the same halves, and `schedc check` of the file passes its channels."""
    runtime = _exported_to_torch(tmp_path, "dualpipev")
    theirs = [[str(a) for a in acts if a is not None and a.sub_actions] for _, acts in
              sorted(runtime.pipeline_order_with_comms.items())]
    ours = [[f"({h[0].stage}F{h[0].mb};{h[1].stage}B{h[1].mb})OVERLAP_F_B" for h in
             (i.halves for i in steps[0] if i.op == "OVERLAP_F_B")] for steps in compile_zb("dualpipev", p=2, m=4).plan.ranks]
    assert theirs == ours and sum(map(len, ours)) == 6


def test_a_backward_runs_whole_or_split_not_both(tmp_path):
    path = tmp_path / "both.csv"
    path.write_text("0F0,0F1,0B0,0I0,0W0,0B1\n1F0,1B0,1F1,1B1\n")
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 1
    assert "both.csv:1:9: error: B(0,0) on device 0 runs the backward that I(0,0)" in result.output
