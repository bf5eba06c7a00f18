"""The layout of a run: how t x p x d GPUs hold the model, as one frozen value read by the cost model,
`tune` and the runtime, and the one rank order they share.

Ranks follow Megatron-Core's order, tp-cp-dp-pp: tensor innermost (a tensor group is t consecutive ranks,
so it sits in one node whenever t divides the node's GPUs), then context, then data, then pipeline:

    rank = ((pipeline * d + data) * cp + context) * t + tensor

With cp = 1 this is Megatron-LM's order of before context parallelism, so every layout without it keeps
its ranks (and its predictions). Llama 3's [TP, CP, PP, DP] puts data outside pipeline; the two agree
wherever t·cp fills a node (torchtitan's and Llama 3's 405B runs: t = 8), and keeping data inside
pipeline leaves rank_at's arguments what they were.

This module imports nothing of schedc, so the runtime (which may take only the plan format, the ops
and this) reads the same value and the same order as the cost model.
"""
from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE = ("full", "selective", "none")  # as the options list them: Megatron-LM's Table 1 first
SELECTIVE_OPS = "selective-ops"  # torchtitan's per-op selective checkpointing (the cost model's; not searched by default)
RECOMPUTE_FORMS = RECOMPUTE + (SELECTIVE_OPS,)  # every --recompute the options take


@dataclass(frozen=True, slots=True)
class Layout:
    """How the model is laid out: tensor parallel t, data parallel d, microbatch size b, global batch,
    recomputation, sequence parallelism, gradient all-reduce overlapped with the backward (torch DDP)
    or after it (Megatron's local DDP), the scatter/gather of pipeline messages over t links,
    whether a send holds its sender until the message is through (Megatron-LM's point-to-point calls
    wait for both ends) or not (schedc's runtime: isend, waited for before the buffer is reused), and
    the distributed optimizer (Megatron-LM's --use-distributed-optimizer, ZeRO stage 1): the fp32
    master weights, Adam's moments and the step's fp32 gradients sharded over the GPUs holding a stage,
    the gradients reduce-scattered and the weights all-gathered instead of all-reduced."""

    tp: int = 1
    dp: int = 1
    microbatch_size: int = 1
    global_batch: int | None = None
    recompute: str = "full"
    sequence_parallel: bool = False
    overlap_grad_reduce: bool = False
    scatter_gather: bool = True
    blocking_p2p: bool = False  # sends hold the sender until the message is through (Megatron-LM)
    distributed_optimizer: bool = False  # optimizer state sharded over data parallelism (ZeRO stage 1)
    stage_layers: tuple[int, ...] | None = None  # transformer layers per stage as given (--stage-layers)
    account_for_embedding: bool = False  # the even split counts the embedding as a layer of the first stage
    account_for_loss: bool = False       # and the output layer and loss as one of the last (split_layers)
    tp_comm_overlap: bool = False        # TP all-gathers/reduce-scatters overlapped with their GEMMs (userbuffers)
    overlap_param_gather: bool = False   # the distributed optimizer's all-gather under the next step's forward
    fp8: bool = False                    # the layers' GEMMs in FP8 (Transformer Engine)
    zero: int = 0                        # ZeRO level 2 (+ the gradients) or 3 (+ the parameters) over data
                                         # parallelism; level 1 is distributed_optimizer's, one value for it
    reshard_after_forward: bool = True   # level 3: parameters freed after each forward (FSDP2's default)
    cp: int = 1                          # context parallelism: the sequence over cp GPUs in 2·cp chunks
    ep: int = 1                          # expert parallelism: the experts over ep of the d x cp ranks
    post_validation: bool = False        # no all-reduce before the optimizer step: a device starts its next
                                         # step once its own is done, so steps overlap (Qi et al. 2024, sec. 4)
    etp: int | None = None               # expert tensor parallelism (MoE parallel folding): each expert split
                                         # over etp GPUs, independent of t; None: t (the experts split as the MLP)
    moe_dispatcher: str | None = None    # the MoE token dispatcher: alltoall (a copy per expert) or flex (DeepEP:
                                         # once per GPU and per node); None: the model's (costmodel/experts.py)
    eager: bool = False                  # the block's elementwise work unfused, kernel by kernel (torchtitan
                                         # without torch.compile), not in fused kernels
    fp8_current_scaling: bool = False    # with fp8: each cast's scale from its tensor's own amax, one more read
                                         # (Transformer Engine's Float8CurrentScaling, Megatron-LM --fp8-recipe tensorwise)

    def __post_init__(self):
        if self.zero == 1:  # --zero 1 is the distributed optimizer: one value for level 1
            object.__setattr__(self, "zero", 0)
            object.__setattr__(self, "distributed_optimizer", True)

    @property
    def sharding(self) -> int:
        """The ZeRO level in force: `zero`, or 1 for the distributed optimizer (its alias).

        >>> Layout(zero=1) == Layout(distributed_optimizer=True), Layout(zero=3).sharding
        (True, 3)
        """
        return max(self.zero, 1 if self.distributed_optimizer else 0)

    @property
    def expert_tp(self) -> int:
        """Over how many GPUs each expert is split: etp where given, else t (Megatron-Core's default).

        >>> Layout(tp=2).expert_tp, Layout(tp=2, etp=1).expert_tp
        (2, 1)
        """
        return self.tp if self.etp is None else self.etp

    def layer_split(self, layers: int, stages: int) -> tuple[int, ...]:
        """The transformer layers of each of `stages` stages under this layout (split_layers)."""
        return split_layers(layers, stages, self.stage_layers, self.account_for_embedding, self.account_for_loss)

    def microbatches(self) -> int | None:
        """m = global batch / (b * d) per pipeline, or None without a global batch."""
        if self.global_batch is None:
            return None
        return self.global_batch // (self.microbatch_size * self.dp)


