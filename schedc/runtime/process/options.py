# Command-line options of the runtime (`python -m schedc.runtime --help`).
# Model sizes come from the defaults, then the model description (--model: a TOML file, a Hugging Face
# config.json or a library name, read by description.py), then explicit options.
from __future__ import annotations

import argparse
import math
import os

from schedc.descriptions import code_given_as_model, parameters
from schedc.layout import LAYOUT_OPTIONS, OPTION, SELECTIVE_OPS, Layout, flag

from .description import DEFAULT_MODEL, DescriptionFileError, not_dense, read_description
from ..errors import UserError
from ..model.gpt import ModelConfig, model_problem, uses_gpt
from . import compose

MIN_TIMEOUT = 1.0  # seconds: under it the ranks' rendezvous store times out before they meet (0.01 did)
MODEL_KEYS = tuple(DEFAULT_MODEL)


class OptionError(UserError):
    """Options that do not make sense together."""


class _Parser(argparse.ArgumentParser):
    """Usage errors become OptionError, so only rank 0 prints them."""

    def error(self, message: str):
        raise OptionError(f"{message}\n{self.format_usage().strip()}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m schedc.runtime",
        description="Execute a schedc plan with torch.distributed: launch one process per rank with "
                    "`torchrun --nproc-per-node P -m schedc.runtime plan.json [options]` "
                    "(P = plan devices x --dp), or `schedc run plan.json --nproc P`.",
        epilog="Several machines: give torchrun's own rendezvous flags after `--`, the same on every "
               "node but --node-rank, e.g. `schedc run plan.json --nproc 4 -- --nnodes 2 "
               "--node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id job1` "
               "(--nproc is per node; --standalone is then left out).")
    parser.add_argument("plan", help="plan.json written by `schedc compile`")
    _model_options(parser.add_argument_group("model"))
    _layout_options(parser.add_argument_group("layout (the options of schedc simulate --cluster and tune)"))
    _training_options(parser.add_argument_group("data and training"))
    _output_options(parser.add_argument_group("measurement and dumps"))
    _fault_options(parser.add_argument_group("faults and checkpoints"))
    return parser


def _model_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--model", metavar="TOML|NAME",
                       help="the model description: a TOML file, a Hugging Face config.json (with --seq) or a "
                            "library name (gpt-1.7b; the files of schedc/models/), the same --model schedc "
                            "check/simulate/tune read. A TOML file's keys layers, hidden, heads, seq, vocab, mb_size "
                            "(or microbatch_size) at top level or in a [model] table, and the model facts kv_heads, "
                            "ffn, mlp, norm, norm_eps, positions, rope_theta, tied_embeddings, bias, family, "
                            "max_positions (docs/models.md); other keys reach a user model as ModelConfig.extra")
    group.add_argument("--config", metavar="TOML", help=argparse.SUPPRESS)  # the old spelling of --model
    group.add_argument("--model-code", dest="model_code", metavar="PKG.MOD:FN",
                       help="user model code: FN(ModelConfig) returns a list of (name, nn.Module) pieces, the "
                            "first taking token ids, the last returning logits (docs/models.md; default: GPT)")
    group.add_argument("--layers", type=int, help="transformer blocks (default 4)")
    group.add_argument("--hidden", type=int, help="hidden size (default 64)")
    group.add_argument("--heads", type=int, help="attention heads (default 4)")
    group.add_argument("--kv-heads", dest="kv_heads", type=int,
                       help="key/value heads, dividing --heads (default: the description's, else --heads); "
                            "needed with --heads where the description states grouped-query heads")
    group.add_argument("--ffn", type=int,
                       help="the MLP's width (default: the description's, else 4 x hidden); needed with "
                            "--hidden where the description states a width of its own (a SwiGLU's)")
    group.add_argument("--seq", type=int, help="sequence length (default 64)")
    group.add_argument("--vocab", type=int, help="vocabulary size, >= 256 for byte text (default 256)")


