"""Published measurements next to schedc's predictions: every row of benchmarks/data/published.toml
(Megatron-LM's examples/llama README, Megatron-Bridge's performance summary, torchtitan's December 2024
H100 benchmarks, the Llama 3 paper's 405B runs) run through `schedc simulate --cluster ... --json` with
the row's own layout, and the error of each published figure (tokens/s/GPU, TFLOP/s/GPU, memory GiB).

Each row becomes one command:

    schedc simulate 1f1b|interleaved_1f1b -D p=PP [-D v=VP] --model MODEL --seq SEQ --cluster CLUSTER
        --tp TP --dp DP --microbatch-size MBS --global-batch GBS [--cp CP] [--ep EP [--etp ETP]
        [--moe-dispatcher alltoall|flex]] [--zero 3
        [--reshard-after-forward|--no-reshard-after-forward]] [--distributed-optimizer] [--fp8]
        [--recompute R] [--sequence-parallel] [--tp-comm-overlap] [--overlap-param-gather]
        [--overlap-grad-reduce] [--eager] [--account-for-embedding --account-for-loss] [--stage-layers N,...] --json

A row whose recipe overlaps the MoE all-to-all (moe_a2a_overlap) runs as combined_1f1b, Megatron-Core's
combined 1F1B, with the row's v.

A cluster named as a file (torchtitan's 96 GB machine) is read from benchmarks/data/.

A row the installed schedc cannot take yet (an option, a model or a cluster it does not know) is printed
as "not yet predictable: <what> missing", read from schedc's own refusal, so the table fills in as the
features land; a row whose source leaves a needed value unstated says which. Rows marked * use a value
their source leaves unstated but their own code fixes by default ([row.assumed] in the data file).

Where the attention's figures come from (no constant here is fitted to a row): a cluster file's
[attention] table (schedc/costmodel/kernels.py) gives the flash kernel's achieved TFLOP/s by length;
benchmarks/data/h100-96gb-grand-teton.toml carries FlashAttention-2's H100 SXM5 head-dim-128 bars of
the FlashAttention-3 paper (Shah et al. 2024, Figures 5 and 6; torch's SDPA flash backend in the
torch of these runs, cuDNN being opt-in then: pytorch#138522, pytorch#142132), torch's ring of late
2024 (torch/distributed/tensor/experimental/_attention.py: load-balanced chunks, K/V all-gathered
once, fp32 merges and gradient all-to-all; torchtitan 9dec370's 'allgather' default) and torchtitan's
repeat_kv before SDPA (its models/llama/model.py). The merge and accumulation bytes per value
(costmodel/attention.py: 38, 10, 26, 4; 6 for Transformer Engine's fused correction) are counted from
those sources' code. The library's dgx-h100-80gb has no [attention] table yet, so the Megatron rows
charge attention as before (a GEMM at the cluster's efficiency).

    python benchmarks/published_rows.py                  # every row, then mean and max error per group
    python benchmarks/published_rows.py --group dense    # dense | cp | moe
    python benchmarks/published_rows.py --json           # the same as JSON
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "published.toml"
GROUPS = ("dense", "cp", "moe")
UNSTATED = "unstated"
# published figure -> how the prediction is read from `schedc simulate --json`
METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "memory_gib")
UNITS = {"tokens_per_s_per_gpu": "tok/s/GPU", "tflops_per_gpu": "TFLOP/s/GPU", "memory_gib": "GiB"}
# a flag of the command -> the row field that switches it on (True in the data file)
SWITCHES = {"--sequence-parallel": "sequence_parallel", "--tp-comm-overlap": "tp_comm_overlap",
            "--overlap-param-gather": "overlap_param_gather", "--overlap-grad-reduce": "overlap_grad_reduce",
            "--eager": "eager",  # torchtitan without torch.compile
            "--fp8-current-scaling": "fp8_current_scaling"}  # Megatron-Bridge's FP8-CS recipes


class NotPredictable(Exception):
    """A row schedc cannot predict: its reason ("--cp missing", "microbatch not published")."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """One published figure of one row against its prediction."""

    row: str
    group: str
    metric: str
    measured: float
    predicted: float
    assumed: bool

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.measured) / self.measured


def load(path: Path = DATA) -> dict:
    """The data file: {"row": [...], "formula": [...]}."""
    with open(path, "rb") as f:
        return tomllib.load(f)


def value(row: dict, key: str) -> tuple[object, bool]:
    """The row's stated value of key, or its assumed one (then True); NotPredictable when neither."""
    stated = row.get(key, UNSTATED)
    if stated != UNSTATED:
        return stated, False
    if key in row.get("assumed", {}):
        return row["assumed"][key], True
    raise NotPredictable(f"{key} not published")