def flag(name: str) -> str:
    """The command-line flag of a layout field: sequence_parallel -> --sequence-parallel."""
    return "--" + name.replace("_", "-")


def switches_on(layout) -> list[str]:
    """The switches that are on, in words (a Layout, or a plan's "cluster" metadata as a dict)."""
    get = layout.get if isinstance(layout, dict) else lambda name: getattr(layout, name)
    return [words for name, words, _ in SWITCHES if get(name)]


def run_flags(layout: Layout) -> list[str]:
    """The flags of `schedc run` / `python -m schedc.runtime` that lay a run out as `layout`: each runtime
    option of LAYOUT_OPTIONS, in its order (a number or a choice always, a switch where it is not at its
    default, the layer split where given); the runtime reads them back into the same value (opts.layout)."""
    return option_flags(layout, [option.field for option in LAYOUT_OPTIONS if option.runtime])


def option_flags(layout: Layout, fields) -> list[str]:
    """The flags that give `fields` of `layout`, in LAYOUT_OPTIONS' order: a number or a choice always
    (an `implied` one only off its default), a switch where it is not at its default, a list where given."""
    flags = []
    for option in LAYOUT_OPTIONS:
        value = getattr(layout, option.field)
        at_default = value == option.default()
        if option.field not in fields or value is None or ((option.type is bool or option.implied) and at_default):
            continue
        flags += [option.flag] if option.type is bool else [option.flag, _text(value)]
    return flags


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


# The layer split's fields, each a flag of the same name on simulate/compile/render --cluster, tune and the
# runtime (--stage-layers 2,3,3,2, --account-for-embedding, --account-for-loss).
SPLIT_NAMES = ("stage_layers", "account_for_embedding", "account_for_loss")


def split_flags(layout) -> list[str]:
    """The flags that give a layout's layer split (none for the even split); `layout` is a Layout or
    anything with its SPLIT_NAMES fields (tune's request)."""
    flags = [] if layout.stage_layers is None else ["--stage-layers", ",".join(map(str, layout.stage_layers))]
    return flags + [flag(name) for name in SPLIT_NAMES[1:] if getattr(layout, name)]


