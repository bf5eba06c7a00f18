"""Model, cluster and layout descriptions for the cluster-scale cost model (schedc/costmodel/).

A model file: modelspec.py (a TOML file's keys or a Hugging Face config.json).

A cluster file (TOML; the library in schedc/clusters/*.toml is found by name, `--cluster dgx-a100-80gb`):

    [gpu]        peak_tflops, memory_gib, hbm_gbps             (datasheet)
    [node]       gpus                                          (GPUs per node)
    [intra]      bandwidth_gbps, latency_us                    (NVLink/NVSwitch, per GPU, one direction)
    [inter]      bandwidth_gbps, latency_us                    (InfiniBand, per GPU, one direction)
    [efficiency] gemm, gemm_half_dim, hbm, intra, inter        (the named fractions of the datasheet)
                 gemm_fp8                                      (optional: of the FP8 peak; gemm's without it)
    [memory]     reserved_gib, fragmentation                   (optional: what the GPU's memory loses
                                                                beside the tensors; 0 when left out)
    [attention]  kernel, lengths, forward_tflops, ...           (optional: the flash kernel's achieved
                                                                rates, kernels.py; a GEMM's without it)
    [userbuffers.NAME] fp8, hidden, tp, cp, qkv_fprop, ...     (optional, with [gpu] sms: the SMs the GEMMs
                                                                run without under --tp-comm-overlap, userbuffers.py)

Every error names the field and points at it (`file:line:col: error: ...`, exit 2); a missing field
points at the table it belongs in.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..descriptions import CLUSTERS_PACKAGE, find, is_hf_config, library, resolve_model
from ..descriptions.facts import DTYPE_BYTES
from .kernels import AttentionKernel, dump_attention, read_attention
from .located import locate, read_toml, source_text, unknown_keys
from .userbuffers import Userbuffers, dump_userbuffers, read_userbuffers
from .modelspec import ModelSpec, load_model_spec, model_span, read_fields  # noqa: F401  (the cost model's model, here too)
from ..diagnostics import USAGE, Diagnostic, SchedError, Source, error, usage
from ..layout import SELECTIVE_OPS, ZERO_LEVELS, Layout, SplitError
from ..ops import OpKind
from ..text import GIB



@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Per-GPU datasheet figures, the node and its two links, and the calibrated efficiencies."""

    name: str
    peak_flops: float          # FLOP/s, dense 16-bit tensor core
    memory_bytes: float
    hbm_bandwidth: float       # bytes/s
    gpus_per_node: int
    intra_bandwidth: float     # bytes/s per GPU, one direction (NVLink through NVSwitch)
    intra_latency: float       # s
    inter_bandwidth: float     # bytes/s per GPU, one direction (InfiniBand; one NIC per GPU)
    inter_latency: float       # s
    gemm_efficiency: float     # of peak, for large GEMMs
    gemm_half_dim: float       # a GEMM whose smallest dimension is this runs at half of gemm_efficiency
    hbm_efficiency: float      # of hbm_bandwidth, for memory-bound kernels
    intra_efficiency: float    # NCCL bus bandwidth over NVLink, of intra_bandwidth
    inter_efficiency: float    # NCCL bus bandwidth over InfiniBand, of inter_bandwidth
    memory_reserved: float = 0.0   # bytes per GPU no tensor gets: CUDA context, NCCL and cuBLAS buffers
    fragmentation: float = 0.0     # of the allocator's reserved bytes, held but not allocated to tensors
    dtype: str = "bf16"            # what peak_flops is the peak of ([gpu] dtype; a CPU fit's is fp32)
    host_bandwidth: float = 0.0    # bytes/s per GPU and direction to host memory (PCIe, effective); 0: not given
    overhead: tuple[tuple[str, float], ...] = ()  # (op kind, s per layer): [overhead], a run's fixed cost
    # per layer of each op beyond its kernels' work (a CPU's op dispatch and autograd); none: 0
    fp8_flops: float = 0.0         # FLOP/s, dense FP8 tensor core ([gpu] fp8_tflops); 0: not given (no --fp8)
    attention: AttentionKernel | None = None  # [attention]: the flash kernel's achieved rates (kernels.py)
    gemm_fp8_efficiency: float = 0.0  # of fp8_flops, for large FP8 GEMMs ([efficiency] gemm_fp8); 0: gemm_efficiency's
    userbuffers: Userbuffers | None = None  # [gpu] sms, [userbuffers.*]: SMs --tp-comm-overlap takes (userbuffers.py)

    def reserved_bytes(self, allocated: float) -> float:
        """What a GPU needs to hold `allocated` bytes of tensors: the caching allocator's pool, of
        which a share `fragmentation` is lost (allocated / (1 - fragmentation)), plus what the process
        holds outside it (memory_reserved)."""
        return allocated / (1.0 - self.fragmentation) + self.memory_reserved