def _layout_options(group: argparse._ArgumentGroup) -> None:
    """The layout's options, generated from the one table the compiler's take theirs from
    (schedc.layout.LAYOUT_OPTIONS): name, type, choices, the runtime's default, help; old spellings hidden."""
    for option in LAYOUT_OPTIONS:
        if not option.runtime:
            continue
        default = option.default("runtime")
        if option.type is bool and option.both:  # --NAME/--no-NAME: None when neither is given
            group.add_argument(flag(option.field), dest=option.field, action=argparse.BooleanOptionalAction,
                               default=None, help=option.help)
            continue
        if option.type is bool:
            group.add_argument(option.flag, dest=option.field, action="store_false" if default else "store_true",
                               help=option.help)
            continue
        shown = f" (default {_UNSET.get(option.field, '') if default is None else default})".replace(" ()", "")
        kind = {"type": _reader(option), "default": default, "choices": option.choices or None,
                "metavar": option.metavar}
        group.add_argument(option.flag, dest=option.field, help=option.help + shown, **kind)
        for alias in option.aliases:
            group.add_argument(alias, dest=option.field, help=argparse.SUPPRESS, **kind)


_UNSET = {"microbatch_size": "the --model file's mb_size, else 4",  # the defaults the model decides
          "zero": "0, none; --distributed-optimizer is 1"}


def _reader(option):
    """argparse's type for an option: its parse, a bad value argparse's usage error."""
    def read(text: str):
        try:
            return option.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    read.__name__ = option.type.__name__  # argparse names it in "invalid int value"
    return read


def _training_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--seed", type=int, default=0, help="seed of weights and batches (default 0)")
    group.add_argument("--synthetic", action="store_true",
                       help="random tokens instead of byte-level Python source text")
    group.add_argument("--data", metavar="PKG.MOD:FN",
                       help="user data: FN(ModelConfig, seed) returns an object whose batch(step, "
                            "microbatches, size) gives a schedc.runtime.model.data.Batch (default: text)")
    group.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    group.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    group.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    group.add_argument("--lr-warmup-steps", type=int, default=0, metavar="N",
                       help="raise the learning rate linearly over the first N steps, to --lr at step N-1")
    group.add_argument("--lr-decay-steps", type=int, metavar="N",
                       help="after the warm-up, decay the learning rate to 0 along a cosine, reaching it at "
                            "step N (counted from the first, warm-up included; default: no decay)")
    group.add_argument("--clip-grad", type=float, metavar="NORM",
                       help="scale the gradients down to this global norm (over every stage of every "
                            "pipeline and data-parallel rank) where it is larger")
    group.add_argument("--dtype", choices=("fp32", "bf16", "bf16-main"), default="fp32",
                       help="bf16: mixed precision, the forward and backward under bf16 autocast with fp32 "
                            "weights, gradients and optimizer state; bf16-main: Megatron-LM's, bf16 weights, "
                            "activations and messages (no autocast), gradients added per microbatch into fp32 "
                            "main gradients (reduced in fp32), the optimizer stepping fp32 main weights "
                            "(default fp32)")
    group.add_argument("--bucket-size", type=int, metavar="ELEMENTS",
                       help="with --overlap-grad-reduce: gradient elements per bucket (default Megatron-LM's, "
                            "max(40,000,000, 1,000,000 x --dp))")
    group.add_argument("--loss", metavar="PKG.MOD:FN",
                       help="user loss: FN(logits, targets) returns a microbatch's mean loss (default: "
                            "cross entropy over the tokens)")
    group.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="auto: CUDA with NCCL when available, else CPU with gloo")
    group.add_argument("--tf32", choices=("on", "off"), default="on",
                       help="on CUDA with --dtype fp32: fp32 matrix products and convolutions in TF32 "
                            "(10-bit mantissa inputs, fp32 sums; default on); off for full fp32")
    group.add_argument("--threads", type=int, metavar="N",
                       help="torch intra-op threads per process (default: torch's choice; torchrun "
                            "sets 1 per process when it starts several)")
    group.add_argument("--reference", action="store_true",
                       help="train the unpartitioned model in this one process on the whole batch")
    group.add_argument("--tasks", action="append", default=[], metavar="PKG.MOD",
                       help="import a module that registers user task handlers (repeatable)")
    group.add_argument("--ignore-tasks", action="store_true",
                       help="run user tasks that have no handler as no-ops")