def parse_stage_layers(text: str) -> tuple[int, ...]:
    """--stage-layers 2,3,3,2 -> (2, 3, 3, 2); SplitError for anything but counts.

    >>> parse_stage_layers("2, 3,3")
    (2, 3, 3)
    """
    words = [w.strip() for w in text.split(",")]
    if not all(w.isascii() and w.isdigit() and len(w) <= 9 for w in words):
        raise SplitError(f"--stage-layers {text!r}: give one layer count per stage, as 2,3,3,2")
    return tuple(int(w) for w in words)


@dataclass(frozen=True, slots=True)
class Coordinates:
    """Where one GPU sits: its pipeline device (the plan's rank), data-parallel replica, tensor rank,
    context-parallel rank."""

    pipeline: int
    data: int
    tensor: int
    context: int = 0


def rank_at(pipeline: int, data: int, tensor: int, tp: int, dp: int, context: int = 0, cp: int = 1) -> int:
    """The global rank of a (pipeline, data, tensor, context) coordinate: tensor innermost, then
    context, then data.

    >>> rank_at(1, 0, 1, tp=2, dp=2, context=1, cp=2), rank_at(1, 1, 0, tp=2, dp=2)
    (11, 6)
    """
    return ((pipeline * dp + data) * cp + context) * tp + tensor


def coordinates(rank: int, tp: int, dp: int, cp: int = 1) -> Coordinates:
    """The (pipeline, data, tensor, context) coordinate of a global rank; the inverse of rank_at."""
    group, tensor = divmod(rank, tp)
    group, context = divmod(group, cp)
    pipeline, data = divmod(group, dp)
    return Coordinates(pipeline, data, tensor, context)


SHARDING_NAMES = ("zero", "reshard_after_forward", "cp")  # the Layout fields of --zero, --[no-]reshard-after-forward, --cp
ZERO_LEVELS = (0, 1, 2, 3)  # --zero: 1 the optimizer state (the distributed optimizer), 2 + gradients, 3 + parameters


def reshard_problem(reshard: bool | None, zero: int | None) -> str | None:
    """Why --reshard-after-forward / --no-reshard-after-forward (`reshard`: None when not given) cannot go
    with --zero `zero`, or None: only level 3 shards the parameters it gathers.

    >>> reshard_problem(False, 2)
    '--no-reshard-after-forward needs --zero 3 (only level 3 shards the parameters it gathers)'
    """
    if reshard is None or zero == 3:
        return None
    return (f"{flag('reshard_after_forward' if reshard else 'no_reshard_after_forward')} needs --zero 3 (only "
            "level 3 shards the parameters it gathers)")


@dataclass(frozen=True, slots=True)
class ClusterRequest:
    """The command line's cluster options: files and the layout (microbatch size from --microbatch-size)."""

    model: str
    cluster: str
    layout: Layout
    seq: int | None = None  # --seq: the run's sequence length over the description's


class SplitError(ValueError):
    """A split of the model's layers over the pipeline's stages that cannot be (the message names the
    option to change)."""


