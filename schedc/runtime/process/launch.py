# Launching: `launch()` starts torchrun for `schedc run plan.json --nproc P [options] [-- torchrun args]`.
# On one machine it passes --standalone (a free port on localhost); multi-node runs pass torchrun's own
# --nnodes/--node-rank/--rdzv-backend/--rdzv-endpoint/--rdzv-id (or --master-addr/--master-port) after
# `--`, and then no --standalone is added. torchrun runs through this module's `main`, which reports a
# failed rank as one line instead of torchrun's traceback.
from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from ..errors import UserError, error_line
from .failures import NCCL_ENV, report_of, summary

RENDEZVOUS_FLAGS = ("--standalone", "--nnodes", "--rdzv", "--master", "--node")
# After a rank fails, torchrun sends the others SIGTERM and waits this long before SIGKILL (its default,
# 30 s, is what a stopped process, which takes no SIGTERM, would add to every failure).
SHUTDOWN_SECONDS = 3


def torchrun_command(plan_path: str | Path, nproc: int, options: list[str] = (),
                     torchrun_args: list[str] = ()) -> list[str]:
    """The full command line: this module (torchrun) + its flags + `-m schedc.runtime plan options`."""
    extra = list(torchrun_args)
    own_rendezvous = any(arg.startswith(RENDEZVOUS_FLAGS) for arg in extra)
    flags = ([] if own_rendezvous else ["--standalone"]) + ["--nproc-per-node", str(nproc)]
    if not any(arg.startswith(("--shutdown-timeout", "--shutdown_timeout")) for arg in extra):
        flags += ["--shutdown-timeout", str(SHUTDOWN_SECONDS)]
    flags += extra
    return [sys.executable, "-m", "schedc.runtime.process.launch", *flags,
            "-m", "schedc.runtime", str(plan_path), *options]


