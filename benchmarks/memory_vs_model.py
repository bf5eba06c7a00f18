# Benchmark: the runtime's measured activation memory against the models that predict it (gloo, CPU,
# OMP_NUM_THREADS=1).
#
#   bytes      the runtime's GPT (8 layers) at 3 sizes x --recompute none/selective/full, 1F1B over 2
#              stages on 2 ranks (one rank a core here, so that the backward times below are not those of
#              ranks waiting for a core), and at t = 2 with and without sequence parallelism on 4 ranks: the
#              bytes each forward of a stage saves for its backward (--report-out's memory, measured with
#              saved-tensor hooks) next to schedc/costmodel/activations.py's table for the runtime's GPT (within 2 %);
#              and so the Llama-family decoder (--family llama: key/value heads half the heads (from 4), a
#              SwiGLU 3h wide, RMSNorm, rotary positions, untied; runtime/model/decoder.py)
#   in flight  1f1b, zb_h1, zb_h2, zbv, interleaved_1f1b on 4 ranks at the smallest size: each rank's most
#              microbatch states alive at once next to the simulator's peak (the plan's stats)
#   backward   per size, the measured mean B time with full recomputation over none, next to the cost
#              model's ratio (schedc/costmodel.py's stage costs for the same model in fp32 on the
#              dgx-a100-80gb cluster: the ratio, not the times, is what a CPU run can be held to)
#
#   zero       --zero 0, 1, 2 and 3 (resharding after each op, and not) at d = 2, 1F1B over 2 stages (4 ranks),
#              the runtime's GPT and decoder in fp32 with AdamW: each rank's measured state by term (the
#              report's state_bytes: weights, gathered stage, gradients, optimizer state) next to the cost
#              model's (schedc/costmodel/state_terms.py for the same model and layout), equal to the byte,
#              and the total with the activations (the measured peak of saved bytes, predicted as the
#              simulated microbatches in flight x the table's bytes of one) within 2 %
#
#   python benchmarks/memory_vs_model.py --quick      # about 8 minutes on 2 CPU cores
#   python benchmarks/memory_vs_model.py --quick --family llama   # the decoder's bytes alone
#   python benchmarks/memory_vs_model.py --zero       # about 4 minutes: the ZeRO levels' bytes alone
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from schedc.costmodel.activations import RUNTIME_GPT, Sizes, runtime_decoder, stage_bytes  # noqa: E402

RANKS, SIZED_RANKS, LAYERS, VOCAB = 4, 2, 8, 256
SIZES = {"small": {"hidden": 32, "heads": 2, "seq": 16, "mb_size": 2},
         "medium": {"hidden": 128, "heads": 4, "seq": 64, "mb_size": 2},
         "large": {"hidden": 256, "heads": 8, "seq": 128, "mb_size": 4}}
MODES = ("none", "selective", "full")
TENSOR = {"t=1": [], "t=2": ["--tp", "2"], "t=2 SP": ["--tp", "2", "--sequence-parallel"]}
IN_FLIGHT = [("1f1b", {"p": 4, "m": 8}), ("zb_h1", {"p": 4, "m": 6}), ("zb_h2", {"p": 4, "m": 8}),
             ("zbv", {"p": 4, "m": 6}), ("interleaved_1f1b", {"p": 4, "v": 2, "m": 8})]
WITHIN = 0.02
# the decoder's facts (a model TOML the runtime reads) beside the sizes; kv heads and ffn from the size
LLAMA = {"family": "llama", "mlp": "swiglu", "norm": "rmsnorm", "positions": "rope", "bias": "none",
         "tied_embeddings": False}


def kv_heads(size: dict) -> int:
    """The decoder's key/value heads at this size: half the heads, where t = 2 still divides them."""
    return size["heads"] // 2 if size["heads"] >= 4 else size["heads"]


def llama_description(size: dict, root: Path) -> list[str]:
    """--model of a TOML file stating the decoder's facts at this size: kv_heads(size), a SwiGLU 3h wide."""
    path = root / f"llama_{size['hidden']}.toml"
    facts = {**LLAMA, "kv_heads": kv_heads(size), "ffn": 3 * size["hidden"]}
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in facts.items()))
    return ["--model", str(path)]


