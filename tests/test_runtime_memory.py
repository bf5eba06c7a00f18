# Tests of the runtime's activation recomputation (--recompute) and its measured activation memory:
# recomputed runs give the one-process reference's loss and gradients under every kind of backward
# (full B, split I + W, overlapped F & B, K-FAC's tasks), a split backward replays each region once, in
# I; the bytes each forward saves equal schedc/costmodel/activations.py's table for the runtime's GPT, and the
# microbatches in flight peak where the simulator says.
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from schedc.costmodel.activations import RUNTIME_GPT, Sizes, stage_bytes
from schedc.plan import load_plan
from test_runtime import _dump, _repo, launch_plans, plans, reference  # noqa: F401 (fixtures)

FOUR = ["--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]
EIGHT = ["--layers", "8", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]
TOLERANCE = 1e-5
MODES = ("none", "selective", "full")


def relative_errors(got: tuple, want: tuple) -> tuple[float, float]:
    """(loss, largest gradient) relative error of a run's dump against the reference's."""
    (loss, grads), (ref_loss, ref_grads) = got, want
    assert sorted(grads) == sorted(ref_grads)
    worst = max(((grads[n] - r).norm() / r.norm().clamp_min(1e-12)).item() for n, r in ref_grads.items())
    return abs(loss - ref_loss) / abs(ref_loss), worst


def compile_with(tmp: Path, schedule: str, addon: str, **params) -> Path:
    out = tmp / f"{schedule}_{addon}"
    defines = [arg for k, v in params.items() for arg in ("-D", f"{k}={v}")]
    run = subprocess.run([sys.executable, "-m", "schedc.cli", "compile", f"schedc/schedules/{schedule}.sched",
                          *defines, f"--with={addon}", "-o", str(out)], capture_output=True, text=True, cwd=_repo())
    assert run.returncode == 0, run.stdout + run.stderr
    return out / "plan.json"


def compile_fixture(tmp: Path, path: str) -> Path:
    out = tmp / Path(path).stem
    run = subprocess.run([sys.executable, "-m", "schedc.cli", "compile", path, "-o", str(out)],
                         capture_output=True, text=True, cwd=_repo())
    assert run.returncode == 0, run.stdout + run.stderr
    return out / "plan.json"


def _losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


PLACED = [("offload_1f1b", {"p": 2, "m": 4}), ("interleaved_1f1b_recompute", {"p": 2, "v": 2, "m": 4})]


@pytest.mark.slow
def test_recompute_gives_the_reference_under_every_backward(plans, reference, tmp_path):  # noqa: F811
    """Selective and full recomputation against the one-process reference: 1F1B (full backwards),
    ZB-H1 (split I + W), DualPipeV (overlapped F & B, split and full backwards); the library's placed
    recomputation (R) and offload (O, L), on 2 ranks; with K-FAC's tasks
    (PipeFisher's bubble-filled 1F1B, ZB-H1 with the add-on: curvature between I and W) five steps of
    losses equal those of the same plan without recomputation (the last two preconditioned)."""
    cases = [("1f1b", {"p": 2, "m": 4}), ("zb_h1", {"p": 2, "m": 3}), ("dualpipev", {"p": 2, "m": 5})]
    jobs, checks = [], []
    for name, params in cases:
        for mode in ("selective", "full"):
            out = tmp_path / f"{name}_{mode}"
            jobs.append((plans(name, **params), [*FOUR, "--steps", "1", "--quiet", "--recompute", mode,
                                                 "--save-grads", str(out)]))
            checks.append((name, mode, plans(name, **params), out))
    for name, params in PLACED:  # R, O and L placed by the schedule, with --recompute none
        out = tmp_path / name
        jobs.append((plans(name, **params), [*FOUR, "--steps", "1", "--quiet", "--save-grads", str(out)]))
        checks.append((name, "placed", plans(name, **params), out))
    kfac = [plans("pipefisher_1f1b", p=2, m=4), compile_with(tmp_path, "zb_h1", "kfac", p=2, m=4)]
    for n, plan in enumerate(kfac):
        for mode in ("none", "full"):
            jobs.append((plan, [*FOUR, "--steps", "5", "--quiet", "--optimizer", "sgd", "--lr", "0.05",
                                "--tasks", "schedc.runtime.kfac", "--recompute", mode,
                                "--metrics-out", str(tmp_path / f"kfac{n}_{mode}.jsonl")]))
    run = launch_plans(jobs, 2, tmp_path)
    assert run.returncode == 0, run.stderr
    for name, mode, plan, out in checks:
        loss, grads = relative_errors(_dump(out), reference(plan, FOUR))
        assert loss <= TOLERANCE and grads <= TOLERANCE, (name, mode, loss, grads)
    for n in range(len(kfac)):
        plain, recomputed = (_losses(tmp_path / f"kfac{n}_{mode}.jsonl") for mode in ("none", "full"))
        assert len(plain) == 5 and recomputed == pytest.approx(plain, rel=TOLERANCE), n


def _blocks(mode: str):
    """Two GPT blocks as a middle stage, recomputed by `mode`, from one seed."""
    from schedc.runtime.model.gpt import ModelConfig, Stage, build_gpt
    from schedc.runtime.execution.recompute import apply_recompute
    torch.manual_seed(0)
    stage = Stage(build_gpt(ModelConfig(layers=2, hidden=32, heads=2, seq=16, vocab=256, mb_size=2))[1:-1])
    apply_recompute(stage, mode, first=False, last=False)
    return stage


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_a_split_backward_replays_each_region_once_in_i(monkeypatch, mode):
    """I (the input gradient) replays each recomputed region of the stage once; W (the weight
    gradients, from what I kept) replays none and is exact; a full backward replays each once too."""
    from schedc.runtime.execution import recompute
    from schedc.runtime.execution.executor import split_backward
    replays = []
    replay = recompute._Frame.replay
    monkeypatch.setattr(recompute._Frame, "replay", lambda frame: replays.append(frame) or replay(frame))
    torch.manual_seed(1)
    x0, grad = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
    plain = _blocks("none")
    x = x0.clone().requires_grad_()
    plain(x).backward(grad)
    want = [p.grad for p in plain.parameters()] + [x.grad]
    for split in (True, False):
        stage, x = _blocks(mode), x0.clone().requires_grad_()
        y, replays[:] = stage(x), []
        if split:
            params = list(stage.parameters())
            (dx,), groups = split_backward()[0]([y], [grad], [x], params)
            assert len(replays) == 2  # one region a block, each replayed in I
            split_backward()[1](params, groups)
        else:
            y.backward(grad)
            dx = x.grad
        assert len(replays) == 2
        got = [p.grad for p in stage.parameters()] + [dx]
        assert max(((g - w).norm() / w.norm()).item() for g, w in zip(got, want)) <= 1e-6


def test_a_region_that_replays_otherwise_is_refused():
    from schedc.runtime.execution.recompute import RecomputeError, recomputed
    calls = []

    def differs(x):
        calls.append(1)
        return (x * x).sum() if len(calls) == 1 else x.sum()
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(RecomputeError, match="saved 0 tensors where its forward saved 2"):
        recomputed(True, differs, x).backward()


# (schedule, params) whose microbatches in flight the runtime must peak at as the simulator does
IN_FLIGHT = [("1f1b", {"p": 4, "m": 8}), ("zb_h1", {"p": 4, "m": 6}), ("zb_h2", {"p": 4, "m": 8}),
             ("zbv", {"p": 4, "m": 6}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8})]


