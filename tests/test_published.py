"""benchmarks/data/published.toml and benchmarks/published_rows.py: every published row has a source and a
full layout whose sizes multiply to its GPUs, and the benchmark's table arithmetic (tokens/s/GPU from the
iteration time, the error, the per-group mean and max, what a refusal says is missing) is right on made-up
predictions worked by hand. No schedc process runs here."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("published_rows", ROOT / "benchmarks" / "published_rows.py")
published_rows = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = published_rows  # the dataclass looks its module up while it is made
spec.loader.exec_module(published_rows)

DATA = published_rows.load()
ROWS = DATA["row"]
# the layout every row states (a number, or "unstated" / "n/a" where the key allows it)
COUNTS = ("gpus", "tp", "pp", "cp", "dp")  # always published (dp: derived from them)
LAYOUT = COUNTS + ("vp", "ep", "etp", "zero", "reshard", "microbatch", "global_batch", "seq", "precision",
                   "recompute", "sequence_parallel", "tp_comm_overlap")
OPEN = ("unstated", "n/a")


def test_rows_have_unique_ids_a_group_a_source_and_a_model():
    ids = [row["id"] for row in ROWS]
    assert len(ids) == len(set(ids)) and len(ROWS) >= 50
    for row in ROWS:
        assert row["group"] in published_rows.GROUPS, row["id"]
        assert len(row["source"]) > 20 and row["model"] and row["gpu"] and row["cluster"], row["id"]
        assert row["schedule"] in ("1f1b", "interleaved_1f1b"), row["id"]
        assert not row["cluster"].endswith(".toml") or (ROOT / "benchmarks" / "data" / row["cluster"]).is_file()
        layers = row.get("stage_layers", "n/a")
        layers = row["assumed"]["stage_layers"] if layers == "unstated" else layers
        if layers != "n/a":  # torchtitan's split of Llama 3.1 405B's 126 layers over the pipeline
            assert sum(int(n) for n in layers.split(",")) == 126 and len(layers.split(",")) == row["pp"]


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_each_row_states_a_full_layout_that_multiplies_to_its_gpus(row):
    for key in LAYOUT:
        assert key in row, f"{row['id']} lacks {key}"
    for key in COUNTS:
        assert isinstance(row[key], int) and row[key] >= 1, (row["id"], key)
    assert row["tp"] * row["pp"] * row["cp"] * row["dp"] == row["gpus"]
    assert row["precision"] in ("bf16", "fp8", "unstated")
    assert row["zero"] in (0, 1, 2, 3, "unstated")
    if isinstance(row["ep"], int) and row["ep"] > 1:
        # Megatron-Core lays a stage's tp x cp x dp ranks out again for the experts as etp x ep x edp
        assert (row["tp"] * row["cp"] * row["dp"]) % row["ep"] == 0
    for key, value in row.items():
        if key in LAYOUT and isinstance(value, str):
            assert value in OPEN or key in ("precision", "recompute", "tp_comm_overlap"), (row["id"], key, value)
    assert row["recompute"] in ("none", "selective", "full", "selective-ops", "unstated") or \
        row["recompute"].startswith("modules ")


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_measured_figures_derived_and_assumed_values_are_well_formed(row):
    assert row["measured"] and set(row["measured"]) <= set(published_rows.METRICS)
    assert all(value > 0 for value in row["measured"].values())
    assert set(row.get("derived", [])) <= set(LAYOUT)
    for key in row.get("assumed", {}):  # only where the source is silent, and with the basis named
        assert row[key] == "unstated" and row["layout_source"], (row["id"], key)
    batch, b = row["global_batch"], row["microbatch"] if row["microbatch"] != "unstated" else row.get(
        "assumed", {}).get("microbatch")
    if isinstance(b, int):  # the global batch is whole microbatches on every data-parallel rank
        assert batch % (b * row["dp"]) == 0, row["id"]


def test_the_published_tables_are_all_there():
    groups = {group: sum(row["group"] == group for row in ROWS) for group in published_rows.GROUPS}
    assert groups["dense"] >= 7 and groups["cp"] >= 20 and groups["moe"] >= 10
    assert sum(row["id"].startswith("torchtitan-t6-") for row in ROWS) == 4
    assert [f["method"] for f in DATA["formula"]] == ["1F1B", "ZB1P", "DualPipe"]
    assert all(f["source"] and f["bubble"] and f["activations"] for f in DATA["formula"])


ROW = {"id": "made-up", "group": "dense", "model": "llama3.1-8b", "cluster": "dgx-h100-80gb",
       "schedule": "interleaved_1f1b", "gpus": 8, "tp": 2, "pp": 2, "vp": 3, "cp": 1, "ep": 1, "dp": 2,
       "zero": 1, "reshard": "n/a", "microbatch": 1, "global_batch": 64, "seq": 4096, "precision": "fp8",
       "recompute": "none", "sequence_parallel": True, "tp_comm_overlap": True,
       "measured": {"tokens_per_s_per_gpu": 16000, "tflops_per_gpu": 500}}


def test_command_carries_the_rows_layout():
    args, assumed = published_rows.command(ROW)
    text = " ".join(args)
    assert text.startswith("interleaved_1f1b -D p=2 -D v=3 --model llama3.1-8b --seq 4096 --cluster dgx-h100-80gb "
                           "--tp 2 --dp 2 --microbatch-size 1 --global-batch 64")
    assert "--distributed-optimizer --fp8 --recompute none --sequence-parallel --tp-comm-overlap --json" in text
    assert "--cp" not in text and "--ep" not in text and not assumed
    sharded = dict(ROW, schedule="1f1b", cp=2, dp=1, zero=3, reshard=False, precision="bf16", microbatch="unstated",
                   assumed={"microbatch": 1})
    args, assumed = published_rows.command(sharded)
    assert "--cp 2" in " ".join(args) and "--zero 3 --no-reshard-after-forward" in " ".join(args)
    assert "-D v=" not in " ".join(args) and "--fp8" not in args and assumed
    split = dict(ROW, account_for=["embedding", "loss"], stage_layers="unstated", assumed={"stage_layers": "1,2"})
    args, assumed = published_rows.command(split)
    assert "--account-for-embedding --account-for-loss --stage-layers 1,2 --json" in " ".join(args) and assumed


def test_unstated_needed_values_make_a_row_not_predictable():
    for key in ("precision", "microbatch", "vp", "recompute"):
        with pytest.raises(published_rows.NotPredictable, match=f"{key} not published"):
            published_rows.command(dict(ROW, **{key: "unstated"}))


def test_a_recomputation_schedc_cannot_express_is_said_so():
    with pytest.raises(published_rows.NotPredictable, match="recompute 'modules mlp' has no schedc form"):
        published_rows.command(dict(ROW, recompute="modules mlp"))


def test_errors_are_computed_from_the_prediction_by_hand():
    # 64 sequences of 4,096 tokens in 2.0 s on 8 GPUs: 262,144 / 16 = 16,384 tokens/s/GPU, +2.4 % on 16,000;
    # 72 GiB against 80 is -10 %; the TFLOP/s is left out where tokens are published
    stats = {"iteration_s": 2.0, "tflops_per_gpu": 450.0, "memory_gib_per_gpu": 72.0}
    row = dict(ROW, measured={**ROW["measured"], "memory_gib": 80.0})
    comparisons, skipped = published_rows.run([row], predict=lambda args: stats)
    assert not skipped and [c.metric for c in comparisons] == ["tokens_per_s_per_gpu", "memory_gib"]
    assert comparisons[0].predicted == 16384.0 and comparisons[0].error_pct == pytest.approx(2.4)
    assert comparisons[1].error_pct == pytest.approx(-10.0)
    (tokens, memory) = published_rows.summary(comparisons)
    assert tokens["rows"] == 1 and tokens["mean_abs_error_pct"] == pytest.approx(2.4)
    assert memory["max_abs_error_pct"] == pytest.approx(10.0)
    # a row that publishes TFLOP/s alone (the Llama 3 runs) is compared on it: 450 against 500 is -10 %
    (flops,), _ = published_rows.run([dict(ROW, measured={"tflops_per_gpu": 500})], predict=lambda args: stats)
    assert flops.metric == "tflops_per_gpu" and flops.error_pct == pytest.approx(-10.0)


def test_summary_is_per_group_mean_and_max_of_absolute_errors():
    made = [published_rows.Comparison(f"r{i}", group, "tokens_per_s_per_gpu", 100.0, predicted, False)
            for i, (group, predicted) in enumerate([("dense", 110.0), ("dense", 80.0), ("cp", 103.0)])]
    dense, cp = published_rows.summary(made)
    assert (dense["group"], dense["rows"]) == ("dense", 2)
    assert dense["mean_abs_error_pct"] == pytest.approx(15.0) and dense["max_abs_error_pct"] == pytest.approx(20.0)
    assert cp["mean_abs_error_pct"] == pytest.approx(3.0)


def test_a_refusal_names_what_the_installed_schedc_lacks():
    refusal = published_rows.refusal
    assert refusal("", "Usage: schedc simulate [OPTIONS] FILE\n\nError: No such option '--seq'.\n") == "--seq missing"
    assert refusal("", "Error: No such option: --cp\n") == "--cp missing"
    model = {"valid": False, "diagnostics": [{"severity": "error", "file": "mixtral-8x7b",
                                              "message": "cannot read model description: No such file"}]}
    assert refusal(json.dumps(model), "") == "model mixtral-8x7b missing"
    assert refusal("", "x.toml:3:1: error: tp must divide the heads\n") == "x.toml:3:1: error: tp must divide the heads"


def test_the_table_prints_rows_skipped_and_the_summary():
    later = dict(ROW, id="later", seq=8192)

    def predict(args):
        if "8192" in args:
            raise published_rows.NotPredictable("--seq missing")
        return {"iteration_s": 2.0, "tflops_per_gpu": 450.0}
    comparisons, skipped = published_rows.run([ROW, later], predict=predict)
    text = published_rows.table(comparisons, skipped, [ROW, later])
    assert "later                              not yet predictable: --seq missing" in text
    assert "dense  tok/s/GPU    rows   1  mean_abs_error 2.40%  max_abs_error 2.40%" in text
    assert text.endswith("predicted rows 1, not yet predictable 1")


# Llama 3.1's architecture (hidden, FFN, layers; 8 key/value heads of 128, vocabulary 128,256, untied
# embeddings): examples/llama's README and training script, the model cards' configs
ARCHITECTURE = {"llama3.1-8b": (32, 4096, 14336), "llama3.1-70b": (80, 8192, 28672),
                "llama3.1-405b": (126, 16384, 53248)}
VOCAB = 128256


def _flops_per_token(model: str, seq: int, causal: bool) -> float:
    """Model FLOPs of one token, counted by hand: 6 per weight a token multiplies (every parameter but the
    input embedding's, which is a lookup), plus attention's two s x h products per layer, 3 x 2 FLOPs
    each (forward and backward), halved where only the causal half is counted."""
    layers, h, ffn = ARCHITECTURE[model]
    layer = 2 * h * h + 2 * h * 8 * 128 + 3 * h * ffn + 2 * h  # q, o; k, v; SwiGLU; two RMSNorms
    weights = layers * layer + h + VOCAB * h  # the final norm and the output layer
    return 6 * weights + (6 if causal else 12) * seq * h * layers


def test_hand_count_gives_the_published_parameters():
    params = {m: _flops_per_token(m, 0, True) / 6 + VOCAB * ARCHITECTURE[m][1] for m in ARCHITECTURE}
    assert [round(p / 1e9, 2) for p in params.values()] == [8.03, 70.55, 405.85]


@pytest.mark.parametrize("row", [r for r in ROWS if r["model"] in ARCHITECTURE and
                                 {"tokens_per_s_per_gpu", "tflops_per_gpu"} <= set(r["measured"])],
                         ids=lambda r: r["id"])
def test_published_tflops_are_the_tokens_times_each_publishers_flops_per_token(row):
    """A transcription check of both columns: Megatron-Bridge counts causal attention half, Megatron-LM's
    README whole. Megatron-Bridge's 26.04.01 tokens/s look rounded (1,664 = 26 x 64): 2.2 % off there."""
    causal = row["id"].startswith("bridge-")
    implied = row["measured"]["tflops_per_gpu"] * 1e12 / row["measured"]["tokens_per_s_per_gpu"]
    off = abs(implied / _flops_per_token(row["model"], row["seq"], causal) - 1)
    assert off < (0.025 if row["id"].startswith("bridge-26.04.01-") else 0.01), (row["id"], off)
