# Tests of the runtime (schedc.runtime): plans compiled from the library schedules run under torchrun
# on gloo CPU ranks must give the loss and gradients of the unpartitioned model in one process; faults
# end every rank in bounded time naming the lost rank; bad plans are refused before the first step;
# a resumed run continues with the losses of an uninterrupted one. Each torchrun launch takes seconds,
# so the models are tiny and the launches few.
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from schedc.plan import Instr, load_plan
from schedc.plan.write import write_plan
from schedc.runtime.__main__ import main as runtime_main
from schedc.runtime.model.data import Batch
from schedc.runtime.process.launch import launch_from_cli, split_args, torchrun_command
from schedc.runtime.execution.lifetimes import plan_lifetimes
from schedc.runtime.execution.tasks import TaskError, register_task, task_handler

MODEL = ["--layers", "8", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]
SMALL = ["--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16", "--mb-size", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TOLERANCE = 1e-4
CHUNKS_TOLERANCE = 1e-5  # sequence chunks (Seq1F1B): as the recomputation tests' runs
LAUNCH_LIMIT = 180

# (library schedule, params) by rank count: every library schedule at 2 and 4 ranks. The zero-bubble
# family and DualPipe bring chunk cursors, split and mixed backwards and overlapped F & B (in sequence
# on CPU), Seq1F1B sequence chunks (k of them a microbatch, at 1f1b's m); m is not a multiple of p, or
# below 2p, where the schedule allows it. The plans of one rank count run in one launch
# (tests/launch_plans.py).
EXACTNESS = {
    2: [("gpipe", {"p": 2, "m": 4}), ("1f1b", {"p": 2, "m": 4}), ("interleaved_1f1b", {"p": 2, "v": 2, "m": 4}),
        ("seq1f1b", {"p": 2, "m": 4, "k": 2}), ("seq1f1b", {"p": 2, "m": 4, "k": 4}),
        ("chimera", {"p": 2, "m": 4}),
        ("zb_h1", {"p": 2, "m": 3}), ("zb_h2", {"p": 2, "m": 5}), ("zbv", {"p": 2, "m": 4}),
        ("v_half", {"p": 2, "m": 5}), ("v_min", {"p": 2, "m": 3}), ("interleaved_zb", {"p": 2, "v": 2, "m": 4}),
        ("looped_bfs", {"p": 2, "v": 2, "m": 3}), ("combined_1f1b", {"p": 2, "v": 2, "m": 4}),
        ("dualpipe", {"p": 2, "m": 4}), ("dualpipev", {"p": 2, "m": 5})],  # DualPipeV last: its trace is read
    4: [("gpipe", {"p": 4, "m": 4}), ("1f1b", {"p": 4, "m": 8}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 4}),
        ("seq1f1b", {"p": 4, "m": 8, "k": 2}),
        ("chimera", {"p": 4, "m": 4}),
        ("zb_h1", {"p": 4, "m": 6}), ("zb_h2", {"p": 4, "m": 8}), ("zbv", {"p": 4, "m": 6}),
        ("v_half", {"p": 4, "m": 8}), ("v_min", {"p": 4, "m": 6}), ("interleaved_zb", {"p": 4, "v": 2, "m": 4}),
        ("looped_bfs", {"p": 4, "v": 2, "m": 6}), ("dualpipe", {"p": 4, "m": 8}), ("dualpipev", {"p": 4, "m": 8})],
}


@pytest.fixture(scope="session")
def plans(tmp_path_factory):
    """compile(schedule, **params) -> path of plan.json, compiled once per session."""
    root, cache = tmp_path_factory.mktemp("plans"), {}

    def compile_plan(schedule: str, **params) -> Path:
        key = (schedule, tuple(sorted(params.items())))
        if key not in cache:
            out = root / "_".join([schedule, *(f"{k}{v}" for k, v in key[1])])
            defines = [arg for k, v in key[1] for arg in ("-D", f"{k}={v}")]
            run = subprocess.run([sys.executable, "-m", "schedc.cli", "compile",
                                  f"schedc/schedules/{schedule}.sched", *defines, "-o", str(out)],
                                 capture_output=True, text=True, cwd=_repo())
            assert run.returncode == 0, run.stdout + run.stderr
            cache[key] = out / "plan.json"
        return cache[key]
    return compile_plan


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """reference(plan, model, dp) -> (loss, grads) of the one-process run, cached by batch (its
    microbatches: a chunked plan's units over its chunks) and model."""
    root, cache = tmp_path_factory.mktemp("reference"), {}

    def run_reference(plan: Path, model: list[str], dp: int = 1):
        meta = load_plan(plan).meta
        key = (meta["microbatches"] // meta.get("chunks", 1) * dp, tuple(model))
        if key not in cache:
            out = root / f"ref{len(cache)}"
            code = runtime_main([str(plan), "--reference", *model, "--dp", str(dp), "--steps", "1",
                                 "--quiet", "--save-grads", str(out)])
            assert code == 0
            cache[key] = _dump(out)
        return cache[key]
    return run_reference


def _repo() -> Path:
    return Path(__file__).resolve().parents[1]


def _dump(directory: Path) -> tuple[float, dict[str, torch.Tensor]]:
    loss = json.loads((directory / "loss.json").read_text())["loss"]
    return loss, torch.load(directory / "grads.pt")


def torchrun(plan: Path, nproc: int, *options: str, limit: float = LAUNCH_LIMIT):
    command = torchrun_command(plan, nproc, [*options, "--timeout", "30"])
    begin = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=limit, cwd=_repo())
    return run, time.monotonic() - begin


def assert_same(got: tuple, want: tuple, tolerance: float = TOLERANCE) -> None:
    (loss, grads), (ref_loss, ref_grads) = got, want
    assert abs(loss - ref_loss) <= tolerance * abs(ref_loss)
    assert sorted(grads) == sorted(ref_grads)
    for name, ref in ref_grads.items():
        error = ((grads[name] - ref).norm() / ref.norm().clamp_min(1e-12)).item()
        assert error <= tolerance, f"{name}: relative error {error:.2e}"


def launch_plans(jobs: list[tuple[Path, list[str]]], nproc: int, directory: Path):
    """Run every (plan, options) in one torchrun launch of `nproc` processes (tests/launch_plans.py)."""
    listing = directory / "jobs.json"
    listing.write_text(json.dumps([[str(plan), [*options, "--timeout", "30"]] for plan, options in jobs]))
    command = [sys.executable, "-m", "schedc.runtime.process.launch", "--standalone", "--nproc-per-node", str(nproc),
               str(Path(__file__).parent / "launch_plans.py"), str(listing)]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=LAUNCH_LIMIT + 20 * len(jobs),
                          cwd=_repo())