def runtime_sizes(options: list[str]) -> Sizes:
    """The GPT's sizes from its options (MLP 4h wide, vocabulary 256: the runtime's defaults)."""
    value = {options[i][2:]: int(options[i + 1]) for i in range(0, len(options), 2)}
    return Sizes(value["seq"], value["mb-size"], value["hidden"], value["heads"], 4 * value["hidden"], 256)


@pytest.mark.slow
def test_saved_bytes_equal_the_table_and_in_flight_peaks_the_simulators(plans, reference, tmp_path):  # noqa: F811
    """One 4-rank launch. 1F1B over 4 stages (the embedding's, two middle ones, the head's) under each
    --recompute: every forward of a stage saves the bytes schedc/costmodel/activations.py gives for the
    runtime's GPT, to the byte, and so under t = 2 over 2 stages (tensor-parallel layers, vocabulary-
    parallel ends) with and without sequence parallelism (the column-parallel inputs kept as sequence
    shards); the 5 schedules: each rank's most (stage, mb) states alive at once is the simulator's peak
    (activation units, one a microbatch and chunk), each stage's no more; offloading 1F1B and placed R
    on 4 ranks give the reference (rel <= 1e-5), their peaks as _check_placed_memory says."""
    jobs = [(plans("1f1b", p=4, m=4), [*EIGHT, "--steps", "2", "--quiet", "--recompute", mode,
                                       "--report-out", str(tmp_path / f"bytes_{mode}.json")]) for mode in MODES]
    tensor = {f"{mode}{'_sp' * sp}": (mode, sp) for mode in MODES for sp in (False, True)}
    jobs += [(plans("1f1b", p=2, m=4), [*EIGHT, "--steps", "1", "--quiet", "--recompute", mode, "--tp", "2",
                                        *(["--sequence-parallel"] if sp else []),
                                        "--report-out", str(tmp_path / f"tp_{name}.json")])
             for name, (mode, sp) in tensor.items()]
    jobs += [(plans(name, **params), [*EIGHT, "--steps", "2", "--quiet", "--report-out", str(tmp_path / f"{name}.json")])
             for name, params in IN_FLIGHT]
    jobs += [(plans(name, **params), [*EIGHT, "--steps", "2", "--quiet", *options, "--save-grads",
                                      str(tmp_path / report), "--report-out", str(tmp_path / f"{report}.json")])
             for report, (name, params, options) in PLACED_MEMORY.items()]
    run = launch_plans(jobs, 4, tmp_path)
    assert run.returncode == 0, run.stderr
    for report, (name, params, _) in PLACED_MEMORY.items():
        loss, grads = relative_errors(_dump(tmp_path / report), reference(plans(name, **params), EIGHT))
        assert loss <= TOLERANCE and grads <= TOLERANCE, (report, loss, grads)
    _check_placed_memory(plans, tmp_path)
    sizes = runtime_sizes(EIGHT)
    for mode in MODES:
        memory = json.loads((tmp_path / f"bytes_{mode}.json").read_text())["memory"]
        want = {str(s): stage_bytes(sizes, RUNTIME_GPT, 2, s == 0, s == 3, recompute=mode) for s in range(4)}
        assert {s: v["saved_bytes_per_microbatch"] for s, v in memory["stages"].items()} == want, mode
        assert all(rank["saved_bytes_equal_over_microbatches"] for rank in memory["ranks"]), mode
    assert want["1"] == 2 * 4 * 16 * 2 * 32  # full: a layer keeps its fp32 input alone
    for name, (mode, sp) in tensor.items():
        memory = json.loads((tmp_path / f"tp_{name}.json").read_text())["memory"]
        want = {str(s): stage_bytes(sizes, RUNTIME_GPT, 4, s == 0, s == 1, 2, sp, mode) for s in range(2)}
        assert {s: v["saved_bytes_per_microbatch"] for s, v in memory["stages"].items()} == want, name
        ranks = [rank["saved_bytes_per_microbatch"] for rank in memory["ranks"]]
        assert ranks == [{"0": want["0"]}] * 2 + [{"1": want["1"]}] * 2, name  # every tensor rank alike
    assert want["0"] == 4 * (16 // 2) * 2 * 32 * 4 + 8 * (32 + 8) + 32  # full, SP: input shards, ids, mask
    for name, params in IN_FLIGHT:
        memory = json.loads((tmp_path / f"{name}.json").read_text())["memory"]
        simulated = load_plan(plans(name, **params)).meta["stats"]["peak_memory"]
        assert [rank["peak_states_on_rank"] for rank in memory["ranks"]] == simulated, name
        for rank, peak in zip(memory["ranks"], simulated):
            assert max(rank["peak_microbatches_in_flight"].values()) <= peak, name


def walked_peak(program, full: dict[int, int], kept: dict[int, int]) -> int:
    """The most saved bytes alive at once over a step program, by the placed ops' rule written afresh:
    F holds its state's `full` bytes, or its input's (`kept`) where the program has an R for it; O
    leaves the input's bytes on the device, R and L bring the full bytes back, B (or W after I) frees
    the state."""
    recomputed = {(i.stage, i.mb) for i in program if i.op == "R"}
    live: dict[tuple[int, int], int] = {}
    peak = 0
    for instr in program:
        key = (instr.stage, instr.mb)
        if instr.op == "F":
            live[key] = kept[instr.stage] if key in recomputed else full[instr.stage]
        elif instr.op in ("R", "L"):
            live[key] = full[instr.stage]
        elif instr.op == "O":
            live[key] = kept[instr.stage]
        elif instr.op in ("B", "W"):
            del live[key]
        peak = max(peak, sum(live.values()))
    return peak


def input_bytes(options: list[str], stage: int) -> int:
    """What a stage's input takes: token ids (int64) on stage 0, else a [b, s, h] fp32 activation."""
    value = {options[i][2:]: int(options[i + 1]) for i in range(0, len(options), 2)}
    return value["mb-size"] * value["seq"] * (8 if stage == 0 else 4 * value["hidden"])


def offload_kept(options: list[str], stage: int, last: int) -> int:
    """What an offloaded state leaves on the device: its input, and on the last stage the targets its
    loss saved too (views of the step's batch, which stays)."""
    return input_bytes(options, stage) + (input_bytes(options, 0) if stage == last else 0)


# report name: (schedule, params, options) of the placed ops' memory runs, in the 4-rank launch
PLACED_MEMORY = {"offload": ("offload_1f1b", {"p": 4, "m": 8}, []),
                 "placed_r": ("interleaved_1f1b_recompute", {"p": 4, "v": 2, "m": 8}, []),
                 "full_r": ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8}, ["--recompute", "full"])}


