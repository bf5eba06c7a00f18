"""The fourth round's surfaces for the fuzzer (tests/fuzz_cases.py draws these categories with its own):
the layout's newest dimensions and switches, Hugging Face config.json descriptions and the cluster files'
newest tables. Every value is drawn from valid, boundary and hostile choices.

- layout: --ep, --etp, --moe-dispatcher, --cp, --zero 2/3 and its resharding, --fp8, --tp-comm-overlap,
  --overlap-param-gather, --recompute selective-ops and --eager, one to four at once, on simulate
  --cluster, compile --cluster and tune, over dense and MoE models (library names and config.json files);
- hfconfig: a config.json with one to three edits: its model_type unknown or another family's, the keys
  of mixtral, qwen2 (sliding windows, its MoE), deepseek (latent attention, group-limited routing, dense
  first layers), rope_scaling, sliding_window, tie_word_embeddings, types swapped, numbers at and past
  their bounds, keys dropped; read by simulate, check, tune, compile and the runtime (`run --reference`);
- clusterfile: a cluster TOML with its [attention] table (lengths and rates of every length and order,
  the kernel, context_parallel, repeated_kv, measured_peak_tflops), [efficiency] gemm_fp8, [gpu]
  fp8_tflops and sms, or a [userbuffers.NAME] table made hostile, read by simulate (with --fp8,
  --fp8-current-scaling, --cp, --eager, --tp-comm-overlap), tune and calibrate;
- runlayout: `schedc run` of a plan compiled for tiny-mixtral with --ep 2 --dp 2 (or the small dense
  plan) with the runtime's --ep, --cp, --zero, resharding and --recompute, and the compiler-only
  switches the runtime does not take (the expert-parallel plan's runs, and any of more than 4 ranks, in
  one process: --reference).
"""
from __future__ import annotations

import json
import math
import random
import tomllib

from fuzz_cases import HF_CONFIGS, ROOT, SMALL_MODEL, TINY_RUN, Case, _run_value

HUGE = "9" * 30
# option: (valid, boundary, hostile) values; valid ones are drawn with probability VALID, boundary ones
# with BOUNDARY, the rest hostile
LAYOUT = {
    "--ep": (["1", "2", "4", "8"], ["3", "16", "64", "256", "512", "65536"], ["0", "-1", "x", "", "1.5", "1e3", HUGE]),
    "--etp": (["1", "2"], ["4", "8", "3", "64"], ["0", "-2", "x", "", "2.0", HUGE]),
    "--moe-dispatcher": (["alltoall", "flex"], ["Alltoall", "FLEX"], ["allgather", "", "x", "alltoall,flex", "deepep"]),
    "--cp": (["1", "2", "4"], ["3", "8", "16384", "32768"], ["0", "-2", "x", "", "1e1", HUGE]),
    "--zero": (["2", "3", "0", "1"], ["4"], ["-1", "x", "", "2.0", "0,3"]),
    "--recompute": (["selective-ops", "full", "selective", "none"], ["selective_ops", "SELECTIVE-OPS", "selective-op"],
                    ["", "x", "full,selective-ops"]),
    "--tp": (["1", "2", "8"], ["3", "16", "64"], ["0", "x", "-1"]),
    "--dp": (["1", "2", "8"], ["3", "1024"], ["0", "-1", "x"]),
    "--seq": (["4096", "2048"], ["1", "3", "131072", "1048576"], ["0", "-1", "x", HUGE]),
    "--microbatch-size": (["1", "2"], ["3", "1024"], ["0", "x"]),
}
# tune takes lists of some: the same values, and lists of them
TUNE_LISTS = {"--ep": ["1,2", "2,,4", "8,8", "1,2,4,8,16,32,64"], "--tp": ["1,2", "1,,2"],
              "--recompute": ["full,selective-ops", "selective-ops,none", "selective-ops,selective-ops"],
              "--zero": ["0,1,2,3", "2,3", "3,4"]}
FLAGS = ["--fp8", "--fp8-current-scaling", "--tp-comm-overlap", "--overlap-param-gather", "--eager", "--no-reshard-after-forward",
         "--reshard-after-forward", "--sequence-parallel", "--distributed-optimizer", "--overlap-grad-reduce",
         "--post-validation"]
