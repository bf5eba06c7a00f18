"""DualPipe against 1F1B for a DeepSeek-V3-like run at EP 64: where the gain comes from.

DeepSeek-V3 (schedc/models/deepseek-v3.toml) on 2,048 H800s as its report trains it (section 3.2: PP 16,
EP 64 over 8 nodes, ZeRO-1 data parallelism, no tensor parallelism), b = 1, m = 32 microbatches, full
recomputation (what fits 80 GiB here), 61 layers split 4 x 13 + 3 x 3. Each schedule is one command:

    schedc simulate dualpipe|1f1b -D p=16 -D m=32 --model deepseek-v3 --cluster dgx-h800-80gb --tp 1
        --dp 128 --ep 64 --microbatch-size 1 --recompute full --distributed-optimizer --stage-layers ... --json

Printed: the step, its exposed all-to-all and what the overlapped pairs hid, then per op kind of the
critical stage the all-to-all it carries: F and B alone (exposed: 1F1B runs every op alone) and FB, the
pair (what outlasts the other half's compute). Then the same two schedules simulated on that stage's
op times for every stage (`--costs`), with the pair hiding the all-to-all and with FB = F + B (nothing
hidden): the gain with nothing hidden is what DualPipe's order alone gives; the rest is the hidden
all-to-all.

    python benchmarks/moe_dualpipe.py            # the table
    python benchmarks/moe_dualpipe.py --json     # the same as JSON
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # dualpipe_reference

P, M = 16, 32
SPLIT = ",".join(["4"] * 13 + ["3"] * 3)
RUN = ["-D", f"p={P}", "-D", f"m={M}", "--model", "deepseek-v3", "--cluster", "dgx-h800-80gb", "--tp", "1",
       "--dp", "128", "--ep", "64", "--microbatch-size", "1", "--recompute", "full", "--distributed-optimizer",
       "--stage-layers", SPLIT, "--json"]
SCHEDULES = ("1f1b", "dualpipe")
KINDS = ("F", "B", "I", "W", "FB")


def simulate(args: list[str]) -> dict:
    """`schedc simulate ARGS` as JSON (the console script of this checkout)."""
    done = subprocess.run([sys.executable, "-m", "schedc.cli", "simulate", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"schedc simulate {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout)


def cluster_rows() -> dict[str, dict]:
    return {name: simulate([name, *RUN]) for name in SCHEDULES}


def uniform_rows(op_seconds: dict, stage: int) -> dict[str, float]:
    """Both schedules' makespans on one stage's op times for every stage: as the cost model gives FB
    (the all-to-all hidden in the pair) and with FB = F + B (nothing hidden)."""
    table = {kind: op_seconds[kind][stage] for kind in KINDS}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, fb in (("hidden", table["FB"]), ("not hidden", table["F"] + table["B"])):
            for name in SCHEDULES:  # 1F1B's ops are F and B only
                path = Path(tmp) / f"{name}.json"
                costs = {**table, "FB": fb} if name == "dualpipe" else {"F": table["F"], "B": table["B"]}
                path.write_text(json.dumps(costs))
                out[f"{name}, {label}"] = simulate([name, "-D", f"p={P}", "-D", f"m={M}", "--costs", str(path),
                                                    "--json"])["makespan"]
    return out


def table_2() -> list[str]:
    """DeepSeek-V3's Table 2 on the cost model's op times of a middle stage at EP 64, no recomputation:
    the simulated bubble (the most a device idles) and activations against the formulas, with the cost
    model's own I and with I = F (B = F + W); for DualPipe also the reference's bubble, dualpipe.py's eight
    steps timed by hand (benchmarks/dualpipe_reference.py), which is the schedule's bubble either way."""
    from dualpipe_reference import timeline
    from schedc.costmodel.hardware import Setting
    from schedc.costmodel.specs import load_cluster, load_model_spec
    from schedc.costmodel.stages import stage_costs
    from schedc.driver import compile_source, read_source
    from schedc.frontend.elaborate import Options
    from schedc.frontend.library import resolve
    from schedc.layout import Layout
    layout = Layout(dp=128, ep=64, recompute="none", stage_layers=tuple(int(n) for n in SPLIT.split(",")))
    costs = stage_costs(Setting(load_model_spec("deepseek-v3"), load_cluster("dgx-h800-80gb"), layout), 16).costs()
    own = {kind: costs[kind][1] for kind in KINDS}
    lines = ["", "Table 2 on stage 1's op times, no recomputation (F {F:.4f} B {B:.4f} I {I:.4f} W {W:.4f} "
             "F&B {FB:.4f}):".format(**own),
             f"  {'':22} {'PP':>3} {'simulated':>10} {'reference':>10} {'formula':>9} {'error':>7} {'activations':>11}"]
    for label, c in (("own I", own), ("I = F", {**own, "I": own["F"], "B": own["F"] + own["W"]})):
        for pp in (8, 16):
            rows = (("1f1b", {"F": c["F"], "B": c["B"]}, (pp - 1) * (c["F"] + c["B"])),
                    ("zb_h1", {k: c[k] for k in ("F", "B", "I", "W")}, (pp - 1) * (c["F"] + c["B"] - 2 * c["W"])),
                    ("dualpipe", c, (pp // 2 - 1) * (c["FB"] + c["B"] - 3 * c["W"])))
            for name, given, formula in rows:
                done = compile_source(read_source(resolve(name)), Options({"p": str(pp), "m": str(2 * pp)}, costs=given))
                idle, held = max(done.stats["idle"]), max(done.stats["peak_memory"])
                ref = (f"{max(timeline(pp, 2 * pp, c['F'], c['B'], c['W'], c['FB'])['idle']):10.4f}"
                       if name == "dualpipe" else f"{'':10}")
                lines.append(f"  {name + ', ' + label:22} {pp:3} {idle:10.4f} {ref} {formula:9.4f} "
                             f"{100 * (idle / formula - 1):+6.1f}% {held:11g}")
    return lines + [
        "  DualPipe's formula is its bubble when a chunk's input gradient takes as long as its forward (I = F):",
        "  the table defines F, B, W and F&B and no relation between them. With I != F the reference idles as",
        "  simulated: at PP 8 the most idle rank's wait here does not depend on I (0.4893 both ways), at PP 16",
        "  it does, and neither is the formula's (PP/2-1)(I - F) more."]


def report(rows: dict[str, dict], uniform: dict[str, float], stage: int) -> str:
    lines = [f"DeepSeek-V3, dgx-h800-80gb, {P * 128} GPUs: t=1 p={P} d=128 ep=64 b=1 m={M}, recompute full, "
             "distributed optimizer", "",
             f"{'schedule':10} {'step s':>8} {'a2a exposed s':>14} {'hidden s':>9} {'bubble s':>9} {'GiB':>6}"]
    for name, row in rows.items():
        b = row["breakdown"]
        lines.append(f"{name:10} {row['iteration_s']:8.3f} {b.get('expert_parallel_comm_s', 0.0):14.3f} "
                     f"{row['overlap_hidden_s']:9.3f} {b['bubble_s']:9.3f} {row['memory_gib_per_gpu']:6.1f}")
    one, dual = rows["1f1b"]["iteration_s"], rows["dualpipe"]["iteration_s"]
    lines += [f"DualPipe over 1F1B: {100 * (one / dual - 1):+.1f}% throughput", "",
              f"all-to-all per op at stage {stage} (s): alone, and left exposed in the pair"]
    a2a, ops = rows["dualpipe"]["a2a_seconds"], rows["dualpipe"]["op_seconds"]
    for kind in KINDS:
        lines.append(f"  {kind:3} op {ops[kind][stage]:.4f}  all-to-all {a2a[kind][stage]:.4f}"
                     + ("  (exposed of F's and B's " + f"{a2a['F'][stage] + a2a['B'][stage]:.4f})" if kind == "FB" else ""))
    lines += ["", f"on stage {stage}'s op times for every stage (makespan s):"]
    lines += [f"  {label:22} {value:8.3f}" for label, value in uniform.items()]
    for label in ("hidden", "not hidden"):
        gain = uniform[f"1f1b, {label}"] / uniform[f"dualpipe, {label}"] - 1
        lines.append(f"  DualPipe over 1F1B, all-to-all {label}: {100 * gain:+.1f}%")
    return "\n".join(lines + table_2())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = cluster_rows()
    stage = 1  # a middle stage of MoE layers only (stage 0 holds the three dense layers and the embedding)
    uniform = uniform_rows(rows["dualpipe"]["op_seconds"], stage)
    if args.json:
        print(json.dumps({"cluster": rows, "uniform": uniform}, indent=1))
    else:
        print(report(rows, uniform, stage))
    return 0


if __name__ == "__main__":
    sys.exit(main())