# fields: table -> key -> (type, scale to SI, description); None as table: top level
_CLUSTER_FIELDS: dict[str, dict[str, tuple[type, float, str]]] = {
    "gpu": {"peak_tflops": (float, 1e12, "peak dense 16-bit FLOP/s, in teraFLOP/s"),
            "memory_gib": (float, GIB, "GPU memory in GiB"),
            "hbm_gbps": (float, 1e9, "HBM bandwidth in GB/s")},
    "node": {"gpus": (int, 1, "GPUs per node")},
    "intra": {"bandwidth_gbps": (float, 1e9, "NVLink bandwidth per GPU and direction, GB/s"),
              "latency_us": (float, 1e-6, "NVLink message latency, microseconds")},
    "inter": {"bandwidth_gbps": (float, 1e9, "network bandwidth per GPU and direction, GB/s"),
              "latency_us": (float, 1e-6, "network message latency, microseconds")},
    "efficiency": {"gemm": (float, 1, "fraction of peak FLOP/s a large GEMM reaches"),
                   "gemm_half_dim": (float, 1, "GEMM dimension at which half of that is reached"),
                   "hbm": (float, 1, "fraction of HBM bandwidth memory-bound kernels reach"),
                   "intra": (float, 1, "NCCL bus bandwidth over NVLink, fraction of the link"),
                   "inter": (float, 1, "NCCL bus bandwidth over the network, fraction of the link")},
}
_FRACTIONS = {("efficiency", k) for k in ("gemm", "hbm", "intra", "inter")}
_OPTIONAL_KEYS = {"gpu": ("dtype", "fp8_tflops", "sms"), "efficiency": ("gemm_fp8",)}  # read on their own, below
# the optional [memory] table: key -> (scale to SI, description, upper bound (exclusive) or None)
_MEMORY_FIELDS: dict[str, tuple[float, str, float | None]] = {
    "reserved_gib": (GIB, "GiB per GPU outside the tensors: CUDA context, NCCL and cuBLAS buffers", None),
    "fragmentation": (1, "share of the allocator's reserved memory lost to fragmentation", 1.0)}
# the optional [overhead] table: its keys (microseconds per layer) and the op kinds they are of
OVERHEAD_KEYS = {f"{kind.value.lower()}_us": kind.value for kind in (OpKind.F, OpKind.B, OpKind.I, OpKind.W)}
MAX_GPUS = 2**20  # a million GPUs: past every cluster built; bounds tune's divisors and a prediction's t x p x d


def library_clusters() -> list[Path]:
    return library(CLUSTERS_PACKAGE)


def resolve_cluster(name: str) -> Path:
    """A path as given if it exists, else the library cluster of that name (`dgx-a100-80gb`)."""
    found = find(name, library_clusters())
    if found is not None:
        return found
    known = ", ".join(p.stem for p in library_clusters())
    raise SchedError(error(f"--cluster: no file or library cluster named {name!r} (library: {known})"),
                     Source("schedc", ""), kind=USAGE)