VALID, BOUNDARY = 0.5, 0.3
# what a switch needs, given with it most of the time (so that its own checks and costs are reached)
NEEDS = {"--no-reshard-after-forward": ["--zero", "3"], "--reshard-after-forward": ["--zero", "3"],
         "--tp-comm-overlap": ["--sequence-parallel", "--tp", "2"], "--overlap-param-gather": ["--distributed-optimizer"],
         "--sequence-parallel": ["--tp", "2"], "--fp8-current-scaling": ["--fp8"]}
LIBRARY_MODELS = ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "llama3.1-8b", "mistral-7b", "gpt-1.7b",
                  "mixtral-8x22b", "qwen3-235b-a22b", "llama3.1-70b"]
SCHEDULES = ["1f1b", "interleaved_1f1b", "zbv", "dualpipev", "gpipe", "zb_h1", "v_half", "combined_1f1b", "1f1b"]
CLUSTERS = ["dgx-h100-80gb", "dgx-h100-80gb", "dgx-a100-80gb", "dgx-b200-180gb", "dgx-h200-141gb", "a100-80gb-roce"]


def _value(rng: random.Random, option: str) -> str:
    valid, boundary, hostile = LAYOUT[option]
    draw = rng.random()
    return rng.choice(valid if draw < VALID else boundary if draw < VALID + BOUNDARY else hostile)


def _layout_options(rng: random.Random, count: int, tune: bool = False) -> list[str]:
    argv: list[str] = []
    for _ in range(count):
        if rng.random() < 0.35:
            flag = rng.choice(FLAGS)
            argv += [flag] + NEEDS.get(flag, []) * (rng.random() < 0.7)
            continue
        option = rng.choice(sorted(LAYOUT))
        if tune and option in TUNE_LISTS and rng.random() < 0.3:
            argv += [option, rng.choice(TUNE_LISTS[option])]
        else:
            argv += [option, _value(rng, option)]
    return argv


def _model(rng: random.Random, files: dict[str, bytes]) -> list[str]:
    """A --model (and --seq for a config.json): a library name or a config.json of tests/data/hf*."""
    if rng.random() < 0.6:
        return ["--model", rng.choice(LIBRARY_MODELS)]
    files["config.json"] = HF_CONFIGS[rng.choice(sorted(HF_CONFIGS))].encode()
    return ["--model", "{d}/config.json", "--seq", rng.choice(["16", "4096", "2048"])]


def layout_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """simulate, compile or tune with one to four of the layout's newest options over a dense or MoE model."""
    files: dict[str, bytes] = {}
    model = _model(rng, files)
    cluster = rng.choice(CLUSTERS)
    kind = rng.random()
    if kind < 0.6:
        argv = ["simulate", rng.choice(SCHEDULES), "--cluster", cluster, *model, "--global-batch",
                rng.choice(["64", "256", "1024", "8", "3"]), "-D", f"p={rng.choice(['2', '4', '8', '16'])}"]
        argv += ["--json"] * (rng.random() < 0.2)
    elif kind < 0.75:
        argv = ["compile", rng.choice(SCHEDULES), "--cluster", cluster, *model, "--global-batch",
                rng.choice(["16", "64"]), "-D", f"p={rng.choice(['2', '4'])}", "-o", "{d}/out"]
    else:
        gpus = rng.choice(["8", "16", "64"] + ["512", "1024"] * allow_slow)
        argv = ["tune", *model, "--cluster", cluster, "--gpus", gpus, "--global-batch", rng.choice(["64", "512"]),
                "--schedules", rng.choice(["1f1b", "1f1b,interleaved_1f1b", "zbv", "dualpipev"])]
    argv += _layout_options(rng, rng.choice([1, 1, 2, 2, 3, 4]), tune=argv[0] == "tune")
    return Case("layout", argv, files, ("config.json",) * ("config.json" in files), False, tuple(files))


# Hugging Face config.json ------------------------------------------------------------------------

RAW = "\u0000raw:"  # a string standing for raw JSON text (1e400, NaN, a 400-digit integer), spliced in


def _raw(text: str) -> str:
    return RAW + text + "\u0000"


NUMBERS = [0, -1, 1, 2, 3, 7, 2 ** 31, 2 ** 40, 2 ** 63, 1.5, 0.5, 1e308, _raw("1e400"), _raw("NaN"),
           _raw("-Infinity"), _raw("1" + "0" * 400), 4.0]
