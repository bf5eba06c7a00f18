# Tests of the runtime's mixture of experts (schedc/runtime/model/experts.py) and its expert parallelism:
# the sparse block against a per-token construction from straight torch ops (outputs and every gradient),
# the Hugging Face names of a tiny Mixtral's layer, the plan's declared ALL_TO_ALLs as the executor's
# check reads them and its refusal of an op whose exchanges differ, what `schedc run` refuses before
# launch; and under torchrun, tiny-mixtral (4 experts, top-2) with --ep 2 against the one-process
# reference (loss of 2 AdamW steps and the first step's gradients, rel <= 1e-5): 1F1B, ZB-H1 and
# DualPipeV at p = 2, d = 2, and with t = 2 (p = 1, d = 2; and p = 2 with the experts cut over t alone).
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from schedc.plan import Instr, load_plan
from schedc.runtime.execution.exchanges import ExchangeError, check_exchanges, declared
from schedc.runtime.model.experts import Issued, sparse_block
from schedc.runtime.model.gpt import ModelConfig, build_model
from test_runtime import _dump, _repo, launch_plans, plans  # noqa: F401 (fixture)
from test_runtime_training import TOLERANCE, _errors, _losses, _reference

MIXTRAL = str(Path(__file__).resolve().parent / "data/hf/tiny-mixtral/config.json")
MODEL = ["--model", MIXTRAL, "--seq", "16", "--mb-size", "2"]
TINY = ModelConfig(layers=2, hidden=8, heads=2, seq=4, vocab=32, mb_size=2, kv_heads=1, ffn=12, mlp="swiglu",
                   norm="rmsnorm", positions="rope", bias="none", family="mixtral", experts=4, top_k=2, moe_ffn=6)


@pytest.fixture(scope="module")
def ep_plans(tmp_path_factory):
    """ep_plans(schedule, **params) -> a plan compiled for tiny-mixtral with --ep 2 and --dp 2 (its
    ALL_TO_ALLs declared), once per module."""
    root, cache = tmp_path_factory.mktemp("ep_plans"), {}

    def compile_plan(schedule: str, **params) -> Path:
        key = (schedule, tuple(sorted(params.items())))
        if key not in cache:
            out = root / "_".join([schedule, *(f"{k}{v}" for k, v in key[1])])
            defines = [arg for k, v in key[1] for arg in ("-D", f"{k}={v}")]
            run = subprocess.run([sys.executable, "-m", "schedc.cli", "compile", f"schedc/schedules/{schedule}.sched",
                                  *defines, "--cluster", "dgx-h100-80gb", "--model", MIXTRAL, "--seq", "16", "--ep", "2",
                                  "--dp", "2", "--microbatch-size", "2", "--recompute", "none", "-o", str(out)],
                                 capture_output=True, text=True, cwd=_repo())
            assert run.returncode == 0, run.stdout + run.stderr
            cache[key] = out / "plan.json"
        return cache[key]
    return compile_plan


def _per_token(x: torch.Tensor, gate: torch.Tensor, experts: list[tuple[torch.Tensor, ...]], top_k: int) -> torch.Tensor:
    """Mixtral's block one token at a time: softmax over the experts, the top_k largest (Python's sort)
    renormalised, each expert a SwiGLU from its three matrices."""
    rows = []
    for token in x:
        probs = torch.softmax(gate @ token, dim=0)
        best = sorted(range(len(experts)), key=lambda e: -probs[e].item())[:top_k]
        total = sum(probs[e] for e in best)
        rows.append(sum(probs[e] / total * (w2 @ (F.silu(w1 @ token) * (w3 @ token))) for e in best
                        for w1, w2, w3 in [experts[e]]))
    return torch.stack(rows)


def test_the_sparse_block_is_the_per_token_mixture():
    """Outputs and the gradients of the input, the router and every expert equal the per-token
    construction's (float64, 12 tokens, 4 experts, top-2; the gradients to fp32's rounding)."""
    torch.manual_seed(0)
    block = sparse_block(TINY).double()
    for param in block.parameters():
        torch.nn.init.normal_(param, std=0.5)
    x = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 6, 8, dtype=torch.float64)
    experts = [(block.experts[str(e)].w1.weight, block.experts[str(e)].w2.weight, block.experts[str(e)].w3.weight)
               for e in range(4)]
    params = [x, block.gate.weight, *[w for triple in experts for w in triple]]
    got = block(x)
    want = _per_token(x.reshape(-1, 8), block.gate.weight, experts, 2).view(2, 6, 8)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(torch.autograd.grad((got * weight).sum(), params), torch.autograd.grad((want * weight).sum(), params)):
        assert ((g - w).norm() / w.norm()).item() <= 1e-6  # the fused SwiGLU's backward runs in fp32 (decoder.py)