def table_sizes(size: dict, family: str) -> tuple[Sizes, object]:
    """The table's Sizes and Facts of the runtime's model of `family` at this size."""
    if family == "gpt":
        return Sizes(size["seq"], size["mb_size"], size["hidden"], size["heads"], 4 * size["hidden"], VOCAB), RUNTIME_GPT
    return (Sizes(size["seq"], size["mb_size"], size["hidden"], size["heads"], 3 * size["hidden"], VOCAB,
                  kv_heads(size)), runtime_decoder(LLAMA["mlp"], LLAMA["norm"], LLAMA["positions"]))


def compile_plan(name: str, params: dict, out: Path) -> Path:
    defines = [arg for k, v in params.items() for arg in ("-D", f"{k}={v}")]
    subprocess.run([sys.executable, "-m", "schedc.cli", "compile", f"schedc/schedules/{name}.sched", *defines,
                    "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    return out / "plan.json"


def model_flags(size: dict) -> list[str]:
    return ["--layers", str(LAYERS), "--vocab", str(VOCAB), "--hidden", str(size["hidden"]), "--heads",
            str(size["heads"]), "--seq", str(size["seq"]), "--microbatch-size", str(size["mb_size"])]


def run(plan: Path, ranks: int, flags: list[str], report: Path) -> dict:
    """One torchrun launch of the plan; its --report-out."""
    from schedc.runtime.process.launch import torchrun_command
    command = torchrun_command(plan, ranks, [*flags, "--synthetic", "--quiet", "--report-out", str(report)])
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        sys.exit(f"run failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    return json.loads(report.read_text())


def cost_model_ratio(size: dict) -> list[float]:
    """Per stage, the cost model's B with full recomputation over B without, for this GPT in fp32."""
    from schedc.costmodel.specs import ModelSpec, load_cluster
    from schedc.costmodel import Setting, stage_costs
    from schedc.layout import Layout
    model = ModelSpec(LAYERS, size["hidden"], size["heads"], size["seq"], VOCAB, 4 * size["hidden"], "fp32")
    b = {mode: stage_costs(Setting(model, load_cluster("dgx-a100-80gb"),
                                   Layout(microbatch_size=size["mb_size"], recompute=mode)), SIZED_RANKS).costs()["B"]
         for mode in ("none", "full")}
    return [f / n for f, n in zip(b["full"], b["none"])]


def bytes_table(reports: dict) -> bool:
    print(f"saved bytes per microbatch and stage, measured vs schedc/costmodel/activations.py (1f1b, {SIZED_RANKS} stages "
          f"of {LAYERS // SIZED_RANKS} layers)")
    print(f"{'family':>6} {'size':>7} {'tensor':>7} {'recompute':>9} {'stage':>5} {'measured':>10} {'predicted':>10} "
          f"{'off':>7}")
    ok, worst = True, 0.0
    for (family, name, tensor, mode), rep in reports.items():
        sizes, facts = table_sizes(SIZES[name], family)
        tp, sp = (2 if "--tp" in TENSOR[tensor] else 1), "--sequence-parallel" in TENSOR[tensor]
        for s, entry in rep["memory"]["stages"].items():
            want = stage_bytes(sizes, facts, LAYERS // SIZED_RANKS, s == "0", s == str(SIZED_RANKS - 1),
                               tp, sp, mode)
            got = entry["saved_bytes_per_microbatch"]
            off = (got - want) / want
            ok &= abs(off) <= WITHIN
            worst = max(worst, abs(off))
            print(f"{family:>6} {name:>7} {tensor:>7} {mode:>9} {s:>5} {got:>10} {want:>10.0f} {off:>+7.2%}")
    print(f"{len(reports)} runs, {2 * len(reports)} stages: largest difference {worst:.2%}")
    return ok


def in_flight_table(reports: dict, plans: dict) -> bool:
    print("\npeak microbatches in flight per rank (per stage), measured vs simulated")
    ok = True
    for name, rep in reports.items():
        from schedc.plan import load_plan
        simulated = load_plan(plans[name]).meta["stats"]["peak_memory"]
        measured = [r["peak_states_on_rank"] for r in rep["memory"]["ranks"]]
        stages = [r["peak_microbatches_in_flight"] for r in rep["memory"]["ranks"]]
        ok &= measured == simulated
        print(f"{name:>17}: measured {measured} simulated {[int(v) for v in simulated]}  per stage {stages}")
    return ok


def backward_table(reports: dict) -> None:
    print("\nmean B time per stage, full recomputation over none: measured vs cost model")
    for name in SIZES:
        none, full = (reports[("gpt", name, "t=1", mode)]["mean_ms"]["B"] for mode in ("none", "full"))
        measured = [f / n for f, n in zip(full, none)]
        model = cost_model_ratio(SIZES[name])
        print(f"{name:>7}: B none {[round(v, 2) for v in none]} ms, full {[round(v, 2) for v in full]} ms; "
              f"ratio measured {[round(v, 2) for v in measured]} cost model {[round(v, 2) for v in model]}")


ZERO = {"0": [], "1": ["--zero", "1"], "2": ["--zero", "2"], "3": ["--zero", "3"],
        "3 kept": ["--zero", "3", "--no-reshard-after-forward"]}
ZERO_PLAN = {"p": SIZED_RANKS, "m": 4}  # 1F1B over two stages, one a rank: d = 2 makes four ranks
ZERO_TERMS = ("weights", "gathered", "gradients", "optimizer_state")


def zero_flags(family: str, level: str, root: Path) -> list[str]:
    """The runtime's options of one --zero run at the small size (two AdamW steps)."""
    size = SIZES["small"]
    described = llama_description(size, root) if family == "llama" else []
    return [*described, *model_flags(size), "--dp", "2", *ZERO[level], "--steps", "2", "--optimizer", "adamw"]


def zero_layout(level: str):
    from schedc.layout import Layout
    return Layout(dp=2, microbatch_size=SIZES["small"]["mb_size"], zero=int(level[0]),
                  reshard_after_forward=level != "3 kept")


def runtime_spec(family: str):
    """The cost model's description of the runtime's model at the small size, in fp32."""
    from schedc.costmodel.specs import ModelSpec
    size = SIZES["small"]
    facts = {**LLAMA, "kv_heads": kv_heads(size), "ffn": 3 * size["hidden"]} if family == "llama" else \
        {"ffn": 4 * size["hidden"], "tied_embeddings": False}
    return ModelSpec(LAYERS, size["hidden"], size["heads"], size["seq"], VOCAB, dtype="fp32", **facts)


def predicted_state(family: str, level: str, plan: Path) -> list[dict]:
    """Per plan rank, the cost model's state terms (state_terms) and activations: the simulated peak of
    microbatches in flight x the table's bytes of one microbatch of that rank's stage."""
    from schedc.costmodel.state_terms import state_terms
    from schedc.driver import compile_file
    from schedc.plan import load_plan
    schedule = compile_file(str(REPO / "schedc/schedules/1f1b.sched"),
                            [f"{k}={v}" for k, v in ZERO_PLAN.items()]).schedule
    terms = state_terms(runtime_spec(family), zero_layout(level), schedule)
    sizes, facts = table_sizes(SIZES["small"], family)
    flights = load_plan(plan).meta["stats"]["peak_memory"]
    last = SIZED_RANKS - 1
    return [{**terms[r], "activations": flights[r] * stage_bytes(sizes, facts, LAYERS // SIZED_RANKS, r == 0, r == last)}
            for r in range(SIZED_RANKS)]


def measured_state(rank: dict) -> dict:
    """A rank's measured terms: the report's state_bytes and its peak of saved activation bytes."""
    return {**rank["state_bytes"], "activations": rank["peak_saved_bytes"]}


def zero_rows(family: str, level: str, report: dict, predicted: list[dict]) -> list[tuple]:
    """(rank, plan rank, term, measured, predicted) for every rank and term, the total last (the step
    counters measured, unpredicted, counted in the measured total)."""
    rows = []
    for r, rank in enumerate(report["memory"]["ranks"]):
        got, want = measured_state(rank), predicted[rank["plan_rank"]]
        for term in (*ZERO_TERMS, "activations"):
            rows.append((r, rank["plan_rank"], term, got[term], want[term]))
        rows.append((r, rank["plan_rank"], "step_counters", got["step_counters"], 0))
        rows.append((r, rank["plan_rank"], "total", sum(got[t] for t in (*ZERO_TERMS, "activations", "step_counters")),
                     sum(want[t] for t in (*ZERO_TERMS, "activations"))))
    return rows


def zero_ok(rows: list[tuple]) -> bool:
    """State terms equal to the byte; activations and the total within WITHIN."""
    for _, _, term, got, want in rows:
        if term in ZERO_TERMS and got != want:
            return False
        if term in ("activations", "total") and abs(got - want) > WITHIN * want:
            return False
    return True


def zero_table(results: dict) -> bool:
    print(f"\nstate bytes per rank by term at d = 2, measured vs schedc/costmodel/state_terms.py (1f1b over "
          f"{SIZED_RANKS} stages, fp32, AdamW; activations: simulated in flight x the table)")
    print(f"{'family':>6} {'zero':>6} {'rank':>4} {'term':>15} {'measured':>10} {'predicted':>10} {'off':>8}")
    ok = True
    for (family, level), rows in results.items():
        ok &= zero_ok(rows)
        for r, _, term, got, want in rows:
            off = f"{(got - want) / want:+.2%}" if want else "-"
            print(f"{family:>6} {level:>6} {r:>4} {term:>15} {got:>10} {want:>10.0f} {off:>8}")
    return ok


def zero_main(families: tuple[str, ...]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plan = compile_plan("1f1b", ZERO_PLAN, root / "1f1b_zero")
        results = {}
        for family in families:
            for level in ZERO:
                report = run(plan, 2 * SIZED_RANKS, zero_flags(family, level, root),
                             root / f"{family}_zero_{level.replace(' ', '_')}.json")
                results[(family, level)] = zero_rows(family, level, report, predicted_state(family, level, plan))
        ok = zero_table(results)
    print(f"\nstate terms equal to the byte, activations and totals within {WITHIN:.0%}: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="measured activation memory vs the models")
    parser.add_argument("--quick", action="store_true", help="fewer steps for the backward times")
    parser.add_argument("--steps", type=int, help="steps per run (default 12, quick 5)")
    parser.add_argument("--family", choices=("all", "gpt", "llama"), default="all",
                        help="the runtime's models whose bytes are measured (llama: the bytes alone)")
    parser.add_argument("--zero", action="store_true", help="the ZeRO levels' state bytes by term alone")
    args = parser.parse_args(argv)
    families = ("gpt", "llama") if args.family == "all" else (args.family,)
    if args.zero:
        return zero_main(families)
    steps = args.steps or (5 if args.quick else 12)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        one_f = compile_plan("1f1b", {"p": SIZED_RANKS, "m": 4}, root / "1f1b_bytes")
        described = {"gpt": lambda size: [], "llama": lambda size: llama_description(size, root)}
        sized = {(family, name, tensor, mode): run(one_f, SIZED_RANKS * (2 if flags else 1),
                                                   [*described[family](size), *model_flags(size), *flags, "--steps",
                                                    str(steps if not flags and family == "gpt" else 1), "--recompute",
                                                    mode], root / f"{family}_{name}_{len(flags)}_{mode}.json")
                 for family in families for name, size in SIZES.items() for tensor, flags in TENSOR.items()
                 for mode in MODES}
        plans = {name: compile_plan(name, params, root / name) for name, params in IN_FLIGHT} if "gpt" in families else {}
        flights = {name: run(plans[name], RANKS, [*model_flags(SIZES["small"]), "--steps", "2"], root / f"{name}.json")
                   for name in plans}
        bytes_ok = bytes_table(sized)
        flight_ok = in_flight_table(flights, plans) if flights else True
        if "gpt" in families:
            backward_table(sized)
    print(f"\nbytes within {WITHIN:.0%}: {'yes' if bytes_ok else 'NO'}; in-flight peaks as simulated: "
          f"{'yes' if flight_ok else 'NO'}")
    return 0 if bytes_ok and flight_ok else 1


if __name__ == "__main__":
    sys.exit(main())