FAMILY_KEYS = {  # the keys of each family a config.json may carry, with values valid, boundary and hostile
    "mixtral": {"num_local_experts": [8, 4, 1, 0, -1, 3, 2 ** 40, "8", None, 8.0],
                "num_experts_per_tok": [2, 1, 0, 9, -2, "2", 2.5], "router_aux_loss_coef": [0.02, -1, "x"],
                "output_router_logits": [False, True, "yes"]},
    "qwen2": {"use_sliding_window": [True, False, "yes", None, 1], "sliding_window": [4096, 6, 0, -1, None, "4096"],
              "max_window_layers": [28, 0, 2, -1, 10 ** 6, "x"], "num_experts": [60, 4, 0, 1, -4, 2 ** 40],
              "moe_intermediate_size": [1408, 96, 0, -1, 1.5], "shared_expert_intermediate_size": [5632, 0, -1, "x"],
              "decoder_sparse_step": [1, 2, 0, -1, 5], "mlp_only_layers": [[], [0], [99], [-1], "x", [0.5]],
              "norm_topk_prob": [True, False, 0]},
    "deepseek": {"n_routed_experts": [256, 4, 0, -1, 3, None], "n_shared_experts": [1, 0, -1, 2 ** 40, None],
                 "q_lora_rank": [1536, None, 0, -1, 7], "kv_lora_rank": [512, 0, -1, 3, None],
                 "qk_nope_head_dim": [128, 0, -1, 3], "qk_rope_head_dim": [64, 0, 3, -2], "v_head_dim": [128, 0, -1],
                 "first_k_dense_replace": [3, 0, 61, 1000, -1, "3"], "moe_layer_freq": [1, 2, 0, -1],
                 "n_group": [8, 1, 0, 3, -1], "topk_group": [4, 0, 9, -1], "routed_scaling_factor": [2.5, 0, -1],
                 "scoring_func": ["sigmoid", "softmax", "x", 3], "topk_method": ["noaux_tc", "greedy", "x"],
                 "num_nextn_predict_layers": [1, 0, -1, 100]},
}
ROPE_SCALING = [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}, {"type": "linear", "factor": 2.0},
                {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32},
                {"type": "dynamic", "factor": 0}, {"factor": -1}, {"type": "nope", "factor": 2}, "linear", [],
                {"rope_type": 5}, {"type": "linear", "factor": _raw("1e400")}, {"type": "linear"}, {}]
MODEL_TYPES = ["llama", "mistral", "qwen2", "gpt2", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "deepseek_v2",
               "bert", "llama4", "Llama", "", None, 5, ["llama"], "qwen3", "gemma2"]
OTHER_KEYS = {"sliding_window": [None, 0, -1, 1, 6, 4096, 2 ** 40, "4096", 4096.5, True, []],
              "tie_word_embeddings": [True, False, "true", 1, 0, None, "false"],
              "head_dim": [None, 16, 64, 0, 3, 128, -1], "hidden_act": ["silu", "gelu", "gelu_new", "relu", "", 3, None],
              "torch_dtype": ["bfloat16", "float16", "float32", "float8_e4m3fn", "auto", None, 3],
              "attention_bias": [True, False, "x"], "mlp_bias": [True, "x"], "max_position_embeddings": [0, 8, 2 ** 40],
              "rms_norm_eps": [0, -1, 1e-6, "x"], "layer_norm_epsilon": [1e-5, 0], "rope_theta": [0, -1, 1e6, "x"]}


def _edit_config(rng: random.Random, obj: dict) -> None:
    """One edit of a config.json's object, in place."""
    edit = rng.random()
    if edit < 0.15:
        obj["model_type"] = rng.choice(MODEL_TYPES)
    elif edit < 0.4:
        family = FAMILY_KEYS[rng.choice(sorted(FAMILY_KEYS))]
        for key in rng.sample(sorted(family), rng.choice([1, 1, 2, 3])):
            obj[key] = rng.choice(family[key])
    elif edit < 0.5:
        obj["rope_scaling"] = rng.choice(ROPE_SCALING)
    elif edit < 0.65:
        key = rng.choice(sorted(OTHER_KEYS))
        obj[key] = rng.choice(OTHER_KEYS[key])
    elif edit < 0.8 and obj:
        key = rng.choice(sorted(obj))
        value = obj[key]
        obj[key] = rng.choice([str(value), [value], {"value": value}, None, True]
                              + ([float(value), value + 0.5] if type(value) is int else []))
    elif edit < 0.92 and obj:
        numeric = sorted(k for k, v in obj.items() if type(v) in (int, float)) or sorted(obj)
        obj[rng.choice(numeric)] = rng.choice(NUMBERS)
    elif obj:
        del obj[rng.choice(sorted(obj))]