def _check_placed_memory(compiled, directory: Path) -> None:
    """Measured peaks of live saved bytes per rank (EIGHT: 1F1B's 4 stages of 2 layers, interleaved's 8
    of 1), each the walk over the rank's program with the table's bytes per state. Offloading 1F1B
    (the last stage keeps its state): below 1F1B's on ranks 0 and 1 (rank 0 about half), 1F1B's on
    ranks 2 and 3 (as the simulator's units: 2 2 2 1 against 4 3 2 1). Placed R against --recompute
    full on interleaved 1F1B's order: the same states in flight on each rank, each keeping its input
    alone; the peak is not full recomputation's, for the meter counts what R rebuilt (one state, alive
    from R to its B) and not the replay inside a recomputed backward: less that one state it is no more
    than full recomputation's."""
    sizes = runtime_sizes(EIGHT)

    def ranks(report: str) -> list[dict]:
        return json.loads((directory / f"{report}.json").read_text())["memory"]["ranks"]

    def programs(report: str) -> list:
        name, params, _ = PLACED_MEMORY[report]
        return [steps[0] for steps in load_plan(compiled(name, **params)).ranks]
    full = {s: stage_bytes(sizes, RUNTIME_GPT, 2, s == 0, s == 3) for s in range(4)}
    offload = [rank["peak_saved_bytes"] for rank in ranks("offload")]
    assert offload == [walked_peak(p, full, {s: offload_kept(EIGHT, s, 3) for s in range(4)})
                       for p in programs("offload")]
    plain = [rank["peak_saved_bytes"] for rank in ranks("1f1b")]
    assert offload[0] < plain[0] and offload[1] < plain[1] and 2 * offload[0] < 1.01 * plain[0]
    assert offload[2:] == plain[2:]
    full = {s: stage_bytes(sizes, RUNTIME_GPT, 1, s == 0, s == 7) for s in range(8)}
    placed = [rank["peak_saved_bytes"] for rank in ranks("placed_r")]
    assert placed == [walked_peak(p, full, {s: input_bytes(EIGHT, s) for s in range(8)}) for p in programs("placed_r")]
    recomputed = {s: stage_bytes(sizes, RUNTIME_GPT, 1, s == 0, s == 7, recompute="full") for s in range(8)}
    whole = [rank["peak_saved_bytes"] for rank in ranks("full_r")]
    assert whole == [walked_peak(p, recomputed, {}) for p in programs("full_r")]
    assert [r["peak_states_on_rank"] for r in ranks("placed_r")] == [r["peak_states_on_rank"] for r in ranks("full_r")]
    largest = [max(full[s], full[s + 4]) for s in range(4)]
    assert all(p - one <= w < p for p, one, w in zip(placed, largest, whole))


def test_selective_recomputation_needs_an_attention_core():
    """A user model's layers without a `recompute_core` module: selective is refused naming the stage,
    full wraps them whatever they are."""
    from schedc.runtime.model.gpt import ModelError, Stage
    from schedc.runtime.model.train import _recompute
    pieces = [("embed", torch.nn.Embedding(8, 4)), ("mlp", torch.nn.Linear(4, 4)), ("out", torch.nn.Linear(4, 8))]
    with pytest.raises(ModelError, match="stage 0's layers name none"):
        _recompute({0: Stage(pieces)}, 1, "selective")
    stage = Stage(pieces)
    _recompute({0: stage}, 1, "full")
    assert stage.recomputed_pieces == {1}