def command(row: dict) -> tuple[list[str], bool]:
    """The `schedc simulate` arguments of a row and whether they use an assumed value."""
    used = {key: value(row, key) for key in ("pp", "tp", "dp", "cp", "ep", "seq", "microbatch", "global_batch")}
    if row["schedule"] == "interleaved_1f1b":
        used["vp"] = value(row, "vp")
    get = {key: v for key, (v, _) in used.items()}
    args = [schedule(row), "-D", f"p={get['pp']}"] + (["-D", f"v={get['vp']}"] if "vp" in get else [])
    cluster = str(HERE / "data" / row["cluster"]) if row["cluster"].endswith(".toml") else row["cluster"]
    args += ["--model", row["model"], "--seq", str(get["seq"]), "--cluster", cluster, "--tp", str(get["tp"]),
             "--dp", str(get["dp"]), "--microbatch-size", str(get["microbatch"]),
             "--global-batch", str(get["global_batch"])]
    args += (["--cp", str(get["cp"])] if get["cp"] > 1 else []) + (["--ep", str(get["ep"])] if get["ep"] > 1 else [])
    args += sharding_args(row) + expert_args(row)
    if value(row, "precision")[0] == "fp8":
        args.append("--fp8")
    recompute = value(row, "recompute")[0]  # stated: schedc's default (full) is no publisher's statement
    if recompute not in ("none", "selective", "full", "selective-ops"):  # the last: torchtitan's per-op policy
        raise NotPredictable(f"recompute '{recompute}' has no schedc form")
    args += ["--recompute", recompute]
    args += [flag for flag, key in SWITCHES.items() if row.get(key) is True]
    args += [f"--account-for-{part}" for part in row.get("account_for", [])]
    if row.get("stage_layers", "n/a") != "n/a":
        used["stage_layers"] = value(row, "stage_layers")
        args += ["--stage-layers", str(used["stage_layers"][0])]
    return args + ["--json"], any(assumed for _, assumed in used.values())


def schedule(row: dict) -> str:
    """The schedule a row runs: its own, or Megatron-Core's combined 1F1B where its recipe overlaps the MoE
    all-to-all (moe_a2a_overlap: --overlap-moe-expert-parallel-comm --delay-wgrad-compute)."""
    return "combined_1f1b" if row.get("moe_a2a_overlap") is True else row["schedule"]


def expert_args(row: dict) -> list[str]:
    """A row's expert options as its recipe sets them: the expert tensor-parallel size where stated (MoE
    parallel folding) and the token dispatcher where named."""
    args = []
    if isinstance(row.get("ep"), int) and row["ep"] > 1 and isinstance(row.get("etp"), int):
        args += ["--etp", str(row["etp"])]
    if row.get("moe_dispatcher"):
        args += ["--moe-dispatcher", row["moe_dispatcher"]]
    return args


def sharding_args(row: dict) -> list[str]:
    """The data-parallel sharding options of a row: ZeRO-1 by its long-standing name, level 3 with its
    resharding as stated."""
    zero = row.get("zero")
    if zero == 1:
        return ["--distributed-optimizer"]
    if zero in (2, 3):
        reshard = row.get("reshard")
        return ["--zero", str(zero)] + {True: ["--reshard-after-forward"],
                                        False: ["--no-reshard-after-forward"]}.get(reshard, [])
    return []


def refusal(stdout: str, stderr: str) -> str:
    """What the installed schedc lacks, read from its refusal: an unknown option, model or cluster, or the
    first error it printed."""
    option = re.search(r"No such option:? '?(--[\w-]+)", stderr)
    if option:
        return f"{option.group(1)} missing"
    try:
        messages = [(d["message"], d.get("file") or "") for d in json.loads(stdout)["diagnostics"]]
    except (ValueError, KeyError, TypeError):
        messages = [(line, "") for line in stderr.splitlines() if "error" in line.lower()] or [(stderr.strip(), "")]
    first, where = messages[0] if messages else ("", "")
    what = re.search(r"cannot read (model|cluster) description", first)
    if what:
        return f"{what.group(1)} {where} missing".replace("  ", " ")
    return first.splitlines()[0][:160] if first else "no output"