def _config_text(obj) -> str:
    text = json.dumps(obj, indent=1)
    opening, closing = json.dumps(RAW)[:-1], "\\u0000\""  # '"\u0000raw:1e400\u0000"' becomes 1e400
    while opening in text:
        start = text.index(opening)
        end = text.index(closing, start)
        text = text[:start] + text[start + len(opening):end] + text[end + len(closing):]
    return text


def mangled_config(rng: random.Random, text: str) -> str:
    obj = json.loads(text)
    for _ in range(rng.choice([1, 1, 2, 3])):
        _edit_config(rng, obj)
    return _config_text(obj)


TINY = ("tiny-llama", "tiny-llama-tied", "tiny-mistral-window", "tiny-mixtral", "tiny-gpt2")


def hfconfig_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """A config.json with one to three edits, read by simulate, check, tune, compile or `run --reference`."""
    name = rng.choice(sorted(HF_CONFIGS))
    kind = rng.random()
    if kind < 0.2:  # the runtime builds it: one of the tiny ones
        name = rng.choice([n for n in TINY if n in HF_CONFIGS])
    text = mangled_config(rng, HF_CONFIGS[name]) if rng.random() < 0.9 else HF_CONFIGS[name]
    files = {"config.json": text.encode(), "plan.json": b"@plan"}
    f, seq = "{d}/config.json", rng.choice(["16", "4096", "8", "131072"])
    if kind < 0.2:
        argv = ["run", "{d}/plan.json", "--model", f, "--seq", rng.choice(["16", "8"]), "--steps", "1", "--threads",
                "1", "--quiet", "--timeout", "15", "--reference", "--mb-size", "1"]
    elif kind < 0.55:
        argv = ["simulate", rng.choice(SCHEDULES), "--cluster", rng.choice(CLUSTERS), "--model", f, "--seq", seq,
                "--global-batch", "16", "-D", "p=2"] + _layout_options(rng, rng.choice([0, 0, 1, 2]))
    elif kind < 0.7:
        argv = ["check", "1f1b", "--model", f, "--seq", seq, "--microbatch-size", "1"]
    elif kind < 0.85:
        argv = ["tune", "--model", f, "--seq", seq, "--cluster", "dgx-h100-80gb", "--gpus", rng.choice(["8", "16"]),
                "--global-batch", "16", "--schedules", "1f1b"]
    else:
        argv = ["compile", "1f1b", "-D", "p=2", "--cluster", "dgx-h100-80gb", "--model", f, "--seq", seq,
                "--global-batch", "8", "-o", "{d}/out"]
    located = () if argv[0] == "run" else ("config.json",)
    return Case("hfconfig", argv, files, located, False, ("config.json",))


# Cluster files --------------------------------------------------------------------------------------

CLUSTER_FILES = {p.stem: p.read_text() for p in sorted((ROOT / "schedc" / "clusters").glob("*.toml"))}
ATTENTION_VALUES = {
    "kernel": ["FlashAttention-2", "", 5, ["x"], True],
    "lengths": [[], [512], [1024, 512, 2048, 4096, 8192, 16384], [512, 512, 1024, 2048, 4096, 8192], [-512, 0, 1, 2, 3, 4],
                [512.5, 1024, 2048, 4096, 8192, 16384], ["512"], list(range(1, 100001)), [2 ** 62, 2 ** 63 - 1]],
    "forward_tflops": [[], [497], [0, 0, 0, 0, 0, 0], [-1, 574, 617, 609, 600, 595], [1e308] * 6,
                       [float("nan")] * 6, [float("inf")] * 6, ["x"] * 6, [5000] * 6],
    "forward_causal_tflops": [[315], [0] * 6, [-315, 410, 484, 518, 529, 539], [1e15] * 6],
    "backward_tflops": [[305, 408], [0] * 6, [float("nan"), 408, 465, 499, 518, 516], [1e-300] * 6],
    "context_parallel": ["p2p", "a2a", "allgather", "ring", "", 5, "P2P"],
    "repeated_kv": [True, False, "false", 1, None],
    "measured_peak_tflops": [989, 0, -1, 1e16, "x", float("inf"), 1],
    "nope": [1],
}
GPU_FP8 = {"fp8_tflops": [1979, 0, -1, 1e15, 1e16, "x", float("nan"), True], "peak_tflops": [0, 1e-300, 1e15],
           "sms": [132, 0, -1, 1, 24, 10 ** 6, 1.5, "x", True]}