@pytest.mark.slow
@pytest.mark.parametrize("ranks", sorted(EXACTNESS))
def test_library_schedules_match_reference(plans, reference, tmp_path, ranks):
    """Each plan's loss and first-step gradients equal the one-process reference (Seq1F1B's within
    1e-5); each OVERLAP_F_B is timed as one instruction, its halves in none other (the trace of the
    DualPipeV run); Seq1F1B's chunks keep less activation memory than 1F1B at the same m."""
    cases = [(name, params, _label(name, params), plans(name, **params)) for name, params in EXACTNESS[ranks]]
    jobs = [(plan, [*MODEL, "--steps", "1", "--quiet", "--save-grads", str(tmp_path / label)]
             + (["--trace-out", str(tmp_path / "trace.json")] if name == "dualpipev" else [])
             + (["--report-out", str(tmp_path / f"{label}.json")] if name in ("1f1b", "seq1f1b") else []))
            for name, _, label, plan in cases]
    run = launch_plans(jobs, ranks, tmp_path)
    assert run.returncode == 0, run.stderr
    for name, params, label, plan in cases:
        try:
            tolerance = CHUNKS_TOLERANCE if name == "seq1f1b" else TOLERANCE
            assert_same(_dump(tmp_path / label), reference(plan, MODEL), tolerance)
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from None
    _assert_chunks_keep_less(tmp_path, [case[:3] for case in cases if case[0] in ("1f1b", "seq1f1b")])
    overlapped = sorted(half_names(i) for steps in load_plan(plans("dualpipev", **EXACTNESS[ranks][-1][1])).ranks
                        for i in steps[0] if i.op == "OVERLAP_F_B")
    events = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
              if e["ph"] == "X" and e["name"] != "wait"]
    timed = sorted(tuple(f"{h['op']}{h['stage']}.{h['mb']}" for h in e["args"]["halves"]) for e in events
                   if e["args"]["op"] == "OVERLAP_F_B")
    assert overlapped and timed == overlapped
    assert {e["name"] for e in events if e["args"]["op"] == "OVERLAP_F_B"} == {" & ".join(p) for p in overlapped}
    alone = {e["name"] for e in events if e["args"]["op"] != "OVERLAP_F_B"}
    assert not alone & {half for pair in overlapped for half in pair}


def _label(name: str, params: dict) -> str:
    return "_".join([name, *(f"{k}{v}" for k, v in params.items())])


def _assert_chunks_keep_less(directory: Path, cases: list[tuple[str, dict, str]]) -> None:
    """Seq1F1B over k chunks against 1F1B at the same p and m (their --report-out memory): device 0 keeps
    p - 1 + k chunks' saved states at its peak where 1F1B keeps p microbatches' ((p - 1 + k) / k
    microbatches' worth against p), and its peak of saved bytes is below 1F1B's, made of chunks that
    each save less than a microbatch."""
    device0 = {label: json.loads((directory / f"{label}.json").read_text())["memory"]["ranks"][0]
               for _, _, label in cases}
    ((p, m, whole),) = [(params["p"], params["m"], device0[label]) for name, params, label in cases if name == "1f1b"]
    chunked = [(device0[label], params["k"]) for name, params, label in cases if name == "seq1f1b"]
    assert chunked and all(params["m"] == m for _, params, _ in cases)
    assert whole["peak_states_on_rank"] == p
    for got, k in chunked:
        assert got["peak_states_on_rank"] == p - 1 + k, k
        assert got["peak_saved_bytes"] < whole["peak_saved_bytes"], k
        assert got["saved_bytes_per_microbatch"]["0"] < whole["saved_bytes_per_microbatch"]["0"], k
        assert got["peak_saved_bytes"] <= (p - 1 + k) * got["saved_bytes_per_microbatch"]["0"], k


def half_names(instr: Instr) -> tuple[str, str]:
    """The trace names of an OVERLAP_F_B's halves (F0.3, B7.1), written afresh here."""
    return tuple(f"{half.op}{half.stage}.{half.mb}" for half in instr.halves)


class Recorder:
    """Stands in for an executor: its method table records each call with the stream it ran on, so the
    order in which run_overlapped waits, records and launches can be read off without a GPU."""

    def __init__(self, streams, saved=None, inputs=()):
        self.streams, self.saved = streams, saved or {}
        self.log = [] if streams is None else streams.log  # one log: stream operations and runs in order
        self.table = {op: self._record for op in ("F", "B", "I")}
        self._inputs = list(inputs)
        self.current = None

    def _record(self, instr):
        assert self.current is instr
        self.log.append(("run", str(instr), getattr(self.streams, "now", None)))

    def inputs(self, half):
        return [f"{name} of {half.op}" for name in self._inputs]


class RecordingStreams:
    """The stream operations of runtime.execution.overlap.CudaStreams, recorded: `main` and `side` are names."""

    main, side = "main", "side"

    def __init__(self):
        self.log, self.now = [], "main"

    def current(self):
        return self.now

    def wait(self, waiter, waited):
        self.log.append(("wait", waiter, waited))

    def using(self, stream):
        from contextlib import contextmanager

        @contextmanager
        def on():
            before, self.now = self.now, stream
            try:
                yield
            finally:
                self.now = before
        return on()

    def record(self, tensor, stream):
        self.log.append(("record", tensor, stream))


OVERLAP_F_B = Instr("OVERLAP_F_B", halves=(Instr("F", 0, 3, 0), Instr("B", 3, 1, 0)))


def test_overlapped_halves_run_in_the_plans_order_without_cuda():
    from schedc.runtime.execution.overlap import run_overlapped
    executor = Recorder(streams=None)
    run_overlapped(executor, OVERLAP_F_B._replace(halves=OVERLAP_F_B.halves[::-1]))
    assert executor.log == [("run", "B stage=3 mb=1 pipe=0", None), ("run", "F stage=0 mb=3 pipe=0", None)]