MAX_FIGURE = 1e15    # a cluster's figures, in their units (TFLOP/s, GiB, GB/s, microseconds, ...)
MIN_FIGURE = 1e-6    # and at least this: 1 MFLOP/s, 1 kB/s, a picosecond (1e-320 made every time infinite)


def load_cluster_model(path: str, cluster: ClusterSpec, seq: int | None = None) -> ModelSpec:
    """A model description for a prediction on `cluster` (simulate/compile/render --cluster, tune): of
    the width the cluster's peak is for (its [gpu] dtype, bf16 unless a calibration fitted fp32); an
    fp32 model on a bf16 peak is refused at its dtype (exit 2), not predicted at 16-bit speed with
    32-bit messages. A config.json's torch_dtype is its checkpoint's, not the training's: it trains at
    the cluster's dtype."""
    spec = load_model_spec(path, seq)
    if is_hf_config(resolve_model(str(path))):
        return replace(spec, dtype=cluster.dtype)
    if spec.width != DTYPE_BYTES[cluster.dtype]:
        table, source = read_toml(resolve_model(str(path)), "model description")
        raise SchedError(error(f"dtype '{spec.dtype}', but {cluster.name}'s peak_tflops is its {cluster.dtype} "
                               f"peak: give the model dtype {cluster.dtype}, or a cluster file whose [gpu] dtype is "
                               f"{spec.dtype}", locate(source, "dtype")), source, kind=USAGE)
    return spec


def load_cluster(name: str) -> ClusterSpec:
    """Read a cluster description (a path or a library name); every bad or missing field is reported,
    located at the key or, when missing, at its table's header (exit 2)."""
    path = resolve_cluster(name)
    table, source = read_toml(path, "cluster description")
    diags: list[Diagnostic] = []
    for key, value in table.items():
        tables = (*_CLUSTER_FIELDS, "memory", "host", "overhead", "attention", "userbuffers")
        if key not in tables and key not in ("name", "description", "source"):
            what = "table" if isinstance(value, dict) else "key"
            diags.append(error(f"unknown {what} '{key}' (tables: {', '.join(tables)})", locate(source, key)))
        elif key in tables and not isinstance(value, dict):
            diags.append(error(f"'{key}' must be a table: [{key}]", locate(source, key)))
    got: dict[tuple[str, str], float] = {}
    gpu_dtype = _gpu_dtype(table, source, diags)
    for section, fields in _CLUSTER_FIELDS.items():
        given = table.get(section) if isinstance(table.get(section), dict) else {}
        given = {k: v for k, v in given.items() if k not in _OPTIONAL_KEYS.get(section, ())}
        diags += unknown_keys([k for k in given if k not in fields],
                              lambda k, section=section, fields=fields: f"unknown key '{section}.{k}' (keys: "
                                                                        f"{', '.join(fields)})",
                              lambda k, section=section: locate(source, k, section))
        for key, (kind, scale, doc) in fields.items():
            value = given.get(key)
            if value is None:
                diags.append(error(f"missing field '{section}.{key}' ({doc})", locate(source, key, section)))
                continue
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            bad = (number is None or not MIN_FIGURE <= number <= MAX_FIGURE
                   or (kind is int and not isinstance(value, int))
                   or ((section, key) in _FRACTIONS and number > 1))
            if bad:
                want = (f"a number in [{MIN_FIGURE:g}, 1]" if (section, key) in _FRACTIONS else
                        f"a positive integer up to {MAX_FIGURE:g}" if kind is int else
                        f"a number from {MIN_FIGURE:g} to {MAX_FIGURE:g}")
                diags.append(error(f"'{section}.{key}' must be {want}, got {value!r} ({doc})",
                                   locate(source, key, section)))
                continue
            got[section, key] = number * scale
    memory = _memory_fields(table, source, diags)
    if ("gpu", "memory_gib") in got and memory.get("reserved_gib", 0.0) >= got["gpu", "memory_gib"]:
        diags.append(error(f"'memory.reserved_gib' ({memory['reserved_gib'] / GIB:g}) must be less than the GPU's "
                           f"memory ({got['gpu', 'memory_gib'] / GIB:g} GiB): nothing would be left for the "
                           "tensors", locate(source, "reserved_gib", "memory")))
    if "name" in table and not isinstance(table["name"], str):
        diags.append(error(f"'name' must be a string, got {table['name']!r}", locate(source, "name")))
    host, overhead = _host_bandwidth(table, source, diags), _overhead(table, source, diags)
    fp8, gemm_fp8 = _fp8_flops(table, source, diags), _gemm_fp8(table, source, diags)
    attention, userbuffers = read_attention(table, source, diags), read_userbuffers(table, source, diags)
    if diags:
        raise SchedError(diags, source, kind=USAGE)
    return ClusterSpec(
        str(table.get("name", path.stem)), got["gpu", "peak_tflops"], got["gpu", "memory_gib"],
        got["gpu", "hbm_gbps"], int(got["node", "gpus"]), got["intra", "bandwidth_gbps"],
        got["intra", "latency_us"], got["inter", "bandwidth_gbps"], got["inter", "latency_us"],
        got["efficiency", "gemm"], got["efficiency", "gemm_half_dim"], got["efficiency", "hbm"],
        got["efficiency", "intra"], got["efficiency", "inter"], memory["reserved_gib"], memory["fragmentation"],
        gpu_dtype, host, overhead, fp8, attention, gemm_fp8, userbuffers)