def test_a_mixtral_layer_has_hugging_face_names():
    pieces = build_model(TINY)
    names = [name for name, _ in pieces[1][1].named_parameters()]
    assert names[-13:] == ["block_sparse_moe.gate.weight", *[f"block_sparse_moe.experts.{e}.{w}.weight"
                                                             for e in range(4) for w in ("w1", "w2", "w3")]]


def test_the_plan_declares_two_exchanges_after_each_forward_and_input_gradient(ep_plans):
    """ZB-H1 at p = 2, m = 4: F and I of every (stage, microbatch) are followed by two ALL_TO_ALLs, W by
    none; DualPipeV's overlapped pairs by two for each half."""
    for rank, steps in enumerate(load_plan(ep_plans("zb_h1", p=2, m=4)).ranks):
        table = declared(list(steps[0]))
        assert {key: n for key, n in table.items()} == {(op, rank, mb): 2 for op in ("F", "I") for mb in range(4)}
    table = declared(list(load_plan(ep_plans("dualpipev", p=2, m=4)).ranks[0][0]))
    assert set(table.values()) == {2} and {op for op, _, _ in table} == {"F", "B", "I"}


class _Fake:
    """What check_exchanges reads of an executor; W issues an exchange that the plan does not declare."""

    def __init__(self, plan):
        self.plan, self.step_no = plan, 0
        self.world = type("W", (), {"plan_rank": 0})()
        self.table = {op: self.issue(2 if op != "W" else 1) for op in ("F", "I", "W")}
        self.programs = [[(self.table.get(i.op, lambda _: None), i, None) for i in program]
                         for program in plan.ranks[0]]

    @staticmethod
    def issue(count: int):
        def run(_instr: Instr) -> None:
            Issued.count += count
        return run


def test_an_op_whose_exchanges_differ_from_the_plan_is_named(ep_plans):
    fake = _Fake(load_plan(ep_plans("zb_h1", p=2, m=4)))
    check_exchanges(fake)
    fake.table["F"](Instr("F", 0, 1))  # two exchanges, two declared
    with pytest.raises(ExchangeError, match="W of stage 0, microbatch 1 issued 1 expert all-to-all"):
        fake.table["W"](Instr("W", 0, 1))