def _output_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--save-grads", metavar="DIR",
                       help="write DIR/grads.pt (first step's gradients by the unpartitioned model's "
                            "parameter names, after sync, before the optimizer), DIR/loss.json and "
                            "DIR/sent.json (the pipeline message bytes each rank sent in that step)")
    group.add_argument("--compare-to-reference", action="store_true",
                       help="after the run, train the one-process reference on the same data and print the "
                            "largest relative gradient and loss differences of the first step, per parameter "
                            "group and overall; exit 1 past --tolerance (schedc run only)")
    group.add_argument("--tolerance", type=float, metavar="REL",
                       help="with --compare-to-reference: the largest relative difference accepted (default "
                            "1e-5, or 1e-2 with --dtype bf16)")
    group.add_argument("--trace-out", metavar="FILE",
                       help="Chrome/Perfetto trace of every instruction (on CUDA, any of the "
                            "--*-out measurements times instructions with device events read at each step's end)")
    group.add_argument("--report-out", metavar="FILE", help="measured-vs-simulated report as JSON")
    group.add_argument("--profile-out", metavar="FILE",
                       help="measured mean cost per op kind and stage, for `schedc compile --costs`")
    group.add_argument("--warmup", type=int, default=None,
                       help="steps left out of report and profile (default 1 when steps > 1)")
    group.add_argument("--metrics-out", metavar="FILE",
                       help="one JSON line per step (step, loss, seconds, tokens_per_s) from rank 0")
    group.add_argument("--quiet", action="store_true", help="no per-step lines")
    group.add_argument("--log-every", type=int, default=1, metavar="N",
                       help="read the loss (one all-reduce over the ranks and one host read, the step's only "
                            "synchronization) every N steps, and at the last; its line and --metrics-out record "
                            "that step's loss and the mean time of the steps since the last; with --quiet and "
                            "no --metrics-out never (default 1)")
    group.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")


def _fault_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                       help="give up when a rank makes no progress for this long (default 300)")
    group.add_argument("--save", metavar="DIR",
                       help="checkpoint directory: a checkpoint after the last step, or every N steps "
                            "with --every. Only the latest checkpoint is kept: each one, once complete, "
                            "replaces the one before (DIR/step-N, DIR/latest.json)")
    group.add_argument("--every", type=int, default=0, metavar="N", help="checkpoint every N steps")
    group.add_argument("--resume", metavar="DIR", help="continue from the latest checkpoint in DIR")
    group.add_argument("--overwrite", action="store_true",
                       help="let --save DIR replace a checkpoint already there (refused without it)")
    group.add_argument("--fault-kill", metavar="RANK:STEP",
                       help="for testing fault handling only: rank RANK kills itself halfway "
                            "through step STEP")
    group.add_argument("--fault-stop", metavar="RANK:STEP",
                       help="for testing fault handling only: rank RANK stops itself (SIGSTOP) halfway "
                            "through step STEP, as a process frozen by the system would")
    group.add_argument("--fault-hang", metavar="RANK:STEP",
                       help="for testing fault handling only: rank RANK stops making progress "
                            "halfway through step STEP")


MAX_THREADS = 1024
MAX_PARAMETERS = 10 ** 11  # far past what one process can hold; refused before torch tries to allocate it
MAX_LAYERS = 4096  # the deepest models have a few hundred blocks; building 100,000 modules ran for minutes


def model_parameters(cfg: ModelConfig) -> float:
    """About how many weights the default GPT of these sizes has (embeddings, head, 12 h^2 a block), or
    the decoder of these facts (schedc.descriptions.parameters: its MLP width and key/value heads); a
    float, so that absurd sizes do not make absurd integers."""
    try:
        if not uses_gpt(cfg):
            return float(parameters(cfg))
        hidden = float(cfg.hidden)
        return 2 * float(cfg.vocab) * hidden + float(cfg.seq) * hidden + float(cfg.layers) * 12 * hidden * hidden
    except OverflowError:  # a size past 1e308
        return float("inf")


def gpt_bytes(cfg: ModelConfig, microbatches: int) -> float:
    """About the memory one step of the default GPT takes over all its ranks: weights, gradients and
    AdamW's two moments (4 x 4 bytes a parameter), and every microbatch's saved activations (a block
    keeps about 16 hidden-wide values a token and its attention scores, heads x seq a token; the loss
    its logits and their log-softmax, two vocabulary-wide values a token). A float: absurd sizes give
    inf, not absurd integers."""
    try:
        tokens = float(microbatches) * cfg.mb_size * cfg.seq
        blocks = 4 * cfg.layers * tokens * (16.0 * cfg.hidden + 2.0 * cfg.heads * cfg.seq)
        return 16 * model_parameters(cfg) + blocks + 4 * tokens * 2.0 * cfg.vocab
    except OverflowError:
        return float("inf")