def simulate(args: list[str]) -> dict:
    """`schedc simulate ARGS` in its own process (the installed command: it tracks the tree's features)."""
    schedc = Path(sys.executable).with_name("schedc")
    argv = [str(schedc) if schedc.exists() else "schedc", "simulate", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise NotPredictable(refusal(done.stdout, done.stderr))
    return json.loads(done.stdout)


def predicted(row: dict, stats: dict) -> dict[str, float]:
    """The published figures' counterparts in a prediction: tokens/s/GPU from the iteration time (the
    global batch's tokens over the step, over the GPUs), schedc's own TFLOP/s/GPU and GiB per GPU."""
    seq, _ = value(row, "seq")
    batch, _ = value(row, "global_batch")
    out = {"tokens_per_s_per_gpu": batch * seq / (stats["iteration_s"] * row["gpus"])}
    if "tflops_per_gpu" in stats:
        out["tflops_per_gpu"] = stats["tflops_per_gpu"]
    if "memory_gib_per_gpu" in stats:
        out["memory_gib"] = stats["memory_gib_per_gpu"]
    return out


def compare(row: dict, prediction: dict[str, float], assumed: bool) -> list[Comparison]:
    """Each published figure of the row that the prediction has, measured against predicted; TFLOP/s only
    where no tokens/s is published: the publishers count a token's model FLOPs differently (Megatron-Bridge
    halves causal attention, Megatron-LM's README counts it whole: 449 against 481 GFLOP per token for
    70B at 8,192), so the tokens are the measurement and the TFLOP/s a convention on top of it."""
    metrics = [metric for metric in METRICS if metric in row["measured"] and metric in prediction]
    if "tokens_per_s_per_gpu" in metrics and "tflops_per_gpu" in metrics:
        metrics.remove("tflops_per_gpu")
    return [Comparison(row["id"], row["group"], metric, float(row["measured"][metric]), float(prediction[metric]),
                       assumed) for metric in metrics]


def summary(comparisons: list[Comparison]) -> list[dict]:
    """Mean and max absolute error (%) per group and published figure, in GROUPS and METRICS order."""
    out = []
    for group in GROUPS:
        for metric in METRICS:
            errors = [abs(c.error_pct) for c in comparisons if c.group == group and c.metric == metric]
            if errors:
                out.append({"group": group, "metric": metric, "rows": len(errors),
                            "mean_abs_error_pct": sum(errors) / len(errors), "max_abs_error_pct": max(errors)})
    return out


def run(rows: list[dict], predict=None) -> tuple[list[Comparison], dict[str, str]]:
    """Every row predicted (predict: args -> stats, `schedc simulate` by default) and compared; the rows
    that could not be, with their reasons."""
    predict = predict or simulate
    comparisons, skipped = [], {}
    for row in rows:
        try:
            args, assumed = command(row)
            comparisons += compare(row, predicted(row, predict(args)), assumed)
        except NotPredictable as why:
            skipped[row["id"]] = str(why)
    return comparisons, skipped


def table(comparisons: list[Comparison], skipped: dict[str, str], rows: list[dict]) -> str:
    """The text table: a line per published figure, the rows not predictable, then the errors' summary."""
    lines = [f"{'row':<34} {'figure':<12} {'measured':>10} {'predicted':>10} {'error':>8}"]
    for row in rows:
        for c in (c for c in comparisons if c.row == row["id"]):
            name = row["id"] + ("*" if c.assumed else "")
            lines.append(f"{name:<34} {UNITS[c.metric]:<12} {c.measured:>10.1f} {c.predicted:>10.1f} "
                         f"{c.error_pct:>+7.1f}%")
        if row["id"] in skipped:
            lines.append(f"{row['id']:<34} not yet predictable: {skipped[row['id']]}")
    lines.append("")
    for s in summary(comparisons):
        lines.append(f"{s['group']:<6} {UNITS[s['metric']]:<12} rows {s['rows']:>3}  mean_abs_error "
                     f"{s['mean_abs_error_pct']:.2f}%  max_abs_error {s['max_abs_error_pct']:.2f}%")
    lines.append(f"predicted rows {len({c.row for c in comparisons})}, not yet predictable {len(skipped)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", choices=GROUPS, help="only the rows of this group")
    parser.add_argument("--json", action="store_true", help="print the comparisons and skipped rows as JSON")
    parser.add_argument("--data", type=Path, default=DATA, help="the data file (default %(default)s)")
    args = parser.parse_args(argv)
    rows = [row for row in load(args.data)["row"] if args.group in (None, row["group"])]
    comparisons, skipped = run(rows)
    if args.json:
        print(json.dumps({"comparisons": [{**asdict(c), "error_pct": c.error_pct} for c in comparisons],
                          "not_yet_predictable": skipped, "summary": summary(comparisons)}, indent=1))
    else:
        print(table(comparisons, skipped, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