def _gemm_fp8(table: dict, source: Source, diags: list[Diagnostic]) -> float:
    """[efficiency] gemm_fp8: the share of the FP8 peak a large FP8 GEMM reaches (optional: 0.0
    without it, and FP8 GEMMs run at `gemm`'s share)."""
    given = table.get("efficiency") if isinstance(table.get("efficiency"), dict) else {}
    value = given.get("gemm_fp8")
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not MIN_FIGURE <= value <= 1:
        diags.append(error(f"'efficiency.gemm_fp8' must be a number in [{MIN_FIGURE:g}, 1], got {value!r} "
                           "(fraction of the FP8 peak a large FP8 GEMM reaches)", locate(source, "gemm_fp8", "efficiency")))
        return 0.0
    return float(value)


def _fp8_flops(table: dict, source: Source, diags: list[Diagnostic]) -> float:
    """[gpu] fp8_tflops in FLOP/s (optional: 0.0 without it, and --fp8 is refused on the cluster)."""
    gpu = table.get("gpu") if isinstance(table.get("gpu"), dict) else {}
    value = gpu.get("fp8_tflops")
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not MIN_FIGURE <= value <= MAX_FIGURE:
        diags.append(error(f"'gpu.fp8_tflops' must be a number from {MIN_FIGURE:g} to {MAX_FIGURE:g}, got {value!r} "
                           "(peak dense FP8 FLOP/s, in teraFLOP/s)", locate(source, "fp8_tflops", "gpu")))
        return 0.0
    return value * 1e12


def _overhead(table: dict, source: Source, diags: list[Diagnostic]) -> tuple[tuple[str, float], ...]:
    """The optional [overhead] table: (op kind, seconds per layer) of the keys given, each a number >= 0
    in microseconds (`schedc calibrate` fits them to profiles at two sizes)."""
    given = table.get("overhead")
    if not isinstance(given, dict):
        return ()
    diags += unknown_keys([k for k in given if k not in OVERHEAD_KEYS],
                          lambda k: f"unknown key 'overhead.{k}' (keys: {', '.join(OVERHEAD_KEYS)})",
                          lambda k: locate(source, k, "overhead"))
    out = []
    for key, kind in OVERHEAD_KEYS.items():
        value = given.get(key)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= MAX_FIGURE:
            diags.append(error(f"'overhead.{key}' must be a number in [0, {MAX_FIGURE:g}], got {value!r} "
                               f"(microseconds per layer of each {kind})", locate(source, key, "overhead")))
            continue
        out.append((kind, value * 1e-6))
    return tuple(out)