@pytest.mark.parametrize("forward_ran_on, forward_on", [(None, "side"), ("main", "side"), ("side", "main")])
def test_overlapped_halves_go_to_two_streams_between_waits(forward_ran_on, forward_on):
    """The backward where its forward ran, the forward on the other stream; the side stream waits for
    main first, main for the side stream last; each half's inputs are recorded on its stream before any
    half is launched."""
    from types import SimpleNamespace
    from schedc.runtime.execution.overlap import run_overlapped
    streams = RecordingStreams()
    backward_on = "main" if forward_on == "side" else "side"
    executor = Recorder(streams, {(3, 1): SimpleNamespace(stream=forward_ran_on)}, inputs=["x"])
    run_overlapped(executor, OVERLAP_F_B)
    assert streams.log == [("wait", "side", "main"), ("record", "x of F", forward_on),
                           ("record", "x of B", backward_on), ("run", "F stage=0 mb=3 pipe=0", forward_on),
                           ("run", "B stage=3 mb=1 pipe=0", backward_on), ("wait", "main", "side")]
    assert streams.now == "main"


def test_overlapped_halves_of_one_microbatch_run_in_order_on_cuda_too():
    from schedc.runtime.execution.overlap import run_overlapped
    streams = RecordingStreams()
    executor = Recorder(streams)
    run_overlapped(executor, Instr("OVERLAP_F_B", halves=(Instr("F", 3, 1, 0), Instr("B", 3, 1, 0))))
    assert streams.log == [("run", "F stage=3 mb=1 pipe=0", "main"), ("run", "B stage=3 mb=1 pipe=0", "main")]


@pytest.mark.slow
def test_data_parallel_matches_reference(plans, reference, tmp_path):
    plan = plans("chimera", p=2, m=4)  # replica sync and data-parallel sync together
    run, _ = torchrun(plan, 4, *SMALL, "--dp", "2", "--steps", "1", "--save-grads", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert_same(_dump(tmp_path), reference(plan, SMALL, dp=2))


def build_tiny(cfg):
    """A user model for --model: embedding, `layers` MLP blocks, head; width from the TOML file."""
    width = cfg.extra["width"]
    blocks = [(f"mlp{i}", torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()))
              for i in range(cfg.layers)]
    return [("embed", torch.nn.Embedding(cfg.vocab, width)), *blocks,
            ("out", torch.nn.Linear(width, cfg.vocab))]


class Shifted:
    """User data for --data: random tokens (from seed and step, as the runtime's own data), each to be
    followed by the next token id."""

    def __init__(self, cfg, seed: int):
        self.cfg, self.seed = cfg, seed

    def batch(self, step: int, microbatches: int, size: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 7919 + step)
        tokens = torch.randint(0, self.cfg.vocab, (microbatches * size, self.cfg.seq), generator=gen)
        return Batch(tokens, (tokens + 1) % self.cfg.vocab, size)


def shifted_data(cfg, seed: int) -> Shifted:
    return Shifted(cfg, seed)


def no_batches(cfg, seed: int) -> object:
    return object()


@pytest.mark.slow
def test_user_model_and_data_toml_sgd(plans, tmp_path):
    (tmp_path / "tiny.toml").write_text("[model]\nlayers = 3\nseq = 8\nvocab = 50\nwidth = 12\n")
    plan = plans("gpipe", p=2, m=4)
    options = ["--model", str(tmp_path / "tiny.toml"), "--model-code", "test_runtime:build_tiny",
               "--data", "test_runtime:shifted_data", "--optimizer", "sgd", "--steps", "1", "--quiet"]
    assert runtime_main([str(plan), *options, "--reference", "--save-grads", str(tmp_path / "ref")]) == 0
    command = torchrun_command(plan, 2, [*options, "--save-grads", str(tmp_path / "run")])
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=LAUNCH_LIMIT)
    assert run.returncode == 0, run.stderr
    want = _dump(tmp_path / "ref")
    assert sorted(want[1]) == ["embed.weight", "mlp0.0.bias", "mlp0.0.weight", "mlp1.0.bias",
                               "mlp1.0.weight", "mlp2.0.bias", "mlp2.0.weight", "out.bias", "out.weight"]
    assert_same(_dump(tmp_path / "run"), want)


@pytest.mark.parametrize("data,message,code", [
    (["--data", "no_such_module:fn"], "error: --data 'no_such_module:fn': No module named 'no_such_module'", 1),
    (["--data", "test_runtime"], "expected 'package.module:function'", 1),
    (["--data", "test_runtime:no_batches"], "must return an object with a method batch(step, microbatches, size)", 1),
    (["--data", "test_runtime:LAUNCH_LIMIT"], "LAUNCH_LIMIT is not a function (its type is int)", 1),
    (["--data", "test_runtime:shifted_data", "--synthetic"], "give one of --data and --synthetic", 2),
])
def test_user_data_that_does_not_fit_is_refused(plans, capsys, data, message, code):
    assert runtime_main([str(plans("gpipe", p=2, m=4)), *SMALL, "--reference", "--steps", "1", *data]) == code
    assert message in capsys.readouterr().err


def split_backward_plan(plan_path: Path, out: Path) -> Path:
    """The plan with every B split into I (in B's place) and W (deferred to the end of the step), and a
    user task `probe` after every F."""
    plan = load_plan(plan_path)
    ranks = []
    for steps in plan.ranks:
        program, deferred = [], []
        for instr in steps[0]:
            if instr.op == "B":
                program.append(instr._replace(op="I"))
                deferred.append(instr._replace(op="W"))
            elif instr.op == "STEP":
                program += deferred + [instr]
            else:
                program.append(instr)
                if instr.op == "F":
                    program.append(Instr("probe", instr.stage, instr.mb, instr.pipe))
        ranks.append((tuple(program),))
    write_plan(replace(plan, ranks=tuple(ranks)), out)
    return out / "plan.json"