DEPRECATED = {"--config": "--model"}  # old spelling: the one that replaces it


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    opts = build_parser().parse_args(argv)
    opts.notes = _renamed(opts)
    opts.model_config = model_config(opts)
    opts.fault = (_parse_fault("--fault-kill", opts.fault_kill, "kill")
                  or _parse_fault("--fault-hang", opts.fault_hang, "hang")
                  or _parse_fault("--fault-stop", opts.fault_stop, "stop"))
    _check(opts)
    _check_recompute(opts)
    opts.layout = layout_of(opts)
    return opts


def _check_recompute(opts: argparse.Namespace) -> None:
    """--recompute selective-ops is the cost model's form of torchtitan's per-op policy; the runtime runs
    none, selective and full (schedc.runtime.execution.recompute) and refuses it by name."""
    if opts.recompute == SELECTIVE_OPS:
        raise OptionError("--recompute selective-ops (torchtitan's per-op policy) is predicted by the cost model, "
                          "not run: give none, selective or full")


def layout_of(opts: argparse.Namespace) -> Layout:
    """The run's layout as one value, the one the cost model and tune read (schedc.layout.run_flags
    writes these options back), from the checked options (the ZeRO level settled with its alias; the
    reshard choice only at level 3, where it means something)."""
    given = {option.field: getattr(opts, option.field) for option in LAYOUT_OPTIONS if option.runtime}
    if opts.zero != 3:
        del given["reshard_after_forward"]
    return Layout(**{**given, "microbatch_size": opts.model_config.mb_size})


def _renamed(opts: argparse.Namespace) -> list[str]:
    """--config X is read as --model X, with a one-line note; --model PKG.MOD:FN is refused."""
    notes = []
    if opts.config is not None:
        if opts.model is not None:
            raise OptionError("give one of --model and --config (its old spelling)")
        opts.model, opts.config = opts.config, None
        notes.append("note: --config is deprecated: use --model (a model TOML file or a library name)")
    refusal = opts.model is not None and code_given_as_model(opts.model)
    if refusal:
        raise OptionError(refusal)
    return notes


def current_spelling(argv: list[str]) -> list[str]:
    """The runtime's arguments with the old spellings replaced (what the launcher passes its ranks, so
    the note is printed once)."""
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        out.append(DEPRECATED[name] + eq + value if name in DEPRECATED else arg)
    return out


def model_config(opts: argparse.Namespace) -> ModelConfig:
    values: dict = {}
    extra: dict = {}
    if opts.model:
        try:
            values, extra = read_description(opts.model, opts.seq)
        except DescriptionFileError as exc:  # a usage error (exit 2), printed located where it is
            error = OptionError(exc)
            error.located = exc.located
            raise error from None
    routed = {key: extra[key] for key in ("experts", "kv_lora_rank") if extra.get(key)}
    if routed and not opts.model_code:  # the library's mixtral/deepseek files: predicted, not built here
        raise OptionError(f"--model {opts.model}: {not_dense(routed.get('experts', 0), 'kv_lora_rank' in routed)}")
    resized = resized_facts(opts, values)
    for key in MODEL_KEYS:  # the microbatch size is a layout option (--microbatch-size) the model reads
        given = getattr(opts, OPTION["microbatch_size"].field if key == "mb_size" else key)
        if given is not None:
            values[key] = given
    return ModelConfig(**{**DEFAULT_MODEL, **values, **resized}, extra=extra)


# a size option and the fact whose width the description may state against it: --hidden and the MLP's
# width, --heads and the key/value heads
SIZED_FACTS = {"hidden": ("ffn", 4), "heads": ("kv_heads", 1)}
SIZED_WORDS = {"ffn": "the MLP's width", "kv_heads": "its key/value heads"}