def split_layers(layers: int, stages: int, explicit: tuple[int, ...] | None = None,
                 embedding: bool = False, loss: bool = False) -> tuple[int, ...]:
    """Transformer layers per pipeline stage: `explicit` as given (--stage-layers: one count per stage,
    each at least one, summing to `layers`), else as even as can be, earlier stages taking the
    remainder, the embedding (on the first stage) and the loss (on the last) each counted as a layer
    when `embedding` / `loss` are set (Megatron-LM's --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split): the end stages then hold one layer fewer, down to none.

    >>> split_layers(8, 3), split_layers(8, 3, (2, 3, 3)), split_layers(6, 4, embedding=True, loss=True)
    ((3, 3, 2), (2, 3, 3), (1, 2, 2, 1))
    """
    if explicit is not None:
        return _explicit_split(layers, stages, explicit, embedding or loss)
    if stages == 1:
        return (layers,)
    units = layers + embedding + loss
    if units < stages or (not (embedding or loss) and layers < stages):
        ends = " with the embedding and the loss counted as layers" if embedding and loss else \
            " with the embedding counted as a layer" if embedding else " with the loss counted as a layer" if loss else ""
        raise SplitError(f"the plan has {stages} model stages but the model has {layers} layers to split{ends}; "
                         f"every stage needs at least one (use --layers {stages - embedding - loss} or more)")
    size, extra = divmod(units, stages)
    counts = [size + (s < extra) for s in range(stages)]
    counts[0] -= embedding
    counts[-1] -= loss  # at least 0: every stage had a unit at least
    return tuple(counts)


def _explicit_split(layers: int, stages: int, explicit: tuple[int, ...], accounted: bool) -> tuple[int, ...]:
    given = ",".join(map(str, explicit))
    if accounted:
        raise SplitError(f"--stage-layers {given} gives every stage's layers; --account-for-embedding and "
                         "--account-for-loss only change the even split: give one or the other")
    if len(explicit) != stages:
        raise SplitError(f"--stage-layers {given} names {len(explicit)} stages; the plan has {stages}")
    if min(explicit) < 1:
        empty = [s for s, n in enumerate(explicit) if n < 1]
        raise SplitError(f"--stage-layers {given}: stage {empty[0]} has no layer; every stage needs at least one")
    if sum(explicit) != layers:
        raise SplitError(f"--stage-layers {given} sums to {sum(explicit)} layers; the model has {layers} (--layers)")
    return tuple(explicit)


# Every layout option, each declared once: the command line's (schedc/cli/options.py makes each a click
# option for compile, check, simulate, render, tune and calibrate) and the runtime's (runtime/process/options.py
# generates its argparse options from the entries marked `runtime`). Plain data: no click, no argparse.

@dataclass(frozen=True, slots=True)
class LayoutOption:
    """One layout option: the Layout field it sets (its flag is the field's name, `flag`), what it does,
    its type (bool: an on/off switch, `--NAME`, or `--no-NAME` for one on by default; int; str; tuple: a
    comma-separated list of layer counts, read by `parse`), and where a verb's default differs from
    Layout's the verb's own (`defaults`: verb -> value, stated in each --help)."""

    field: str
    help: str
    type: type = bool
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    runtime: bool = True                            # `python -m schedc.runtime` takes it
    searched: str | None = None                     # tune's help for a comma list of values to search
    defaults: tuple[tuple[str, object], ...] = ()   # (verb, its default) where it is not Layout's
    aliases: tuple[str, ...] = ()                   # old spellings, accepted and not shown (the runtime's)
    words: str | None = None                        # a switch's name where predictions and tune list it
    both: bool = False                              # a switch given either way (--NAME/--no-NAME), None if not
    implied: bool = False                           # a number left out of a command at its default (--zero 0)

    @property
    def flag(self) -> str:
        """The one spelling: --microbatch-size, --sequence-parallel; --no-scatter-gather for a switch on
        by default."""
        on = self.type is bool and self.default() is True
        return "--no-" + self.field.replace("_", "-") if on else flag(self.field)

    def default(self, verb: str | None = None):
        """The value a verb takes when the option is not given: its own, else Layout's."""
        return dict(self.defaults).get(verb, getattr(Layout(), self.field))

    def parse(self, text: str):
        """A value of this option from its command-line text (only tuple options need one)."""
        return parse_stage_layers(text) if self.type is tuple else self.type(text)