@pytest.mark.slow
def test_split_backward_and_tasks(plans, reference, tmp_path):
    plan = split_backward_plan(plans("1f1b", p=2, m=4), tmp_path / "plan")
    run, _ = torchrun(plan, 2, *SMALL, "--steps", "1", "--ignore-tasks", "--save-grads",
                      str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    assert_same(_dump(tmp_path / "out"), reference(plan, SMALL))


@pytest.mark.slow
def test_bubble_filled_cycle_runs_with_ignored_tasks(plans, reference, tmp_path):
    plan = plans("pipefisher_1f1b", p=2, m=4)
    assert load_plan(plan).cycle_steps > 1
    run, _ = torchrun(plan, 2, *SMALL, "--steps", "3", "--ignore-tasks", "--save-grads", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert_same(_dump(tmp_path), reference(plan, SMALL))


def test_lifetimes_keep_state_for_tasks_of_the_next_step():
    f, b, late, early = Instr("F", 0, 0), Instr("B", 0, 0), Instr("curv", 0, 0), Instr("curv", 0, 1)
    f1, b1 = Instr("F", 0, 1), Instr("B", 0, 1)
    got = plan_lifetimes([(f, f1, b, late, b1, early), (early, f, f1, b1, b)])
    # step 0 drops (0,0) after its task and keeps (0,1) for the task that opens step 1
    assert got.frees == (frozenset({3}), frozenset({0, 3, 4}))
    assert got.carried == (frozenset({(0, 1)}), frozenset())


@pytest.mark.slow
def test_trace_report_and_profile(plans, tmp_path):
    plan = plans("1f1b", p=2, m=4)
    run, _ = torchrun(plan, 2, *SMALL, "--steps", "3", "--trace-out", str(tmp_path / "trace.json"),
                      "--report-out", str(tmp_path / "report.json"),
                      "--profile-out", str(tmp_path / "costs.json"))
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("step")]
    assert len(lines) == 3 and "loss" in lines[0] and "tokens/s" in lines[0]
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in complete} == {0, 1}
    assert {"F0.0", "B1.3", "SEND_F0.0", "STEP"} <= {e["name"] for e in complete}
    assert all(e["dur"] >= 0 and {"stage", "mb", "op", "pipe", "step"} <= set(e["args"]) for e in complete)
    assert {e["args"]["pipe"] for e in complete if e["args"]["op"] == "F"} == {0}  # the render trace's fields
    # one time base for both ranks: stage 1's F of a microbatch starts after stage 0's ends, and stage
    # 0's B after stage 1's (each rank's own origin had consumers start before their producers ended)
    span = {(e["name"], e["args"].get("step")): (e["ts"], e["ts"] + e["dur"]) for e in complete}
    for step in {e["args"].get("step") for e in complete}:
        for mb in range(4):
            assert span[f"F1.{mb}", step][0] >= span[f"F0.{mb}", step][1]
            assert span[f"B0.{mb}", step][0] >= span[f"B1.{mb}", step][1]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == 2 and report["makespan_ms"] > 0 and report["simulated"]["makespan"]
    costs = json.loads((tmp_path / "costs.json").read_text())
    assert costs["unit"] == "ms" and len(costs["F"]) == 2 and all(v > 0 for v in costs["B"])
    again = subprocess.run([sys.executable, "-m", "schedc.cli", "compile", "schedc/schedules/1f1b.sched",
                            "-D", "p=2", "-D", "m=4", "--costs", str(tmp_path / "costs.json"),
                            "-o", str(tmp_path / "timed")], capture_output=True, text=True, cwd=_repo())
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.slow
def test_killed_rank_ends_all_ranks_naming_it(plans):
    plan = plans("1f1b", p=2, m=4)
    run, seconds = torchrun(plan, 2, *SMALL, "--steps", "4", "--fault-kill", "1:1", limit=90)
    assert run.returncode != 0 and "rank 1 failed first" in run.stderr  # the launcher's summary
    survivor = [line for line in run.stderr.splitlines() if "(rank 0, step 1)" in line]
    assert all("rank 1 is probably lost" in line for line in survivor)  # unless torchrun ended it first
    assert seconds < 60


@pytest.mark.slow
def test_hung_rank_times_out_naming_it(plans):
    plan = plans("1f1b", p=2, m=4)
    command = torchrun_command(plan, 2, [*SMALL, "--steps", "4", "--fault-hang", "1:1",
                                         "--timeout", "4"])
    begin = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=90)
    assert run.returncode != 0 and "rank 1" in run.stderr and "Timed out" in run.stderr
    assert time.monotonic() - begin < 60


@pytest.mark.slow
def test_watchdog_ends_a_stuck_rank(plans):
    command = [sys.executable, "-m", "schedc.runtime", str(plans("gpipe", p=1, m=2)), *SMALL,
               "--steps", "3", "--fault-hang", "0:1", "--timeout", "1"]
    run = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=60)
    assert run.returncode == 3
    assert "rank 0: no progress for 3 s while executing" in run.stderr and "(step 1)" in run.stderr


@pytest.mark.slow
def test_world_size_mismatch_refused_under_torchrun(plans):
    run, _ = torchrun(plans("1f1b", p=2, m=4), 2, *SMALL, "--dp", "2")
    assert run.returncode != 0
    assert "with --dp 2 it needs 4 processes, but 2 were started" in run.stderr
    assert "step" not in run.stdout and "Traceback" not in run.stderr


def test_plan_for_other_world_size_refused(plans, capsys):
    assert runtime_main([str(plans("1f1b", p=2, m=4)), *SMALL]) == 1
    assert "needs 2 processes, but 1 were started" in capsys.readouterr().err


def test_edited_plan_refused(plans, tmp_path, capsys):
    text = plans("gpipe", p=2, m=4).read_text().replace('"microbatches":4', '"microbatches":3', 1)
    (tmp_path / "plan.json").write_text(text)
    assert runtime_main([str(tmp_path / "plan.json"), *SMALL]) == 1
    assert "hash does not match" in capsys.readouterr().err