def resized_facts(opts: argparse.Namespace, values: dict) -> dict:
    """--ffn and --kv-heads as given; where --hidden (--heads) resizes a description whose MLP width (key/
    value heads) is the default's multiple of it (4 x hidden; heads), that fact follows the new size
    (0: ModelConfig's default); where the description states it otherwise (Llama's SwiGLU 3.5 x hidden,
    grouped-query heads), resizing without the fact is refused, naming the option to give with it."""
    out = {}
    for size, (fact, default) in SIZED_FACTS.items():
        given, stated, old = getattr(opts, fact), values.get(fact), values.get(size)
        if given is not None or getattr(opts, size) is None or not stated or old is None:
            if given is not None:
                out[fact] = given
            continue
        if stated == default * old:
            out[fact] = 0
            continue
        flag, new = f"--{fact.replace('_', '-')}", getattr(opts, size)
        keep = stated * new / old
        hint = f" ({flag} {keep:g} keeps its ratio to {size})" if keep == int(keep) and keep >= 1 else ""
        raise OptionError(f"--{size} {new} resizes --model {opts.model}, whose {fact} {stated} ({SIZED_WORDS[fact]}, "
                          f"against its {size} {old}) is stated, not derived from {size}: give {flag} with "
                          f"--{size}{hint}")
    return out


def _parse_fault(option: str, text: str | None, kind: str) -> tuple[int, int, str] | None:
    if text is None:
        return None
    rank, sep, step = text.partition(":")
    if not sep or not rank.isdigit() or not step.isdigit():
        raise OptionError(f"{option} {text!r}: expected RANK:STEP")
    return int(rank), int(step), kind


def _check(opts: argparse.Namespace) -> None:
    cfg = opts.model_config
    for key in MODEL_KEYS:
        if getattr(cfg, key) < 1:
            raise OptionError(f"{key} must be positive, got {getattr(cfg, key)}")
    for key in ("kv_heads", "ffn"):
        if getattr(opts, key) is not None and getattr(opts, key) < 1:
            raise OptionError(f"--{key.replace('_', '-')} must be positive, got {getattr(opts, key)}")
    if cfg.layers > MAX_LAYERS:
        raise OptionError(f"layers must be at most {MAX_LAYERS:,}, got {cfg.layers:,}")
    if opts.steps < 1 or opts.dp < 1 or opts.every < 0:
        raise OptionError("--steps and --dp must be >= 1, --every >= 0")
    if not 0 < opts.timeout < math.inf:  # NaN fails too
        raise OptionError(f"--timeout must be a finite number of seconds > 0, got {opts.timeout}")
    if opts.timeout < MIN_TIMEOUT:  # the ranks' rendezvous store alone takes longer: refused here, not after launch
        raise OptionError(f"--timeout {opts.timeout:g}: the ranks need {MIN_TIMEOUT:g} s or more to meet and exchange "
                          f"their first messages; give --timeout {MIN_TIMEOUT:g} or more")
    if not 0 < opts.lr < math.inf:
        raise OptionError(f"--lr must be a finite number > 0, got {opts.lr}")
    if not -2 ** 63 <= opts.seed < 2 ** 63:  # torch's generators take 64 bits: refused here, not on every rank
        raise OptionError(f"--seed must fit in 64 bits (-2^63 to 2^63 - 1), got {opts.seed}")
    if opts.clip_grad is not None and not 0 < opts.clip_grad < math.inf:
        raise OptionError(f"--clip-grad must be a finite norm > 0, got {opts.clip_grad}")
    if opts.lr_warmup_steps < 0:
        raise OptionError(f"--lr-warmup-steps must be >= 0, got {opts.lr_warmup_steps}")
    if opts.lr_decay_steps is not None and opts.lr_decay_steps <= opts.lr_warmup_steps:
        raise OptionError(f"--lr-decay-steps {opts.lr_decay_steps} must be past the warm-up's "
                          f"--lr-warmup-steps {opts.lr_warmup_steps}")
    if opts.warmup is not None and opts.warmup < 0:
        raise OptionError(f"--warmup must be >= 0, got {opts.warmup}")
    if opts.threads is not None and not 1 <= opts.threads <= MAX_THREADS:
        raise OptionError(f"--threads must be between 1 and {MAX_THREADS}, got {opts.threads}")
    params = model_parameters(cfg)
    if params > MAX_PARAMETERS:
        raise OptionError(f"the model would have about {params:.3g} parameters (layers {cfg.layers}, hidden "
                          f"{cfg.hidden}, vocab {cfg.vocab}); more than {MAX_PARAMETERS:.0e} is refused")
    if not opts.model_code and model_problem(cfg):
        raise OptionError(model_problem(cfg))
    if opts.every and not opts.save:
        raise OptionError("--every needs --save DIR")
    if not (opts.data or opts.synthetic or opts.model_code) and cfg.vocab < 256:  # before torchrun, not on each rank
        raise OptionError(f"byte-level text needs --vocab 256 or more (got {cfg.vocab}); or use --synthetic")
    if opts.data and opts.synthetic:
        raise OptionError("give one of --data and --synthetic")
    if sum(bool(f) for f in (opts.fault_kill, opts.fault_hang, opts.fault_stop)) > 1:
        raise OptionError("give one of --fault-kill, --fault-hang and --fault-stop")
    if opts.reference and (opts.save or opts.resume or opts.fault):
        raise OptionError("--reference does not take --save, --resume or --fault-*")
    _check_comparison(opts)
    _refuse(compose.tensor_parallel(opts))
    _check_paths(opts)
    _check_zero(opts)
    for check in (compose.zero, compose.context, compose.experts, compose.step):
        _refuse(check(opts))
    if opts.warmup is None:
        opts.warmup = 1 if opts.steps > 1 else 0