def launch(plan_path: str | Path, nproc: int, options: list[str] = (),
           torchrun_args: list[str] = ()) -> int:
    """Run the plan on `nproc` local processes (per node); return the exit status (0 = all ranks ok;
    128 + the signal when this process was told to stop: see `supervise`). OMP_NUM_THREADS is 1 unless
    the user set it: torchrun's own choice for several processes, without its banner saying so."""
    env = {**NCCL_ENV, **os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # failures.py
    return supervise(subprocess.Popen(torchrun_command(plan_path, nproc, options, torchrun_args), env=env))


FORWARD_AFTER = 1.0  # seconds a stopped launcher waits for torchrun to see the signal itself (a group's)


def supervise(child: subprocess.Popen) -> int:
    """Wait for the launcher; SIGTERM or SIGINT to this process ends it and its ranks. A signal sent to
    the whole process group (Ctrl-C, `timeout`) reaches torchrun too, which ends its ranks; one sent to
    this process alone is passed on after FORWARD_AFTER seconds; a launcher still there SHUTDOWN_SECONDS
    + 10 s later is killed (its ranks die with it). Returns 128 + the signal, or torchrun's status."""
    received: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    since = forwarded = None
    try:
        while True:
            try:
                status = child.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                since = since or (now if received else None)
                if since and forwarded is None and now - since > FORWARD_AFTER:
                    child.send_signal(received[0])
                    forwarded = now
                if forwarded and now - forwarded > SHUTDOWN_SECONDS + 10:
                    child.kill()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return 128 + received[0] if received else status


def launch_from_cli(plan_path: str | Path, nproc: int | None, args: list[str]) -> int:
    """`schedc run PLAN [--nproc P] [runtime options] [-- torchrun args]`: split the arguments at `--`,
    check the plan and every option here, at once, before any process starts; then run the reference in
    this process (--reference) or start torchrun (without --nproc: the plan's devices x --dp processes)."""
    from .options import current_spelling
    options, torchrun_args = split_args(args, sys.argv)
    try:
        opts, plan = check_launch(plan_path, nproc, options, torchrun_args)
    except LaunchError as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    for line in [*opts.notes, size_warning(opts)]:
        if line:
            print(line, file=sys.stderr, flush=True)
    options = current_spelling(options)  # the ranks see the current spelling: one note, printed here
    if opts.reference:
        from ..__main__ import main as run_here
        with user_modules_importable():
            return run_here([str(plan_path), *options])
    need = nproc or plan.devices * opts.dp * opts.tp * opts.cp
    if opts.compare_to_reference:
        return compared_to_reference(plan_path, need, opts, options, torchrun_args)
    return launch(plan_path, need, options, torchrun_args)


def compared_to_reference(plan_path, nproc: int, opts, options: list[str], torchrun_args: list[str]) -> int:
    """--compare-to-reference: the run with its first step's gradients dumped (to --save-grads, or a
    temporary folder), then the one-process reference on the same options for one step, then the
    comparison printed; 1 past the tolerance."""
    import tempfile
    from ..__main__ import main as run_here
    from ..compare import TOLERANCE, compare_dumps
    plain = without(options, ("--compare-to-reference",), ("--tolerance", "--save-grads"))
    tolerance = opts.tolerance or (1e-2 if opts.dtype != "fp32" else TOLERANCE)
    with tempfile.TemporaryDirectory(prefix="schedc-compare-") as scratch:
        run_dir = opts.save_grads or str(Path(scratch) / "run")
        code = launch(plan_path, nproc, [*plain, "--save-grads", run_dir], torchrun_args)
        if code != 0:
            return code
        reference = without(plain, (), ("--steps", "--save", "--every"))
        with user_modules_importable():
            code = run_here([str(plan_path), *reference, "--reference", "--steps", "1", "--quiet",
                             "--save-grads", str(Path(scratch) / "reference")])
        if code != 0:
            return code
        comparison = compare_dumps(run_dir, Path(scratch) / "reference")
    print("\n".join(comparison.lines(tolerance)), flush=True)
    return 0 if comparison.within(tolerance) else 1


def without(options: list[str], flags: tuple[str, ...], valued: tuple[str, ...]) -> list[str]:
    """options less the given flags and the given options with their values (`--x v` or `--x=v`)."""
    out, skip = [], False
    for word in options:
        if skip:
            skip = False
        elif word in flags or word.split("=", 1)[0] in valued and "=" in word:
            continue
        elif word in valued:
            skip = True
        else:
            out.append(word)
    return out


class LaunchError(UserError):
    """A plan or an option refused before torchrun starts."""


# Processes started on this machine, at most: each rank is a Python process holding torch (about 250 MB
# before any model), so 256 of them already need some 64 GB.
MAX_LOCAL_PROCESSES = 256
PROCESS_BYTES = 250 * 2 ** 20  # what one rank holds before its model (218 MiB measured with torch 2.13, CPU)
ADDRESS_BYTES = 2 ** 30  # a rank's address space beside its tensors: 624 MiB mapped once torch and
#                          torch.distributed are imported (torch 2.13, CPU), and its threads' stacks


def check_launch(plan_path: str | Path, nproc: int | None, options: list[str], torchrun_args: list[str]):
    """The runtime's options parsed and checked as every rank would, the plan loaded and checked against
    them, --nproc against the plan, --save and --resume against the disk; (options, plan) or LaunchError."""
    from schedc.plan import PlanError, load_plan

    from ..execution.checkpoint import (
        CheckpointError, check_resumable, check_same_optimizer, check_same_run, check_save_over, check_steps_left,
        check_writable, identity)
    from .options import OptionError, parse_options
    from .world import world_words
    try:
        opts = parse_options([str(plan_path), *options])
    except OptionError as exc:
        error = LaunchError(exc)
        error.located = exc.located  # a config.json's, printed as path:line:col: error: ...
        raise error from None
    check_user_code(opts)
    try:
        plan = load_plan(plan_path)
    except PlanError as exc:
        raise LaunchError(exc if str(exc).startswith(str(plan_path)) else f"{plan_path}: {exc}") from None
    need = plan.devices * opts.dp * opts.tp * opts.cp
    factors = f"--dp {opts.dp}" + (f" x --tp {opts.tp}" if opts.tp > 1 else "") + (f" x --cp {opts.cp}" if opts.cp > 1 else "")
    if opts.reference:
        if torchrun_args or nproc not in (None, 1):
            raise LaunchError("--reference trains the whole model in this one process: leave out --nproc "
                              "and torchrun's flags")
        _check_cuda(opts)
        _check_memory(plan, opts, 1)
        return opts, plan
    if nproc is not None and nproc < 1:
        raise LaunchError(f"--nproc must be >= 1, got {nproc}")
    _check_fault(opts, need)
    standalone = not any(arg.startswith(RENDEZVOUS_FLAGS) for arg in torchrun_args)
    if standalone:
        _check_cuda(opts)
    local = nproc if nproc is not None else need
    if local > MAX_LOCAL_PROCESSES:
        raise LaunchError(f"{local:,} processes on this machine (the plan's {plan.devices} devices x "
                          f"{factors}{'' if nproc is None else ', --nproc'}): at most {MAX_LOCAL_PROCESSES} are started")
    _check_memory(plan, opts, local)
    if standalone and nproc is not None and nproc != need:
        raise LaunchError(f"the plan is for {plan.devices} devices; {world_words(opts.dp, opts.tp, opts.cp)} it needs "
                          f"{need} processes, not --nproc {nproc} (on several machines, --nproc is per machine: "
                          "give torchrun's --nnodes after `--`)")
    try:
        _check_plan_fits(plan, opts, need)
        if opts.save:
            check_save_over(opts.save, opts.resume, opts.overwrite)
            check_writable(opts.save)
        if opts.resume and standalone:
            latest = check_resumable(opts.resume, need)
            check_steps_left(opts.resume, latest.get("steps_done", 0), opts.steps)
            check_same_optimizer(opts.resume, latest, opts)
            check_same_run(opts.resume, latest, identity(plan.hash, need, opts))
    except (PlanError, CheckpointError, ValueError) as exc:
        raise LaunchError(f"{plan_path}: {exc}" if isinstance(exc, PlanError) else exc) from None
    return opts, plan


USER_CODE = (("model_code", "--model-code"), ("data", "--data"), ("loss", "--loss"))


def check_user_code(opts) -> None:
    """--model-code, --data and --loss import (modules in the current directory too, as the ranks' `python -m
    schedc.runtime` finds them) and name a function; LaunchError naming the option otherwise."""
    from .plugins import load_function
    for attribute, option in USER_CODE:
        spec = getattr(opts, attribute)
        if spec is not None:
            with user_modules_importable():
                load_function(spec, option, LaunchError)
    if opts.model_code and opts.tp > 1:
        probe_user_model(opts)


def probe_user_model(opts) -> None:
    """--model-code built once here, on the meta device (no weights, no memory), and its pieces checked
    against the layout as the ranks would check them: a builder that fails or returns no pieces, or
    pieces without the parallel form --sequence-parallel needs, are refused before torchrun starts.
    A builder that cannot run on the meta device is left to the ranks."""
    import torch
    from ..model.gpt import ModelError, build_pieces, load_builder, sequence_parallel_gaps, sequence_parallel_refusal
    try:
        with torch.device("meta"), user_modules_importable():
            pieces = build_pieces(load_builder(opts.model_code), opts.model_config, opts.seed, False)
    except ModelError as exc:
        if "meta" in str(exc).lower():
            return
        raise LaunchError(exc) from None
    if opts.sequence_parallel and sequence_parallel_gaps(pieces):
        raise LaunchError(sequence_parallel_refusal(sequence_parallel_gaps(pieces)))


@contextmanager
def user_modules_importable():
    """The current directory on sys.path while the block runs, as `python -m` puts it there."""
    here = os.getcwd()
    added = here not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        yield
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


def _check_fault(opts, world: int) -> None:
    """A --fault-* that would never fire (a rank past the world, a step past --steps) is refused: the
    run would end well and seem to show that the fault was survived."""
    if not opts.fault:
        return
    rank, step, kind = opts.fault
    option = f"--fault-{kind} {rank}:{step}"
    if rank >= world:
        raise LaunchError(f"{option}: the run has {'rank 0' if world == 1 else f'ranks 0 to {world - 1}'} "
                          f"(the plan's devices x --dp {opts.dp}{f' x --tp {opts.tp}' if opts.tp > 1 else ''}"
                          f"{f' x --cp {opts.cp}' if opts.cp > 1 else ''})")
    if step >= opts.steps:
        raise LaunchError(f"{option}: the run's steps are 0 to {opts.steps - 1} (--steps {opts.steps})")


CPU_PARAMETERS = 10 ** 8  # a default GPT past this trains at minutes per step or more on CPU ranks
RESIZE = ("--layers, --hidden, --heads, --seq and --vocab, with --ffn and --kv-heads where it states them, give a "
          "small model of its facts")


def size_warning(opts) -> str | None:
    """A warning for a default GPT too large to train on CPU in reasonable time (a cost-model TOML of a
    GPU cluster's model given to --model, say): its parameter count and where the sizes came from."""
    from .description import DEFAULT_MODEL
    from .options import model_parameters
    if opts.model_code or opts.device == "cuda":
        return None
    cfg = opts.model_config
    params = model_parameters(cfg)
    if params <= CPU_PARAMETERS:
        return None
    if opts.device == "auto":
        import torch
        if torch.cuda.is_available():
            return None
    source = f" from --model {opts.model}" if opts.model else ""
    return (f"warning: the model has about {params:.3g} parameters (layers {cfg.layers}, hidden {cfg.hidden}, "
            f"vocab {cfg.vocab}, seq {cfg.seq}{source}): on CPU ranks a step may take many minutes; the "
            f"runtime's default GPT has {model_parameters(type(cfg)(**DEFAULT_MODEL)):.3g} (a model file of schedc/models "
            f"describes costs for `schedc simulate --model`, not a model to train here; {RESIZE})")


def _check_memory(plan, opts, processes: int) -> None:
    """The default GPT split over the plan's stages (each needs a layer); on CUDA ranks each rank
    against its GPU (_check_gpus), on CPU ranks the step (options.gpt_bytes, times --dp replicas) with
    the processes started here (PROCESS_BYTES each) against this machine's memory: a run that cannot fit is refused before any process starts, not on every rank after
    torchrun, or killed by the system after minutes."""
    if opts.model_code:  # a user model's size is its own
        return _check_fits(processes * PROCESS_BYTES, f"{processes} processes")
    from ..model.gpt import partition_problem
    from .options import gpt_bytes
    problem = None if opts.reference else partition_problem(opts.model_config.layers, plan.meta["stages"],
                                                            opts.stage_layers, opts.account_for_embedding,
                                                            opts.account_for_loss)
    if problem:
        raise LaunchError(problem)
    if not opts.reference and _runs_on_cuda(opts):
        return _check_gpus(plan, opts, processes)
    microbatches = plan.meta["microbatches"] // plan.meta.get("chunks", 1)  # >= 1: checked on loading
    need = gpt_bytes(opts.model_config, microbatches) * (1 if opts.reference else opts.dp)
    cfg = opts.model_config
    try:
        _check_fits(need + processes * PROCESS_BYTES,
                    f"layers {cfg.layers}, hidden {cfg.hidden}, heads {cfg.heads}, seq {cfg.seq}, mb-size {cfg.mb_size}, "
                    f"{microbatches} microbatches{'' if opts.reference else f', --dp {opts.dp}'}, {processes} "
                    f"process{'es' * (processes != 1)}", processes)
    except LaunchError as exc:
        if not opts.model:
            raise
        raise LaunchError(f"{exc}; --model {opts.model}: {RESIZE}") from None


def _check_cuda(opts) -> None:
    """--device cuda for processes that all run on this machine: refused here when it has no CUDA,
    which every rank would find after torchrun started."""
    import torch
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise LaunchError("--device cuda, but CUDA is not available on this machine")


def _runs_on_cuda(opts) -> bool:
    if opts.device != "auto":
        return opts.device == "cuda"
    import torch
    return torch.cuda.is_available()


def _check_gpus(plan, opts, processes: int) -> None:
    """On CUDA ranks: the rank that needs the most against one GPU's memory (device_memory.py; not
    checked where this machine sees no GPU, the ranks' machines then), and this machine's memory
    against its processes and the weights they materialize on the host on their way to the GPUs."""
    from .device_memory import device_refusal, gpu_memory
    from .options import model_parameters
    from ..model.train import held_stages
    have = gpu_memory()
    problem = None if have is None else device_refusal(plan, opts.model_config, opts, held_stages, have)
    if problem:
        raise LaunchError(problem)
    _check_fits(processes * PROCESS_BYTES + 4 * model_parameters(opts.model_config),
                f"{processes} process{'es' * (processes != 1)} and the model's weights on their way to the GPUs")


def _check_fits(need: float, what: str, processes: int = 1) -> None:
    """LaunchError when `need` bytes are more than this machine's memory, or when a process's share of
    them (with ADDRESS_BYTES of its own) passes the address-space limit its ranks inherit (`ulimit -v`:
    an allocation past it fails inside torch, on a rank, after launch)."""
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        have = math.inf
    if need > have:
        raise LaunchError(f"one step would need about {need / 2 ** 30:,.3g} GiB ({what}), more than this "
                          f"machine's {have / 2 ** 30:.3g} GiB")
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    share = need / max(processes, 1) + ADDRESS_BYTES
    if limit != resource.RLIM_INFINITY and share > limit:
        raise LaunchError(f"each process would need about {share / 2 ** 30:,.3g} GiB of address space ({what}), "
                          f"more than the {limit / 2 ** 30:.3g} GiB limit this shell sets (ulimit -v)")


def _check_plan_fits(plan, opts, world: int) -> None:
    """What each rank would refuse before its first step (train.check_plan), checked once here."""
    from ..model.train import check_plan
    from .world import Env
    check_plan(plan, opts, Env(0, world, 0))


def split_args(args: list[str], argv: list[str]) -> tuple[list[str], list[str]]:
    """Runtime options and torchrun args: around `--` in args, or, where the command-line parser
    consumed the `--` (click does), around the place where argv's `--` was.

    >>> split_args(["--steps", "3", "--nnodes", "2"], ["schedc", "run", "p", "--steps", "3", "--", "--nnodes", "2"])
    (['--steps', '3'], ['--nnodes', '2'])
    """
    if "--" in args:
        split = args.index("--")
        return list(args[:split]), list(args[split + 1:])
    tail = argv[argv.index("--") + 1:] if "--" in argv else []
    if tail and list(args[-len(tail):]) == tail:
        return list(args[:-len(tail)]), tail
    return list(args), []


def default_nproc(plan_path: str | Path, options: list[str]) -> int | None:
    """The plan's devices x the --dp, --tp and --cp given among the runtime options (None if the plan is
    unreadable)."""
    from schedc.plan import PlanError, load_plan
    try:
        devices = load_plan(plan_path, verify=False).devices
    except PlanError:
        return None
    return devices * _count_option(options, "--dp") * _count_option(options, "--tp") * _count_option(options, "--cp")


def _count_option(options: list[str], name: str) -> int:
    """The last value of `name N` or `name=N` among the options, 1 where none is given."""
    count = 1
    for i, arg in enumerate(options):
        value = arg.split("=", 1)[1] if arg.startswith(f"{name}=") else (
            options[i + 1] if arg == name and i + 1 < len(options) else None)
        if value is not None and value.isdigit():
            count = int(value)
    return count


def main(argv: list[str] | None = None) -> int:
    """torchrun, with a failed worker reported as `error: rank R failed first (...)` and a stop (SIGTERM,
    SIGINT) as one line, never a traceback."""
    try:
        return _torchrun(argv)
    except KeyboardInterrupt:  # before torchrun's own handler is in place (torch still loading)
        print("error: stopped by SIGINT", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT


def _torchrun(argv: list[str] | None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run
    args = parse_args(argv)
    _bound_shutdown(SHUTDOWN_SECONDS if args.shutdown_timeout is None else args.shutdown_timeout)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    try:
        run(args)
    except (SignalException, KeyboardInterrupt) as exc:  # torchrun has ended the ranks: one line, no traceback
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not raise inside this handler
        sigval = getattr(exc, "sigval", signal.SIGINT)
        print(f"error: stopped by {signal.Signals(sigval).name}; the ranks were ended", file=sys.stderr, flush=True)
        return 128 + int(sigval)
    except ChildFailedError as exc:
        print(_failure_line(exc.failures), file=sys.stderr, flush=True)
        return 1
    except RendezvousError as exc:  # the other nodes (or the one holding the rendezvous store) are gone
        print(f"error: this node lost the rendezvous with the others ({type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); the job is ended",
              file=sys.stderr, flush=True)
        return 1
    return 0


def _bound_shutdown(seconds: int) -> None:
    """torchrun's process context ends the other workers after one fails with a fixed grace of 30 s
    (PContext.close's default, as torch 2.13 calls it from its poll and its agent's _stop_workers, not
    --shutdown-timeout): cap it at `seconds`, so that a stopped rank, which takes no SIGTERM, is
    killed seconds after the others gave up on it rather than half a minute."""
    from torch.distributed.elastic.multiprocessing.api import PContext
    close = PContext.close

    def bounded_close(context, death_sig=None, timeout: int = 30) -> None:
        close(context, death_sig, min(timeout, seconds))
    PContext.close = bounded_close


def _failure_line(failures: dict) -> str:
    """Name the rank that failed first, from the error lines the ranks recorded and how they ended
    (failures.py: an error of its own or a death before the victims' lost peers and timeouts)."""
    return summary([report_of(rank, failure) for rank, failure in failures.items()])


if __name__ == "__main__":
    sys.exit(main())