def _gpu_dtype(table: dict, source: Source, diags: list[Diagnostic]) -> str:
    """[gpu] dtype: what peak_tflops is the peak of (optional; bf16)."""
    gpu = table.get("gpu") if isinstance(table.get("gpu"), dict) else {}
    value = gpu.get("dtype", "bf16")
    if value not in DTYPE_BYTES:
        diags.append(error(f"'gpu.dtype' must be one of {', '.join(DTYPE_BYTES)}, got {value!r} (the dtype "
                           "peak_tflops is for)", locate(source, "dtype", "gpu")))
        return "bf16"
    return value


def _host_bandwidth(table: dict, source: Source, diags: list[Diagnostic]) -> float:
    """The optional [host] table's bandwidth_gbps in bytes/s: what an offload (O) or reload (L) of
    activations moves per second between a GPU and host memory; 0.0 without the table."""
    given = table.get("host")
    if not isinstance(given, dict):
        return 0.0
    diags += unknown_keys([k for k in given if k != "bandwidth_gbps"],
                          lambda k: f"unknown key 'host.{k}' (keys: bandwidth_gbps)", lambda k: locate(source, k, "host"))
    value = given.get("bandwidth_gbps")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not MIN_FIGURE <= value <= MAX_FIGURE:
        diags.append(error(f"'host.bandwidth_gbps' must be a number in [{MIN_FIGURE:g}, {MAX_FIGURE:g}], got "
                           f"{value!r} (GPU to host memory, GB/s per direction)", locate(source, "bandwidth_gbps", "host")))
        return 0.0
    return value * 1e9


def _memory_fields(table: dict, source: Source, diags: list[Diagnostic]) -> dict[str, float]:
    """The optional [memory] table in SI units: no table, no allowance (0); a table names both keys,
    each a number >= 0 (fragmentation below 1)."""
    given = table.get("memory")
    if not isinstance(given, dict):
        return {key: 0.0 for key in _MEMORY_FIELDS}
    diags += unknown_keys([k for k in given if k not in _MEMORY_FIELDS],
                          lambda k: f"unknown key 'memory.{k}' (keys: {', '.join(_MEMORY_FIELDS)})",
                          lambda k: locate(source, k, "memory"))
    out = {}
    for key, (scale, doc, upper) in _MEMORY_FIELDS.items():
        value = given.get(key)
        if value is None:
            diags.append(error(f"missing field 'memory.{key}' ({doc})", locate(source, key, "memory")))
            continue
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if number is None or not 0 <= number < (upper if upper is not None else MAX_FIGURE):
            want = f"a number in [0, {upper if upper is not None else MAX_FIGURE:g})"
            diags.append(error(f"'memory.{key}' must be {want}, got {value!r} ({doc})",
                               locate(source, key, "memory")))
            continue
        out[key] = number * scale
    return out