USERBUFFERS = {"proj_fprop": [1, 0, -1, 132, 200, 1.5, "x"], "fc2_fprop": [16, 131, 10 ** 9], "qkv_dgrad": [4, -4, 0],
               "fc1_dgrad": [2, 2.5], "qkv_wgrad": [24, 133], "fc1_wgrad": [4, None], "hidden": [8192, 0, -1, 7],
               "tp": [4, 0, 3, 1], "cp": [1, 0, 2], "fp8": [True, False, "x", 1], "nope": [1]}
EFFICIENCY_FP8 = {"gemm_fp8": [0.709, 0, -0.1, 1.0, 1.5, 2, "x", float("nan"), float("inf"), True]}


def _toml_value(value) -> str:
    if value is None:
        return '"null"'  # TOML has no null: a string where a number belongs
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"


def _toml_text(obj: dict) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in obj.items() if not isinstance(v, dict)]
    for table, body in obj.items():
        if isinstance(body, dict):
            lines += ["", f"[{table}]"] + [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def mangled_cluster(rng: random.Random) -> str:
    """A cluster TOML with one to three edits of its [attention] table, its FP8 rate or efficiency."""
    obj = tomllib.loads(CLUSTER_FILES[rng.choice(sorted(CLUSTER_FILES))])
    if "attention" not in obj and rng.random() < 0.5:
        obj["attention"] = tomllib.loads(CLUSTER_FILES["dgx-h100-80gb"])["attention"]
    for _ in range(rng.choice([1, 1, 2, 3])):
        edit = rng.random()
        if edit < 0.55 and isinstance(obj.get("attention"), dict):
            key = rng.choice(sorted(ATTENTION_VALUES))
            if rng.random() < 0.15 and key in obj["attention"]:
                del obj["attention"][key]
            else:
                obj["attention"][key] = rng.choice(ATTENTION_VALUES[key])
        elif edit < 0.6:
            obj["attention"] = rng.choice([5, "x", {}, [1]]) if rng.random() < 0.5 else {}
        elif edit < 0.8:
            key = rng.choice(sorted(GPU_FP8))
            obj.setdefault("gpu", {})[key] = rng.choice(GPU_FP8[key])
            if rng.random() < 0.2:
                del obj["gpu"][key]
        elif edit < 0.9:
            obj.setdefault("efficiency", {})["gemm_fp8"] = rng.choice(EFFICIENCY_FP8["gemm_fp8"])
            if rng.random() < 0.2:
                del obj["efficiency"]["gemm_fp8"]
        else:
            _edit_userbuffers(rng, obj)
    return _toml_text(obj)


def _edit_userbuffers(rng: random.Random, obj: dict) -> None:
    """One [userbuffers.NAME] table (the SMs --tp-comm-overlap takes from each GEMM) made hostile: a key's
    value, a key dropped, a table added with some keys, or the tables replaced by a value."""
    tables = obj.get("userbuffers")
    if not isinstance(tables, dict) or not tables or rng.random() < 0.1:
        obj["userbuffers"] = rng.choice([{}, 5, {"mine": {"hidden": 8192, "tp": 4}}])
        return
    name = rng.choice(sorted(tables))
    key = rng.choice(sorted(USERBUFFERS))
    if rng.random() < 0.15 and key in tables[name]:
        del tables[name][key]
    else:
        tables[name][key] = rng.choice(USERBUFFERS[key])


def clusterfile_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """A cluster file's [attention], gemm_fp8 or fp8_tflops made hostile, read by simulate, tune or calibrate."""
    files = {"cluster.toml": mangled_cluster(rng).encode(), "small.toml": SMALL_MODEL.encode(),
             "p.json": b'{"unit": "ms", "F": [50, 60], "B": [100, 120], "microbatch_size": 1}'}
    c = "{d}/cluster.toml"
    model = rng.choice(["llama3.1-8b", "mixtral-8x7b", "gpt-1.7b", "mistral-7b", "deepseek-v3", "llama3.1-70b"])
    kind = rng.random()
    if kind < 0.65:
        argv = ["simulate", rng.choice(SCHEDULES), "--cluster", c, "--model", model, "--global-batch", "64",
                "-D", "p=4"] + rng.choice([[], ["--fp8"], ["--cp", "2", "--dp", "2"], ["--eager"],
                                           ["--seq", rng.choice(["256", "8192", "65536", "3"])],
                                           ["--fp8", "--recompute", "selective-ops"],
                                           ["--tp-comm-overlap", "--sequence-parallel", "--tp", "4"],
                                           ["--tp-comm-overlap", "--sequence-parallel", "--tp", "4", "--fp8"],
                                           ["--fp8", "--fp8-current-scaling"]])
    elif kind < 0.85:
        argv = ["tune", "--model", model, "--cluster", c, "--gpus", "8", "--global-batch", "64", "--schedules", "1f1b"]
        argv += rng.choice([[], ["--fp8"], ["--cp", "2"], ["--eager"]])
    else:
        argv = ["calibrate", "-o", "{d}/c.toml", "--cluster", c, "--costs", "{d}/p.json", "--model", "{d}/small.toml"]
    return Case("clusterfile", argv, files, ("cluster.toml",) * (argv[0] != "calibrate"), False, ("cluster.toml",))


# The runtime under the layout's dimensions -----------------------------------------------------------

MIXTRAL = str(ROOT / "tests" / "data" / "hf" / "tiny-mixtral" / "config.json")
EP_RUN = ["--model", MIXTRAL, "--seq", "16", "--mb-size", "1", "--steps", "1", "--threads", "1", "--quiet",
          "--timeout", "15"]
RUN_LAYOUT = {  # (values the runtime runs, values it must refuse before torchrun)
    "--ep": (["2", "1"], ["4", "3", "0", "-1", "x", "8", HUGE]), "--cp": (["1", "2"], ["0", "3", "x", "16", HUGE]),
    "--zero": (["2", "3", "0"], ["4", "-1", "x"]), "--dp": (["2"], ["0", "-4", "x"]),
    "--recompute": (["selective-ops", "full", "selective"], ["selective_ops", "x"]),
    "--tp": (["1"], ["2", "0", "x"]), "--dtype": (["bf16", "bf16-main"], ["fp8"]),
    "--clip-grad": (["1.0"], ["0"]), "--optimizer": (["sgd"], ["lion"]),
}
RUN_SWITCHES = ["--no-reshard-after-forward", "--reshard-after-forward", "--distributed-optimizer",
                "--sequence-parallel", "--fp8", "--eager", "--tp-comm-overlap", "--overlap-param-gather",
                "--etp", "--moe-dispatcher", "--overlap-grad-reduce"]


def runlayout_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """`schedc run` of the expert-parallel plan (tiny-mixtral, --ep 2 --dp 2) or the small dense plan under
    the runtime's --ep, --cp, --zero, resharding and --recompute, and switches only the compiler takes
    (--fp8, --eager, --etp ...: refused as unknown). Most draws are refused before torchrun; the
    expert-parallel plan's runs and any of more than 4 ranks are given --reference (one process)."""
    ep = rng.random() < 0.6
    files = {"plan.json": b"@plan-ep" if ep else b"@plan", "mixtral.json": HF_CONFIGS["tiny-mixtral"].encode()}
    argv = ["run", "{d}/plan.json", *(EP_RUN + ["--ep", "2", "--dp", "2"] if ep else TINY_RUN)]
    for _ in range(rng.choice([1, 2, 2, 3])):
        if rng.random() < 0.25:
            switch = rng.choice(RUN_SWITCHES)
            argv += [switch] + ([rng.choice(["2", "flex"])] if switch in ("--etp", "--moe-dispatcher") else [])
            continue
        option = rng.choice(sorted(RUN_LAYOUT))
        good, bad = RUN_LAYOUT[option]
        argv += [option, _run_value(option, rng.choice(good) if rng.random() < 0.3 else rng.choice(bad))]
    if rng.random() < (0.8 if ep else 0.2) or ep or _world(argv) > 4:
        argv.append("--reference")  # more than 4 ranks (tiny-mixtral's 4 too) train past the cases' 20 s of CPU
    return Case("runlayout", argv, files, (), False)


def _world(argv: list[str]) -> int:
    """The processes a run of the 2-stage plan starts: 2 x t x cp x d, each the last value given (1 where
    it is no positive integer: refused before launch)."""
    world = 2
    for option in ("--tp", "--cp", "--dp"):
        given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == option]
        world *= int(given[-1]) if given and given[-1].isdigit() and 0 < int(given[-1]) < 10 ** 6 else 1
    return world


GENERATORS = {"layout": (layout_case, 10), "hfconfig": (hfconfig_case, 8), "clusterfile": (clusterfile_case, 5),
              "runlayout": (runlayout_case, 3)}