@pytest.mark.parametrize("args,message", [
    (["--ep", "3", "--dp", "2"], "--ep 3 must divide the model's 4 experts and the 2 data x context ranks"),
    (["--ep", "2", "--dp", "2", "--zero", "1"], "--ep 2 does not compose with --zero yet"),
    (["--ep", "2", "--dp", "2", "--clip-grad", "1"], "--ep 2 does not compose with --clip-grad yet"),
])
def test_run_refuses_what_expert_parallelism_does_not_do_before_launch(ep_plans, args, message):
    from click.testing import CliRunner
    from schedc.cli import main
    result = CliRunner().invoke(main, ["run", str(ep_plans("1f1b", p=2, m=4)), *MODEL, *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_run_refuses_a_plan_and_an_ep_that_disagree(plans, ep_plans):  # noqa: F811
    from click.testing import CliRunner
    from schedc.cli import main
    plain = CliRunner().invoke(main, ["run", str(plans("1f1b", p=2, m=4)), *MODEL, "--ep", "2", "--dp", "2"])
    assert plain.exit_code == 2 and "--ep 2: the plan declares no ALL_TO_ALL" in plain.output, plain.output
    declaring = CliRunner().invoke(main, ["run", str(ep_plans("1f1b", p=2, m=4)), *MODEL, "--dp", "2"])
    assert declaring.exit_code == 2 and "run it with the same --ep" in declaring.output, declaring.output
    dense = CliRunner().invoke(main, ["run", str(ep_plans("1f1b", p=2, m=4)), "--ep", "2", "--dp", "2"])
    assert dense.exit_code == 2 and "the model has no experts to split" in dense.output, dense.output


def test_run_refuses_a_mixture_it_does_not_build_by_name(plans, tmp_path):  # noqa: F811
    from click.testing import CliRunner
    from schedc.cli import main
    config = json.loads(Path(MIXTRAL).read_text())
    qwen = {**config, "model_type": "qwen2_moe", "num_experts": 4, "moe_intermediate_size": 96,
            "shared_expert_intermediate_size": 96}
    (tmp_path / "config.json").write_text(json.dumps(qwen))
    result = CliRunner().invoke(main, ["run", str(plans("1f1b", p=2, m=4)), "--model", str(tmp_path / "config.json"),
                                       "--seq", "16"])
    assert result.exit_code == 2 and "the qwen2_moe family's router" in result.output, result.output


def _against_reference(jobs: dict, nproc: int, tmp_path: Path) -> None:
    """Each job (plan, layout options) run for 2 AdamW steps in one launch; its losses and first-step
    gradients against the one-process reference of the same global batch; its report's tokens per
    expert per step, in each of the 4 layers, the global batch's 4 x 2 x 2 x 16 tokens times top-2."""
    runs = [(plan, [*MODEL, *options, "--steps", "2", "--quiet", "--save-grads", str(tmp_path / name),
                    "--metrics-out", str(tmp_path / name / "metrics.jsonl"), "--report-out", str(tmp_path / f"{name}.json")])
            for name, (plan, options) in jobs.items()]
    run = launch_plans(runs, nproc, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    for name, (plan, options) in jobs.items():
        dp = int(options[options.index("--dp") + 1]) if "--dp" in options else 1
        want, want_losses = _reference(tmp_path, name, plan, [*MODEL, "--steps", "2"], dp)
        loss, grads = _errors(_dump(tmp_path / name), want)
        assert loss <= TOLERANCE and grads <= TOLERANCE, (name, loss, grads)
        assert _losses(tmp_path / name / "metrics.jsonl") == pytest.approx(want_losses, rel=TOLERANCE), name
        routed = json.loads((tmp_path / f"{name}.json").read_text())["tokens_per_expert_per_step"]
        assert list(routed) == [f"model.layers.{i}.block_sparse_moe" for i in range(4)], name
        assert all(len(counts) == 4 and sum(counts) == 4 * dp * 2 * 16 * 2 for counts in routed.values()), (name, routed)


@pytest.mark.slow
def test_expert_parallel_runs_give_the_reference(ep_plans, tmp_path):
    """One 4-rank launch, p = 2, d = 2, ep = 2: 1F1B, ZB-H1 (the experts' weight gradients in W, the
    exchanges' gradients in I), both with whole layers recomputed too (the replay's exchanges in B or
    I), and DualPipeV's F&B pairs."""
    layout = ["--dp", "2", "--ep", "2"]
    jobs = {"1f1b": (ep_plans("1f1b", p=2, m=4), layout),
            "1f1b_full": (ep_plans("1f1b", p=2, m=4), [*layout, "--recompute", "full"]),
            "zb_h1": (ep_plans("zb_h1", p=2, m=4), layout),
            "zb_h1_full": (ep_plans("zb_h1", p=2, m=4), [*layout, "--recompute", "full"]),
            "dualpipev": (ep_plans("dualpipev", p=2, m=4), layout)}
    _against_reference(jobs, 4, tmp_path)


@pytest.mark.slow
def test_expert_parallel_runs_with_tensor_parallel_experts_give_the_reference(plans, ep_plans, tmp_path):  # noqa: F811
    """One 4-rank launch with t = 2 (the experts' w1/w3 column-, w2 row-parallel): 1F1B and ZB-H1 at
    p = 1, d = 2, ep = 2, and ZB-H1 at p = 2 with the experts over the tensor ranks alone (ep = 1)."""
    jobs = {"t2_1f1b": (ep_plans("1f1b", p=1, m=4), ["--tp", "2", "--dp", "2", "--ep", "2"]),
            "t2_zb_h1": (ep_plans("zb_h1", p=1, m=4), ["--tp", "2", "--dp", "2", "--ep", "2"]),
            "t2_p2_zb_h1": (plans("zb_h1", p=2, m=4), ["--tp", "2"])}
    _against_reference(jobs, 4, tmp_path)