def dump_cluster(spec: ClusterSpec, comment: str = "") -> str:
    """A cluster description's TOML text (load_cluster reads it back to the same spec)."""
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + f"""name = "{spec.name}"

[gpu]{'' if spec.dtype == 'bf16' else chr(10) + 'dtype = "' + spec.dtype + '"'}
peak_tflops = {spec.peak_flops / 1e12!r}{chr(10) + 'fp8_tflops = ' + repr(spec.fp8_flops / 1e12) if spec.fp8_flops else ''}{chr(10) + 'sms = ' + str(spec.userbuffers.sms) if spec.userbuffers else ''}
memory_gib = {spec.memory_bytes / GIB!r}
hbm_gbps = {spec.hbm_bandwidth / 1e9!r}

[node]
gpus = {spec.gpus_per_node}

[intra]
bandwidth_gbps = {spec.intra_bandwidth / 1e9!r}
latency_us = {spec.intra_latency * 1e6!r}

[inter]
bandwidth_gbps = {spec.inter_bandwidth / 1e9!r}
latency_us = {spec.inter_latency * 1e6!r}

[efficiency]
gemm = {spec.gemm_efficiency!r}
gemm_half_dim = {spec.gemm_half_dim!r}
hbm = {spec.hbm_efficiency!r}
intra = {spec.intra_efficiency!r}
inter = {spec.inter_efficiency!r}{chr(10) + 'gemm_fp8 = ' + repr(spec.gemm_fp8_efficiency) if spec.gemm_fp8_efficiency else ''}

[memory]
reserved_gib = {spec.memory_reserved / GIB!r}
fragmentation = {spec.fragmentation!r}
""" + (f"""
[host]
bandwidth_gbps = {spec.host_bandwidth / 1e9!r}
""" if spec.host_bandwidth else "") + ("\n[overhead]\n" + "".join(
        f"{key} = {dict(spec.overhead)[kind] * 1e6!r}\n" for key, kind in OVERHEAD_KEYS.items()
        if kind in dict(spec.overhead)) if spec.overhead else "") + dump_attention(spec.attention) + dump_userbuffers(spec.userbuffers)


def check_layout(model: ModelSpec, layout: Layout, model_path: str, model_source: Source | None = None) -> None:
    """What the layout needs of the model and the batch; the first failure is a usage error (exit 2)
    naming the field: t divides heads (and hidden, ffn and vocab), b*d divides the global batch."""
    t = layout.tp
    for value, name in ((layout.tp, "--tp"), (layout.dp, "--dp"), (layout.cp, "--cp"), (layout.ep, "--ep"),
                        (layout.microbatch_size, "--microbatch-size")):
        if value < 1:
            raise usage(f"{name} must be a positive integer, got {value}")
    source = model_source or source_text(model_path)
    for key in ("heads", "hidden", "ffn", "vocab", "kv_heads"):
        value = getattr(model, key)
        if value % t:
            what = "key/value heads (Megatron-Core's query groups)" if key == "kv_heads" else key
            raise SchedError(error(f"--tp {t} does not divide '{key}' ({value}): tensor parallelism splits "
                                   f"the {what} {t} ways", model_span(source, key)), source, kind=USAGE)
    _check_sharding(model, layout, source)
    _check_torchtitan_forms(model, layout)
    check_experts(model, layout, source)
    if layout.global_batch is not None:
        unit = layout.microbatch_size * layout.dp
        if layout.global_batch < 1:
            raise usage(f"--global-batch must be a positive integer, got {layout.global_batch}")
        if layout.global_batch % unit:
            raise usage(f"--global-batch {layout.global_batch} is not a multiple of --microbatch-size x --dp "
                        f"= {layout.microbatch_size} x {layout.dp} = {unit}")