def test_plan_with_more_stages_than_layers_refused(plans, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")  # refused before the process group would start
    assert runtime_main([str(plans("gpipe", p=4, m=4)), *SMALL]) == 1
    assert "4 model stages but the model has 2 layers" in capsys.readouterr().err


def test_plan_with_crossed_messages_refused(plans, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    plan = load_plan(plans("gpipe", p=2, m=4))
    program = list(plan.ranks[1][0])
    first, second = (n for n, i in enumerate(program) if i.op == "RECV_F" and i.mb in (0, 1))
    program[first], program[second] = program[second], program[first]
    write_plan(replace(plan, ranks=(plan.ranks[0], (tuple(program),))), tmp_path)
    assert runtime_main([str(tmp_path / "plan.json"), *SMALL]) == 1
    assert "message #0 from rank 0 to rank 1 is sent as F0.0 but received as F0.1" in \
        capsys.readouterr().err


def test_task_without_handler_refused(plans, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    plan = split_backward_plan(plans("1f1b", p=2, m=4), tmp_path)
    assert runtime_main([str(plan), *SMALL]) == 1
    assert "task 'probe', which has no handler" in capsys.readouterr().err


def test_task_registry():
    with pytest.raises(TaskError):
        task_handler("curvature_test", ignore_missing=False)
    task_handler("curvature_test", ignore_missing=True)(None, Instr("curvature_test", 0, 0))
    seen = []
    register_task("curvature_test")(lambda executor, instr: seen.append(instr))
    task_handler("curvature_test", ignore_missing=False)(None, Instr("curvature_test", 0, 1))
    assert seen == [Instr("curvature_test", 0, 1)]


@pytest.mark.slow
def test_resume_continues_with_identical_losses(plans, tmp_path, capsys):
    plan = plans("1f1b", p=2, m=4)
    common = [*SMALL, "--steps", "5", "--quiet"]
    (tmp_path / "ckpt" / "step-plots").mkdir(parents=True)  # a user's folder beside the checkpoints: kept
    (tmp_path / "ckpt" / "step-plots" / "loss.png").write_bytes(b"mine")
    first, _ = torchrun(plan, 2, *common, "--save", str(tmp_path / "ckpt"), "--every", "2",
                        "--metrics-out", str(tmp_path / "full.jsonl"))
    assert first.returncode == 0, first.stderr
    assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["steps_done"] == 4
    # step 2's folder pruned when step 4's was written; the user's step-plots/ untouched
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["latest.json", "step-00000004", "step-plots"]
    assert (tmp_path / "ckpt" / "step-plots" / "loss.png").read_bytes() == b"mine"
    second, _ = torchrun(plan, 2, *common, "--resume", str(tmp_path / "ckpt"),
                         "--metrics-out", str(tmp_path / "resumed.jsonl"))
    assert second.returncode == 0, second.stderr
    full = [json.loads(line) for line in (tmp_path / "full.jsonl").read_text().splitlines()]
    resumed = [json.loads(line) for line in (tmp_path / "resumed.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [4]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full[4:]]
    latest = json.loads((tmp_path / "ckpt" / "latest.json").read_text())
    assert sorted(latest["files"]) == ["rank0.pt", "rank1.pt"] and not list((tmp_path / "ckpt").rglob("*.tmp"))

    # --steps at the checkpoint's 4 steps done would run nothing: refused before torchrun, saying why
    assert launch_from_cli(plan, None, [*SMALL, "--steps", "4", "--quiet", "--resume", str(tmp_path / "ckpt")]) == 2
    assert "the checkpoint has 4 steps done, and --steps 4 counts the run's steps from the first: nothing is " \
           "left to run (give --steps 5 or more to go on)" in capsys.readouterr().err
    # 64 flipped bytes, then a missing file: refused naming the file, before torchrun (schedc run) ...
    rank1 = tmp_path / "ckpt" / latest["dir"] / "rank1.pt"
    data = bytearray(rank1.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 64])
    rank1.write_bytes(bytes(data))
    assert launch_from_cli(plan, None, [*common, "--resume", str(tmp_path / "ckpt")]) == 2
    assert f"{latest['dir']}/rank1.pt is corrupt" in capsys.readouterr().err
    rank1.unlink()
    # ... and by the ranks themselves when torchrun is started by hand: rank 0 names rank 1's file
    third, _ = torchrun(plan, 2, *common, "--resume", str(tmp_path / "ckpt"))
    assert third.returncode != 0 and f"{latest['dir']}/rank1.pt is missing" in third.stderr, third.stderr
    assert "step" not in third.stdout


@pytest.mark.slow
def test_save_keeps_only_the_latest_checkpoint_as_its_help_says(plans, tmp_path):
    from schedc.runtime.process.options import build_parser
    save = next(a for a in build_parser()._actions if "--save" in a.option_strings)
    assert "Only the latest checkpoint is kept" in " ".join(save.help.split())
    plan = plans("1f1b", p=2, m=4)
    run, _ = torchrun(plan, 2, *SMALL, "--steps", "3", "--quiet", "--save", str(tmp_path / "ckpt"), "--every", "1")
    assert run.returncode == 0, run.stderr
    kept = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert kept == ["latest.json", "step-00000003"], kept  # steps 1 and 2 were saved, then replaced
    assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["steps_done"] == 3


@pytest.mark.slow
def test_a_full_disk_on_save_is_named_and_leaves_no_temporary(plans, tmp_path):
    """--save into a 64 KiB file system (a tmpfs when this process may mount one, else a file-size
    limit on the ranks): the probe before step 0 fits, the checkpoint does not."""
    target = tmp_path / "small"
    target.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(target)],
                             capture_output=True).returncode == 0
    limit = None if mounted else _file_size_limit(64 * 1024)
    try:
        command = torchrun_command(plans("1f1b", p=2, m=4), 2, [*SMALL, "--steps", "1", "--quiet",
                                                                "--save", str(target), "--timeout", "30"])
        run = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=LAUNCH_LIMIT,
                             cwd=_repo(), preexec_fn=limit)
        assert run.returncode != 0 and f"--save {target}: cannot write step-00000001/rank" in run.stderr, run.stderr
        assert not mounted or "no space left on the device" in run.stderr
        assert not list(target.rglob("*.tmp")) and not (target / "latest.json").exists()
    finally:
        if mounted:
            subprocess.run(["umount", str(target)], check=True)


def _file_size_limit(size: int):
    def limit() -> None:
        import resource
        import signal as signals
        signals.signal(signals.SIGXFSZ, signals.SIG_IGN)  # a write past the limit fails (EFBIG) instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


def test_run_reference_runs_the_reference_in_this_process(plans, reference, tmp_path, capsys):
    plan = plans("1f1b", p=2, m=4)
    assert launch_from_cli(plan, None, [*SMALL, "--reference", "--steps", "1", "--quiet",
                                        "--save-grads", str(tmp_path)]) == 0
    assert "torchrun" not in capsys.readouterr().err
    assert_same(_dump(tmp_path), reference(plan, SMALL))


@pytest.mark.parametrize("args,message", [
    (["--nproc", "0"], "--nproc must be >= 1, got 0"),
    (["--nproc", "3"], "it needs 2 processes, not --nproc 3"),
    (["--steps", "0"], "--steps and --dp must be >= 1"),
    (["--timeout", "0"], "--timeout must be a finite number of seconds > 0, got 0.0"),
    (["--timeout", "nan"], "--timeout must be a finite number of seconds > 0, got nan"),
    (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    (["--hidden", "1000000000"], "parameters (layers 4, hidden 1000000000, vocab 256); more than 1e+11"),
    (["--threads", "0"], "--threads must be between 1 and 1024"),
    (["--save", "{plan}/x"], "plan.json is not a directory"),
    (["--resume", "{tmp}/none"], "no readable checkpoint"),
    (["--reference", "--nproc", "2"], "--reference trains the whole model in this one process"),
    (["--dp", "2147483648"], "4,294,967,296 processes on this machine (the plan's 2 devices x --dp 2147483648)"),
    (["--dp", "129"], "258 processes on this machine (the plan's 2 devices x --dp 129): at most 256 are started"),
    (["--heads", "3"], "hidden size 64 is not a multiple of heads 3"),
    (["--layers", "1"], "the plan has 2 model stages but the model has 1 layers to split"),
    (["--layers", "100000"], "layers must be at most 4,096, got 100,000"),
    (["--seq", "100000"], "seq 100000, mb-size 4, 4 microbatches, --dp 1, 2 processes), more than this machine's"),
    (["--reference", "--hidden", "30000"], "(layers 4, hidden 30000, heads 4, seq 64, mb-size 4, 4 microbatches, 1 "
                                           "process), more"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--model-code", "test_tensor_parallel:build_user", "--tp", "2", "--sequence-parallel", "--layers", "2",
      "--seq", "8", "--mb-size", "2", "--synthetic"],
     "--sequence-parallel: the model's pieces 'embed', 'out' have no tensor_parallel(tp) form"),
    (["--trace-out", "{plan}"], "is the plan"),
    (["--report-out", "{tmp}/x.json", "--profile-out", "{tmp}/x.json"], "name one file: one would replace the other"),
    (["--report-out", "{tmp}"], "is a directory"),
    (["--save", "{tmp}", "--every", "5", "--steps", "2"], "--every 5 is past --steps 2: no checkpoint would be written"),
    (["--model", "mixtral-8x7b", "--seq", "64"], "a mixture of 8 experts in a model TOML file: the runtime builds"),
    (["--model", "deepseek-v3", "--seq", "64"], "a mixture of 256 experts in a model TOML file"),
    (["--model", "tests/data/hf/tiny-mixtral/config.json", "--seq", "16", "--ep", "2"],
     "--ep 2 must divide the model's 4 experts and the 1 data x context ranks"),
    (["--timeout", "0.01"], "--timeout 0.01: the ranks need 1 s or more to meet"),
    (["--tolerance", "1e-3"], "--tolerance is the bound of --compare-to-reference: give both"),
    (["--compare-to-reference", "--tolerance", "0"], "--tolerance must be a finite relative difference > 0"),
    (["--compare-to-reference", "--reference"], "--compare-to-reference compares a run's first step"),
    (["--fault-kill", "9:1"], "--fault-kill 9:1: the run has ranks 0 to 1 (the plan's devices x --dp 1)"),
    (["--fault-stop", "4:0", "--dp", "2"], "--fault-stop 4:0: the run has ranks 0 to 3 (the plan's devices x --dp 2)"),
    (["--fault-hang", "1:10", "--steps", "3"], "--fault-hang 1:10: the run's steps are 0 to 2 (--steps 3)"),
])
def test_run_refuses_each_bad_option_before_starting_torchrun(plans, tmp_path, args, message):
    from click.testing import CliRunner
    from schedc.cli import main
    plan = plans("1f1b", p=2, m=4)
    args = [a.replace("{plan}", str(plan)).replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(main, ["run", str(plan), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and "torch.distributed" not in result.output


def test_a_model_too_large_for_cpu_ranks_is_warned_of_with_its_parameter_count(plans):
    from schedc.runtime.process.launch import size_warning
    from schedc.runtime.process.options import parse_options
    plan = str(plans("1f1b", p=2, m=4))
    config = str(_repo() / "schedc" / "models" / "gpt-1.7b.toml")
    warning = size_warning(parse_options([plan, "--model", config, "--device", "cpu"]))
    assert warning.startswith("warning: the model has about 1.77e+09 parameters (layers 24, hidden 2304, "
                              f"vocab 51200, seq 2048 from --model {config}): on CPU ranks a step may take")
    assert size_warning(parse_options([plan, *SMALL, "--device", "cpu"])) is None
    assert size_warning(parse_options([plan, "--model", config, "--device", "cuda"])) is None


@pytest.mark.slow
def test_a_stopped_run_ends_its_ranks_without_a_traceback(plans):
    """SIGTERM to `schedc run` alone (not its process group, which torchrun would see itself): it is
    passed on, torchrun ends the ranks, and one line says so; the ranks are gone within seconds."""
    import signal
    command = [sys.executable, "-m", "schedc.cli", "run", str(plans("1f1b", p=2, m=4)), *SMALL, "--steps",
               "100000", "--quiet", "--threads", "1"]
    run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV, cwd=_repo())
    try:
        ranks = _wait_for_descendants(run.pid, 4, limit=120)[2:]  # schedc, torchrun's agent, two ranks
        time.sleep(2)  # into training
        run.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 128 + signal.SIGTERM, err
    assert "error: stopped by SIGTERM; the ranks were ended" in err and "Traceback" not in err, err
    assert not [pid for pid in ranks if _running(pid)] and time.monotonic() - stopped < 30


def _wait_for_descendants(root: int, count: int, limit: float) -> list[int]:
    """The process tree under root, breadth first, once it has `count` processes."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry))
        tree = [root]
        for pid in tree:
            tree += sorted(children.get(pid, []))
        if len(tree) >= count:
            return tree
        time.sleep(0.2)
    raise AssertionError(f"the run did not start {count} processes within {limit} s")


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_run_checks_each_process_against_the_address_space_limit(plans, monkeypatch):
    """Under `ulimit -v` (a cap each rank inherits) a step whose share per process passes it is refused
    before launch: with 4 GiB, mb-size 100,000 of the tiny model failed in rank 1's first backward
    (`RuntimeError: err == 0`) after torchrun started. The share: the whole step (1F1B, 2 microbatches)
    over the 2 processes, plus launch.ADDRESS_BYTES."""
    import resource
    from click.testing import CliRunner
    from schedc.cli import main
    import schedc.runtime.process.launch as launch
    monkeypatch.setattr(launch.resource, "getrlimit", lambda which: (4 * 2 ** 30, resource.RLIM_INFINITY))
    args = ["run", str(plans("1f1b", p=2, m=2)), "--layers", "4", "--hidden", "8", "--heads", "1", "--seq", "8",
            "--mb-size", "100000", "--vocab", "256", "--steps", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "of address space" in result.output and "ulimit -v" in result.output, result.output


def test_run_counts_each_process_it_would_start_against_the_memory(plans, tmp_path, monkeypatch):
    """Each rank holds torch before any model (launch.PROCESS_BYTES, 218 MiB measured); here a process
    is made to take 1 TiB, so that two of them pass any machine's memory."""
    from click.testing import CliRunner
    from schedc.cli import main
    import schedc.runtime.process.launch as launch
    monkeypatch.setattr(launch, "PROCESS_BYTES", 2 ** 40)
    result = CliRunner().invoke(main, ["run", str(plans("1f1b", p=2, m=4)), *SMALL, "--steps", "1"])
    assert result.exit_code == 2 and "--dp 1, 2 processes), more than this machine's" in result.output, result.output


def test_run_refuses_an_edited_plan_before_starting_torchrun(plans, tmp_path, capsys):
    text = plans("gpipe", p=2, m=4).read_text().replace('"microbatches":4', '"microbatches":3', 1)
    (tmp_path / "plan.json").write_text(text)
    assert launch_from_cli(tmp_path / "plan.json", None, SMALL) == 2
    assert f"error: {tmp_path / 'plan.json'}: plan hash does not match" in capsys.readouterr().err


@pytest.mark.slow
def test_a_stopped_rank_is_ended_within_the_timeout_and_named(plans):
    """SIGSTOP on rank 1: rank 0 gives up after --timeout; torchrun's SIGTERM cannot reach a stopped
    process, and it is killed a few seconds later (torchrun's own grace is 30 s), named first."""
    command = torchrun_command(plans("1f1b", p=2, m=4), 2, [*SMALL, "--steps", "4", "--quiet",
                                                            "--fault-stop", "1:1", "--timeout", "4"])
    run = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=LAUNCH_LIMIT, cwd=_repo())
    assert run.returncode != 0 and "error: rank 1 failed first; failed: rank 1 (killed by SIGKILL)" in run.stderr
    assert "receive from rank 1 failed" in run.stderr or "waiting for rank 1" in run.stderr
    term, kill = (_logged_at(run.stderr, words) for words in ("closing signal SIGTERM", "forcefully exiting via 9"))
    assert 0 <= kill - term <= 10, (term, kill)


def _logged_at(log: str, words: str) -> float:
    """The time of day, in seconds, of torchrun's first log line containing `words`."""
    import re
    line = next(line for line in log.splitlines() if words in line)
    hours, minutes, seconds = re.search(r" (\d+):(\d+):(\d+\.\d+) ", line).groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def test_launch_command_lines():
    assert split_args(["--steps", "3", "--", "--nnodes", "2"], []) == (["--steps", "3"], ["--nnodes", "2"])
    argv = ["schedc", "run", "plan.json", "--steps", "3", "--", "--nnodes", "2"]
    assert split_args(["--steps", "3", "--nnodes", "2"], argv) == (["--steps", "3"], ["--nnodes", "2"])
    assert split_args(["--steps", "3"], ["schedc"]) == (["--steps", "3"], [])
    local = torchrun_command("plan.json", 4, ["--steps", "3"])
    assert "--standalone" in local and local[-4:] == ["schedc.runtime", "plan.json", "--steps", "3"]
    multi = torchrun_command("plan.json", 4, [], ["--nnodes", "2", "--rdzv-endpoint", "h:29500"])
    assert "--standalone" not in multi and "--nnodes" in multi


def _free_port() -> int:
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _two_agents(plan: Path, options: list[str], run_id: str) -> list[subprocess.Popen]:
    """Two torchrun agents on this machine as two nodes (--nnodes 2, c10d rendezvous on 127.0.0.1),
    one process each, as `schedc run PLAN --nproc 1 ... -- <these flags>` starts them on two hosts."""
    port, agents = _free_port(), []
    for node in range(2):
        flags = ["--nnodes", "2", "--node-rank", str(node), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id]
        agents.append(subprocess.Popen(torchrun_command(plan, 1, options, flags), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=ENV, cwd=_repo(),
                                       start_new_session=True))
    return agents


def _losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_two_nodes_on_loopback_give_the_single_node_losses(plans, tmp_path):
    plan = plans("1f1b", p=2, m=4)
    common = [*SMALL, "--steps", "3", "--quiet", "--timeout", "60"]
    single, _ = torchrun(plan, 2, *common, "--metrics-out", str(tmp_path / "one.jsonl"))
    assert single.returncode == 0, single.stderr
    agents = _two_agents(plan, [*common, "--metrics-out", str(tmp_path / "two.jsonl")], "schedc-two-nodes")
    outputs = [agent.communicate(timeout=LAUNCH_LIMIT) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs
    assert _losses(tmp_path / "two.jsonl") == _losses(tmp_path / "one.jsonl")


@pytest.mark.slow
def test_a_killed_node_ends_the_other_within_the_timeout(plans, tmp_path):
    """One agent is killed during training (its worker ends with it); the other node's worker gives up
    within --timeout, naming the rank it waited for, and its agent ends."""
    import signal
    metrics, timeout = tmp_path / "metrics.jsonl", 8
    agents = _two_agents(plans("1f1b", p=2, m=4), [*SMALL, "--steps", "100000", "--quiet", "--timeout",
                                                   str(timeout), "--metrics-out", str(metrics)], "schedc-lost")
    try:
        begin = time.monotonic()
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert time.monotonic() - begin < LAUNCH_LIMIT and all(a.poll() is None for a in agents)
            time.sleep(0.2)
        os.kill(agents[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        _, err = agents[0].communicate(timeout=LAUNCH_LIMIT)
        ended = time.monotonic() - killed
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    # the survivor's worker names its lost peer, or its agent the lost rendezvous (when the killed node
    # held the rendezvous store); either way one line, no traceback
    assert agents[0].returncode == 1 and "Traceback" not in err, err
    assert "failed first" in err or "this node lost the rendezvous with the others" in err, err
    assert ended < timeout + 20, ended  # --timeout, the watchdog's grace, the agent's shutdown


def test_a_task_without_its_handler_names_the_library_module(monkeypatch):
    """A plan compiled --with kfac, run without --tasks: the error names the module that ships the
    library's handlers instead of only sending the user off to write one."""
    from schedc.runtime.execution import tasks
    monkeypatch.setattr(tasks, "TASKS", {k: v for k, v in tasks.TASKS.items() if k != "curvature_A"})
    with pytest.raises(TaskError, match=r"task 'curvature_A', which has no handler here; the library's kfac "
                                        r"add-on's handlers come with --tasks schedc.runtime.kfac"):
        task_handler("curvature_A", ignore_missing=False)


def test_the_trace_origin_is_the_earliest_reading_of_the_ranks_of_a_host(monkeypatch):
    """_shared_origin: every rank of a host takes the same time zero, the earliest of their readings
    after the barrier (their own readings set them apart); another host's readings are not mixed in."""
    from schedc.runtime.model import train
    readings = [("0", 1_000), ("0", 900), ("1", 50), ("0", 1_200)]
    monkeypatch.setattr(train.dist, "get_world_size", lambda: len(readings))
    monkeypatch.setattr(train.dist, "all_gather_object", lambda out, _: out.__setitem__(slice(None), readings))
    monkeypatch.setenv("GROUP_RANK", "0")
    assert train._shared_origin(1_000) == 900
    monkeypatch.setenv("GROUP_RANK", "1")
    assert train._shared_origin(50) == 50


def test_the_report_of_a_cluster_plan_says_its_costs_are_seconds_and_whose():
    """A plan compiled with --cluster holds a prediction in seconds for its model: the report says
    seconds, not units, and that the run trained its own model."""
    from schedc.costmodel.specs import load_cluster, load_model_spec
    from schedc.layout import Layout
    from schedc.costmodel import Setting
    from schedc.driver.cluster import compile_for
    from schedc.runtime.execution import trace as runtime_trace
    model = load_model_spec(str(_repo() / "schedc" / "models" / "gpt-1.7b.toml"))
    st = Setting(model, load_cluster("dgx-a100-80gb"), Layout(tp=1, dp=1, microbatch_size=1, global_batch=4))
    plan = compile_for("1f1b", {"p": "2"}, st).compiled.plan
    plan = replace(plan, meta={**plan.meta, "cluster": {**plan.meta["cluster"], "model": "models/gpt-1.7b.toml"}})
    events = [runtime_trace.record(rank, 0, instr, 3_000_000 * k, 3_000_000 * (k + 1), 0)
              for rank, steps in enumerate(plan.ranks) for k, instr in enumerate(steps[0])]
    text = runtime_trace.format_report(runtime_trace.report(events, plan, 2))
    assert f"simulated: makespan {plan.meta['stats']['makespan']} s = " in text and " ms/s, " in text
    assert "note: the plan's costs are the prediction for gpt-1.7b.toml on DGX A100 80GB" in text


@pytest.mark.parametrize("raised,said", [
    (RuntimeError("[/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:48861. This is typically "
                  "caused by a remote worker crashing."),
     "error: rank 0: lost its connection to another rank, which probably failed or was stopped first "
     "(Connection closed by peer [127.0.0.1]:48861)"),
    (RuntimeError("[x.cc:1] something else broke. More."),
     "error: rank 0: RuntimeError: [x.cc:1] something else broke. More. (--debug shows the traceback)"),
])
def test_a_rank_that_lost_a_peer_says_so_instead_of_glooes_words(plans, monkeypatch, capsys, raised, said):
    """A backend error outside an instruction: a lost peer (gloo's 'Connection closed by peer') is named
    as the consequence it is, so the rank that failed first stands out; any other keeps its words."""
    import schedc.runtime.__main__ as entry

    def fail(opts):
        raise raised
    monkeypatch.setattr(entry, "_run", fail)
    monkeypatch.setattr(entry, "QUIET_RANK_DELAY_S", 0.0)
    assert runtime_main([str(plans("1f1b", p=2, m=4))]) == 1
    assert said in capsys.readouterr().err


@pytest.mark.slow
def test_the_distributed_optimizer_trains_as_the_whole_one_and_resumes(plans, tmp_path, capsys):
    """--dp 2 --distributed-optimizer: each data-parallel rank keeps the optimizer state of half the
    weights and steps only those, then all-gathers them; the losses of four steps are those of the
    whole optimizer's run (AdamW is element by element), through a checkpoint after two; the
    checkpoint's state is a half; resuming it without the flag is refused before torchrun."""
    plan = plans("1f1b", p=2, m=4)
    common = [*SMALL, "--quiet", "--dp", "2"]
    out = {name: tmp_path / f"{name}.jsonl" for name in ("whole", "first", "rest")}
    run = launch_plans([(plan, [*common, "--steps", "4", "--metrics-out", str(out["whole"])]),
                        (plan, [*common, "--steps", "2", "--distributed-optimizer", "--metrics-out", str(out["first"]),
                                "--save", str(tmp_path / "ckpt")]),
                        (plan, [*common, "--steps", "4", "--distributed-optimizer", "--metrics-out", str(out["rest"]),
                                "--resume", str(tmp_path / "ckpt")])], 4, tmp_path)
    assert run.returncode == 0, run.stderr
    losses = {k: [json.loads(line)["loss"] for line in v.read_text().splitlines()] for k, v in out.items()}
    assert len(losses["whole"]) == 4 and losses["whole"][3] < losses["whole"][0]
    for got, want in zip(losses["first"] + losses["rest"], losses["whole"]):
        assert abs(got - want) <= 1e-6 * abs(want), (losses, "sharded against whole")
    latest = json.loads((tmp_path / "ckpt" / "latest.json").read_text())
    state = torch.load(tmp_path / "ckpt" / latest["dir"] / "rank0.pt", weights_only=False)
    weights = sum(t.numel() for module in state["stages"].values() for t in module.values())
    kept = [t.numel() for entry in state["optimizer"]["state"].values() for t in entry.values() if t.dim() > 0]
    assert kept and all(n == -(-weights // 2) for n in kept), (kept, weights)  # exp_avg, exp_avg_sq: half each
    assert launch_from_cli(plan, None, [*common, "--steps", "4", "--resume", str(tmp_path / "ckpt")]) == 2
    assert "the checkpoint was made with --distributed-optimizer (each rank's optimizer state a shard); give " \
           "the same to resume it" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_to_reference_prints_the_differences_and_exits_by_the_tolerance(plans, tmp_path):
    """`schedc run PLAN --compare-to-reference`: the run, then the one-process reference, then the
    relative differences per parameter group and overall; 0 within --tolerance, 1 past it (a bound
    below any float difference), the run's own dump kept where --save-grads puts it."""
    plan = plans("1f1b", p=2, m=4)
    base = [sys.executable, "-m", "schedc.cli", "run", str(plan), *SMALL, "--steps", "1", "--quiet", "--synthetic",
            "--compare-to-reference", "--timeout", "30"]
    run = subprocess.run([*base, "--save-grads", str(tmp_path / "mine")], capture_output=True, text=True,
                         env=ENV, timeout=LAUNCH_LIMIT, cwd=_repo())
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("loss") and any(line.startswith("blocks.1 ") for line in lines)
    assert "largest gradient difference" in run.stdout and lines[-1] == "within --tolerance 1.0e-05"
    assert (tmp_path / "mine" / "grads.pt").exists()
    tight = subprocess.run([*base, "--tolerance", "1e-300"], capture_output=True, text=True, env=ENV,
                           timeout=LAUNCH_LIMIT, cwd=_repo())
    assert tight.returncode == 1 and "NOT within --tolerance 1.0e-300" in tight.stdout, tight.stdout + tight.stderr