def _check_comparison(opts: argparse.Namespace) -> None:
    if opts.tolerance is not None and not opts.compare_to_reference:
        raise OptionError("--tolerance is the bound of --compare-to-reference: give both")
    if opts.tolerance is not None and not 0 < opts.tolerance < math.inf:
        raise OptionError(f"--tolerance must be a finite relative difference > 0, got {opts.tolerance}")
    if opts.compare_to_reference and (opts.reference or opts.resume or opts.fault):
        raise OptionError("--compare-to-reference compares a run's first step with the reference's: it does not "
                          "take --reference, --resume or --fault-*")


# the run's output files, and the files its output folders receive: (option, attribute, files in a folder)
OUTPUT_FILES = (("--trace-out", "trace_out", None), ("--report-out", "report_out", None),
                ("--profile-out", "profile_out", None), ("--metrics-out", "metrics_out", None),
                ("--save-grads", "save_grads", ("grads.pt", "loss.json", "sent.json")),
                ("--save", "save", ("latest.json",)))


def _check_paths(opts: argparse.Namespace) -> None:
    """Every output a regular file (or folder) that can be written, none on the plan, the model file or
    a checkpoint read, none on another (schedc.plan.paths)."""
    from schedc.plan.paths import clash, unwritable
    outputs = []
    for option, attribute, files in OUTPUT_FILES:
        path = getattr(opts, attribute, None)
        if path is None:
            continue
        problem = unwritable(path, directory=files is not None)
        if problem:
            raise OptionError(f"{option} {path}: {problem}")
        outputs += [(option, path)] if files is None else [(option, os.path.join(path, f)) for f in files]
    problem = clash([("the plan", opts.plan), ("--model", getattr(opts, "model", None))], outputs)
    if problem:
        raise OptionError(problem)
    _check_folders(opts)
    if opts.every and opts.every > opts.steps:
        raise OptionError(f"--every {opts.every} is past --steps {opts.steps}: no checkpoint would be written "
                          f"(give --every {opts.steps} or less)")


def _check_folders(opts: argparse.Namespace) -> None:
    """An output file on the path an output folder (--save, --save-grads) makes: refused before launch,
    where the ranks met it after training."""
    given = [(option, getattr(opts, attribute, None), files) for option, attribute, files in OUTPUT_FILES]
    for option, folder, files in given:
        for other, path, other_files in given:
            if files and folder and path and other_files is None and os.path.realpath(folder) == os.path.realpath(path):
                raise OptionError(f"{other} {path} and {option} {folder} name one path: {option} makes it a folder")


def _check_zero(opts: argparse.Namespace) -> None:
    """--zero and its alias, --reshard-after-forward: the level settled (what it composes with: compose.zero)."""
    if opts.distributed_optimizer and opts.zero not in (None, 1):
        raise OptionError(f"--distributed-optimizer is --zero 1: give one of it and --zero {opts.zero}")
    opts.zero = 1 if opts.distributed_optimizer else opts.zero or 0
    opts.distributed_optimizer = opts.zero == 1
    if opts.reshard_after_forward is not None and opts.zero != 3:
        raise OptionError("--reshard-after-forward and --no-reshard-after-forward choose when --zero 3 frees the "
                          f"gathered weights; give --zero 3 (got --zero {opts.zero})")
    if opts.reshard_after_forward is None:
        opts.reshard_after_forward = opts.zero == 3


def _refuse(problem: str | None) -> None:
    if problem:
        raise OptionError(problem)