def _check_sharding(model: ModelSpec, layout: Layout, source: Source) -> None:
    """--cp splits the sequence into 2·cp equal chunks and needs a flash kernel (its ring computes
    attention block by block); --zero 3 refuses what describes another data parallelism: torch DDP's
    overlapped all-reduce of replicas (FSDP reduce-scatters its own gradients) and the distributed
    optimizer's switch (level 1) beside it."""
    if layout.zero not in ZERO_LEVELS:
        raise usage(f"--zero must be 0, 1, 2 or 3, got {layout.zero}")
    cp = layout.cp
    if cp > 1 and model.seq % (2 * cp):
        raise SchedError(error(f"--cp {cp} does not split the sequence of {model.seq:,} tokens into 2·cp = {2 * cp} "
                               "equal chunks (each rank holds chunks i and 2·cp-1-i)", model_span(source, "seq")),
                         source, kind=USAGE)
    if cp > 1 and not model.flash:
        raise SchedError(error(f"--cp {cp} needs a flash attention kernel (attention = \"flash\"): context "
                               "parallelism computes attention block by block as keys and values go round the "
                               "ring", model_span(source, "attention")), source, kind=USAGE)
    if cp > 1 and model.window is not None and model.window < model.seq:
        raise SchedError(error(f"--cp {cp} with a sliding window of {model.window:,} tokens: the ring's load-balanced "
                               "blocks are charged as causal attention over the whole sequence; give --cp 1",
                               model_span(source, "window")), source, kind=USAGE)
    if layout.zero == 3 and layout.overlap_grad_reduce:
        raise usage("--zero 3 with --overlap-grad-reduce is not supported: the flag describes torch DDP's "
                    "all-reduce of replicas, and level 3 reduce-scatters its gradients itself")
    if layout.zero in (2, 3) and layout.distributed_optimizer:
        raise usage(f"--zero {layout.zero} with --distributed-optimizer: the flag is --zero 1; give one level")


def _check_torchtitan_forms(model: ModelSpec, layout: Layout) -> None:
    """--eager is modelled for torchtitan's Llama block at t = 1. --recompute selective-ops is torchtitan's
    per-op policy on a dense block with a flash kernel, in 16 bits or under torchao's Float8 compiled, at
    any cp and at t > 1 with sequence parallelism (its only tensor parallelism); elsewhere what the policy
    saves differs (an MoE block has other matmuls, eager Float8 keeps every cast's abs(x), t > 1 without
    sequence parallelism all-reduces): a usage error naming what is not modelled."""
    if layout.eager and (layout.tp > 1 or model.moe or model.mla or (model.norm, model.positions, model.mlp) !=
                         ("rmsnorm", "rope", "swiglu")):
        raise usage("--eager is torchtitan's Llama block run without torch.compile (RMSNorm, rotary positions, SwiGLU) "
                    "at t = 1; this model or layout has another block")
    refusal = op_policy_refusal(model, layout) if layout.recompute == SELECTIVE_OPS else ""
    if refusal:
        raise usage(refusal)


def op_policy_refusal(model: ModelSpec, layout: Layout) -> str:
    """Why --recompute selective-ops is not modelled for this model and layout ("" where it is): the one
    rule the layout check and tune's candidates read."""
    other = [name for name, on in ((f"--tp {layout.tp} without --sequence-parallel",
                                    layout.tp > 1 and not layout.sequence_parallel),
                                   ("--fp8 with --eager", layout.fp8 and layout.eager),
                                   ("experts", model.moe or model.mla),
                                   ("attention without a flash kernel", not model.flash)) if on]
    return (f"--recompute selective-ops (torchtitan's per-op policy) is modelled for a dense model with a flash kernel, "
            f"compiled under --fp8, sequence-parallel at t > 1, not with {', '.join(other)}") if other else ""


def check_experts(model: ModelSpec, layout: Layout, source: Source) -> None:
    """--ep: a model with experts, ep dividing them (at the model's key) and the d x cp ranks it is carved
    from; t dividing the experts' width (each expert split as the dense MLP is, Megatron-Core's default
    expert tensor parallelism). A usage error naming the option (exit 2)."""
    ep, t = layout.ep, layout.expert_tp
    if layout.etp is not None:
        check_folding(model, layout)
    if model.moe and model.moe_ffn % t:
        given = "--tp" if layout.etp is None else "--etp"
        raise SchedError(error(f"{given} {t} does not divide 'moe_ffn' ({model.moe_ffn}): each expert's MLP is split "
                               f"{t} ways", model_span(source, "moe_ffn")), source, kind=USAGE)
    if ep == 1:
        return
    if not model.moe:
        raise usage(f"--ep {ep}: the model has no experts to place (expert parallelism needs an MoE model)")
    if model.experts % ep:
        raise SchedError(error(f"--ep {ep} does not divide the model's {model.experts} experts: each of the ep GPUs "
                               "holds experts / ep of them", model_span(source, "experts")), source, kind=USAGE)
    if layout.etp is None and (layout.dp * layout.cp) % ep:
        raise usage(f"--ep {ep} does not divide d x cp = {layout.dp} x {layout.cp} = {layout.dp * layout.cp}: the "
                    "expert-parallel groups are carved from the data and context ranks (Megatron-Core's "
                    "expert-data-parallel)")