LAYOUT_OPTIONS: tuple[LayoutOption, ...] = (
    LayoutOption("tp", "Tensor-parallel size t: tensor-parallel ranks per stage, Megatron-LM's", int, "T",
                 searched="Only these tensor-parallel sizes"),
    LayoutOption("dp", "Data-parallel size d: replicas of the whole pipeline (world = t x devices x d)", int, "D"),
    LayoutOption("microbatch_size", "Microbatch size b: sequences per microbatch", int, "SIZE",
                 searched="Only these microbatch sizes (sequences)", defaults=(("runtime", None), ("calibrate", None)),
                 aliases=("--mb-size",)),
    LayoutOption("global_batch", "Global batch B in sequences: m = B / (b d) unless -D m= is given", int, "BATCH",
                 runtime=False),
    LayoutOption("recompute", "Activation recomputation: full recomputes each layer in its backward, selective only "
                 "the attention core (score product, softmax, value product), none keeps everything, selective-ops "
                 "keeps what torchtitan's per-op policy saves (the flash attention's output and every other matmul's, "
                 "selective_ac_option 'op') and recomputes the rest", str,
                 choices=RECOMPUTE_FORMS, searched="Recomputation choices to search (default all three)",
                 defaults=(("runtime", "none"), ("calibrate", "none"))),
    LayoutOption("sequence_parallel", "Sequence parallelism (with t > 1): layer norms and residuals on 1/t of the "
                 "sequence, reduce-scatter/all-gather around the tensor-parallel layers (Korthikanti et al. 2022)", words="sequence parallel"),
    LayoutOption("overlap_grad_reduce", "The data-parallel all-reduce overlaps the last backward (torch DDP)",
                 words="overlapped gradient reduce"),
    LayoutOption("blocking_p2p", "A send holds its sender until the message is through, as Megatron-LM's "
                 "point-to-point calls do (default: it does not, as in schedc's runtime)", runtime=False, words="blocking sends"),
    LayoutOption("distributed_optimizer", "Shard the optimizer state over data parallelism (Megatron-LM's "
                 "--use-distributed-optimizer, ZeRO stage 1): each data-parallel rank steps 1/d of the weights", words="distributed optimizer"),
    LayoutOption("scatter_gather", "Send each pipeline message whole from every tensor rank (default: with t > 1 each "
                 "sends 1/t of it and the receivers all-gather)"),
    LayoutOption("stage_layers", "Transformer layers of each pipeline stage, e.g. 2,3,3 (one count a stage, each at "
                 "least one, summing to the model's layers; default: as even as can be, earlier stages taking the "
                 "remainder)", tuple, "N,N,..."),
    LayoutOption("account_for_embedding", "Count the embedding as a layer of the first stage in the even split "
                 "(Megatron-LM's --account-for-embedding-in-pipeline-split)"),
    LayoutOption("account_for_loss", "Count the output layer and loss as a layer of the last stage in the even split "
                 "(Megatron-LM's --account-for-loss-in-pipeline-split)"),
    LayoutOption("tp_comm_overlap", "Overlap sequence parallelism's all-gathers and reduce-scatters with the "
                 "neighbouring GEMMs, charging what a GEMM cannot hide (Megatron-LM's --tp-comm-overlap, Transformer "
                 "Engine userbuffers; needs --sequence-parallel)", runtime=False, words="TP communication overlap"),
    LayoutOption("overlap_param_gather", "The distributed optimizer's all-gather of the weights overlaps the next "
                 "step's forward (Megatron-LM's --overlap-param-gather; needs --distributed-optimizer)", runtime=False,
                 words="overlapped parameter gather"),
    LayoutOption("fp8", "The transformer layers' GEMMs at the GPU's FP8 rate ([gpu] fp8_tflops) with Transformer "
                 "Engine's casts through HBM and FP8 inputs kept for the backward (Megatron-LM's --fp8-format hybrid)",
                 runtime=False, words="FP8"),
    LayoutOption("zero", "ZeRO level over data (x context) parallelism: 1 the optimizer state (the distributed "
                 "optimizer), 2 + gradients reduce-scattered each microbatch, 3 + parameters sharded and gathered for "
                 "each stage's compute", int, "0|1|2|3", implied=True, defaults=(("runtime", None),)),
    LayoutOption("reshard_after_forward", "With --zero 3: free a stage's gathered parameters after each forward "
                 "(FSDP2's default) or keep them until its last backward", both=True,
                 defaults=(("runtime", None),)),
    LayoutOption("cp", "Context-parallel size: the sequence over cp GPUs in 2·cp chunks, GPU i holding chunks i and "
                 "2·cp-1-i (world = t x cp x devices x d)", int, "CP", implied=True),
    LayoutOption("ep", "Expert-parallel size: each MoE layer's experts over ep GPUs carved from the d x cp data "
                 "and context ranks (Megatron-Core's expert-data-parallel: the expert weights' gradients reduced over "
                 "d x cp / ep), tokens sent to their experts' GPUs by an all-to-all and back (ep divides d x cp and the "
                 "experts)", int, "EP", implied=True,
                 searched="Only these expert-parallel sizes (default, for a model with experts: every ep dividing "
                          "its experts and d x cp)"),
    LayoutOption("post_validation", "The optimizer's post-validation (zero bubble's --enable-optimizer-post-validation): "
                 "no all-reduce before the optimizer step, so each device starts its next step once its own is done "
                 "and steps overlap; the iteration is the steady step's (two steps' makespan less one's, plus the "
                 "optimizer's tail)", runtime=False, words="optimizer post-validation"),
    LayoutOption("etp", "Expert tensor-parallel size (Megatron-Core's MoE parallel folding): each expert's MLP split "
                 "over etp GPUs, and the expert layout etp x ep x (expert data parallel) carved from a stage's t x cp x d "
                 "ranks, expert tensor innermost, independently of the attention's t (etp x ep divides t x cp x d; "
                 "default t: ep carved from d x cp)", int, "ETP", runtime=False),
    LayoutOption("moe_dispatcher", "The MoE token dispatcher (Megatron-Core's --moe-token-dispatcher-type): alltoall "
                 "sends each token once per chosen expert; flex (DeepEP, HybridEP) once per GPU it reaches, and across "
                 "nodes once per node, forwarded there over NVLink (default: flex for a model with group-limited "
                 "routing, DeepSeek-V3's node-limited dispatch, else alltoall)", str, "KIND", ("alltoall", "flex"),
                 runtime=False),
    LayoutOption("eager", "The Llama block's elementwise work run eagerly, one kernel a torch op (torchtitan without "
                 "torch.compile: RMSNorm in fp32, complex rotary, repeat_kv's copies, SiLU and the product apart, each "
                 "through HBM) instead of in fused kernels", runtime=False, words="eager elementwise"),
    LayoutOption("fp8_current_scaling", "With --fp8: per-tensor current scaling (Megatron-LM's --fp8-recipe "
                 "tensorwise, Megatron-Bridge's FP8-CS): Transformer Engine reads each cast's 16-bit input once more "
                 "for its amax before the cast (default: delayed scaling, the amax taken in the cast)", runtime=False,
                 words="FP8 current scaling"),
)
OPTION = {option.field: option for option in LAYOUT_OPTIONS}

# The on/off switches that change a prediction, in the order predictions and tune's winner name them
# (switches_on): (field, words, help).
SWITCHES: tuple[tuple[str, str, str], ...] = tuple((o.field, o.words, o.help) for o in LAYOUT_OPTIONS if o.words)
SWITCH_NAMES = tuple(name for name, _, _ in SWITCHES)
# What the runtime runs of a layout's switches (its own flags); blocking_p2p describes other runtimes to the
# cost model (Megatron-LM's blocking sends) and is not its option. overlap_grad_reduce is: the runtime's
# buckets (runtime/execution/buckets.py).
RUNTIME_SWITCHES = tuple(name for name in SWITCH_NAMES if OPTION[name].runtime)