def check_folding(model: ModelSpec, layout: Layout) -> None:
    """--etp (MoE parallel folding): a positive size, a model with experts, and the expert layout etp x ep x
    edp filling a stage's t x cp x d ranks (Megatron-Core's rule); a usage error naming the option (exit 2)."""
    etp, ranks = layout.etp, layout.tp * layout.cp * layout.dp
    if etp < 1:
        raise usage(f"--etp must be a positive integer, got {etp}")
    if not model.moe:
        raise usage(f"--etp {etp}: the model has no experts to split (expert tensor parallelism needs an MoE model)")
    if ranks % (etp * layout.ep):
        raise usage(f"--etp {etp} x --ep {layout.ep} = {etp * layout.ep} does not divide t x cp x d = {layout.tp} x "
                    f"{layout.cp} x {layout.dp} = {ranks}: the expert layout (expert tensor x expert parallel x expert "
                    "data parallel) is carved from a stage's ranks (Megatron-Core's MoE parallel folding)")


def check_switches(layout: Layout, cluster: ClusterSpec) -> None:
    """What the H100-era switches need, as Megatron-LM asserts it: --tp-comm-overlap sequence parallelism
    (its userbuffers overlap the all-gathers and reduce-scatters), --overlap-param-gather the distributed
    optimizer (its all-gather), --fp8 the cluster's FP8 peak ([gpu] fp8_tflops); a usage error (exit 2)."""
    if layout.tp_comm_overlap and not layout.sequence_parallel:
        raise usage("--tp-comm-overlap overlaps sequence parallelism's all-gathers and reduce-scatters with the "
                    "GEMMs: give --sequence-parallel too (as Megatron-LM requires)")
    if layout.overlap_param_gather and not layout.distributed_optimizer:
        raise usage("--overlap-param-gather overlaps the distributed optimizer's all-gather with the next forward: "
                    "give --distributed-optimizer too (as Megatron-LM requires)")
    if layout.fp8 and not cluster.fp8_flops:
        raise usage(f"--fp8: {cluster.name} gives no FP8 peak; add [gpu] fp8_tflops to its cluster file")
    if layout.fp8_current_scaling and not layout.fp8:
        raise usage("--fp8-current-scaling is how --fp8's casts are scaled: give --fp8 too")


def check_stages(model: ModelSpec, schedule, model_path: str, layout: Layout | None = None) -> None:
    """The model's layers divide over the schedule's stages (every stage the same layers), or the
    layout splits them (Layout.layer_split: --stage-layers, or the embedding and the loss counted as
    layers); a usage error at `layers` (exit 2)."""
    stages = schedule.stages
    if layout is not None and (layout.stage_layers or layout.account_for_embedding or layout.account_for_loss):
        try:
            layout.layer_split(model.layers, stages)
        except SplitError as exc:
            source = source_text(model_path)
            raise SchedError(error(str(exc), model_span(source, "layers")), source, kind=USAGE) from None
        return
    if model.layers % stages:
        source = source_text(model_path)
        params = ", ".join(f"{k}={v}" for k, v in schedule.params.items())
        raise SchedError(error(f"'layers' ({model.layers}) must be a multiple of the schedule's {stages} "
                               f"stages ({schedule.name}: {params})", model_span(source, "layers")), source,
                         kind=USAGE)
