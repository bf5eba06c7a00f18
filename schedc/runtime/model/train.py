# The pipelined run: check the plan against the world and the model before anything starts, build this
# rank's stages, then run step programs under the watchdog, logging, dumping, checkpointing and tracing.
# What a run builds from its options, shared by the pipelined run and the reference: the model's
# pieces and their partition, the optimizer, the dataset, and the gradient/loss dumps.
from __future__ import annotations

import os
import time
from dataclasses import replace
import json
import math
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from schedc.plan import COMM, COMPUTE, Opcode, Plan, PlanError
from schedc.plan.channels import mismatches
from schedc.plan.trace import event_name

from ..execution import checkpoint, context, trace
from ..execution.buckets import of_run
from ..execution.chunks import check_chunks
from ..execution.clocks import DeviceClock
from ..execution.executor import Executor, attach_flat_grads
from ..execution.exchanges import attach_expert_grads, check_exchanges, count_routed, exchange_problem
from .experts import ExpertGroup, expert_names, keep_local_experts, routed_tokens, tokens_per_expert
from ..execution.lifetimes import BUILTIN
from ..execution.memory import SavedBytes
from .init import materialize_pieces
from .readings import Window, log_step, logged
from . import precision
from .gpt2_names import saved_layout
from .gpt import ModelError, Stage, boundary_shapes, lm_loss, parallel_run, build_pieces, load_builder, partition
from ..execution.placed import check_placed
from ..execution.recompute import apply_recompute
from ..execution.tasks import load_task_modules, task_handler
from .tensor_parallel import Messages, TensorGroup, gathered_gradients, vocab_parallel_loss
from .spans import span_problem
from .tied import OUTPUT, tied_pair, tied_problem
from ..process.watchdog import Watchdog
from ..process.world import Env, World, check_size, pick_device, start, stop, warm_up
from .data import Dataset, load_dataset
from ..process.plugins import load_function
from .zero import state_bytes


def model_pieces(opts) -> list:
    """All pieces of the model, built from --seed."""
    return build_pieces(load_builder(opts.model_code), opts.model_config, opts.seed)


def model_runs(opts, stages: int) -> tuple[list, list[list]]:
    """All pieces of the model, their weights not yet made (init.py: a rank materializes its own), and
    their partition into `stages` runs (--stage-layers, --account-for-embedding, --account-for-loss)."""
    pieces = build_pieces(load_builder(opts.model_code), opts.model_config, opts.seed, materialize=False)
    return pieces, partition(pieces, stages, opts.stage_layers, opts.account_for_embedding, opts.account_for_loss)


def make_optimizer(params: list, opts) -> torch.optim.Optimizer:
    """The fused implementation where this torch has one for the device (one kernel for all params),
    else the default; the reference run builds its optimizer the same way."""
    kind = torch.optim.SGD if opts.optimizer == "sgd" else torch.optim.AdamW
    try:
        return kind(params, lr=opts.lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return kind(params, lr=opts.lr)


def learning_rate(opts, step: int) -> float:
    """--lr at `step` (0 the first): linear warm-up over --lr-warmup-steps W, reaching --lr at step
    W - 1, then a cosine from there down to 0 at step --lr-decay-steps (no decay without it).

    >>> from types import SimpleNamespace
    >>> o = SimpleNamespace(lr=1.0, lr_warmup_steps=2, lr_decay_steps=4)
    >>> [round(learning_rate(o, k), 6) for k in range(6)]
    [0.5, 1.0, 0.75, 0.25, 0.0, 0.0]
    """
    warmup, decay = opts.lr_warmup_steps, opts.lr_decay_steps
    if step < warmup:
        return opts.lr * (step + 1) / warmup
    if decay is None:
        return opts.lr
    peak = max(warmup - 1, 0)
    done = min(1.0, (step - peak) / (decay - peak))
    return opts.lr * 0.5 * (1 + math.cos(math.pi * done))


def set_learning_rate(optimizer: torch.optim.Optimizer, opts, step: int) -> None:
    if opts.lr_warmup_steps or opts.lr_decay_steps is not None:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(opts, step)


def autocast(opts, device: torch.device):
    """The forward's (and a recomputation's) autocast context: bf16 with --dtype bf16."""
    if opts.dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def matmul_precision(opts, device: torch.device) -> None:
    """On CUDA, fp32 matrix products in TF32 unless --tf32 off (the reference and the ranks alike); under
    --dtype bf16 the products are bf16 and the setting is left alone. Nothing changes on CPU."""
    if device.type == "cuda" and opts.dtype == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = opts.tf32 == "on"


def load_loss(opts):
    """--loss 'pkg.mod:fn', else the cross entropy over the tokens."""
    return lm_loss if opts.loss is None else load_function(opts.loss, "--loss", ModelError)


def make_dataset(opts) -> Dataset:
    """The run's data: the user's (--data), else byte-level text or random tokens (--synthetic)."""
    cfg = opts.model_config
    if opts.data:
        return load_dataset(opts.data, cfg, opts.seed)
    return Dataset(cfg.seq, cfg.vocab, opts.seed, opts.synthetic)


def global_microbatches(plan: Plan, dp: int) -> int:
    """The step's microbatches over every replica (a chunked plan's units are k to a microbatch)."""
    return plan.meta["microbatches"] // plan.meta.get("chunks", 1) * dp


def tokens_per_step(plan: Plan, opts) -> int:
    return global_microbatches(plan, opts.dp) * opts.model_config.mb_size * opts.model_config.seq


def write_grads(directory: str, grads: dict[str, torch.Tensor]) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "grads.pt.tmp"
    torch.save(dict(sorted(grads.items())), tmp)
    tmp.replace(out / "grads.pt")


def write_loss(directory: str, loss: float) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "loss.json.tmp"
    tmp.write_text(json.dumps({"loss": loss}) + "\n")
    tmp.replace(out / "loss.json")


def write_sent(directory: str, sent: list[int]) -> None:
    """DIR/sent.json: the bytes of pipeline messages each global rank sent in the first step."""
    out = Path(directory)
    tmp = out / "sent.json.tmp"
    tmp.write_text(json.dumps({"bytes_sent": sent}) + "\n")
    tmp.replace(out / "sent.json")


MEASURED_STEPS = 200  # steps timed for the report and profile (all steps with --trace-out)


def held_stages(plan: Plan, plan_rank: int) -> list[int]:
    """Model stages placed on `plan_rank` by any pipeline, checked against the rank's instructions."""
    held = sorted({s for pipe in plan.meta.get("pipelines", [])
                   for s, r in enumerate(pipe["placement"]) if r == plan_rank})
    used = {u.stage for step in plan.ranks[plan_rank] for i in step for u in i.units() if u.op in COMPUTE}
    if not used <= set(held):
        raise PlanError(f"rank {plan_rank} computes stages {sorted(used - set(held))}, which the "
                        "plan's pipelines do not place on it")
    return held


def check_plan(plan: Plan, opts, env: Env) -> None:
    """Everything that can be refused before the process group starts."""
    check_size(plan, opts.dp, env, opts.tp, opts.cp)
    for key in ("stages", "microbatches", "pipelines"):
        if key not in plan.meta:
            raise PlanError(f"the plan has no {key!r}")
    check_messages(plan)
    if exchange_problem(plan, opts.ep):
        raise PlanError(exchange_problem(plan, opts.ep))
    if opts.save:
        checkpoint.check_save_over(opts.save, opts.resume, opts.overwrite)
        checkpoint.check_writable(opts.save)
    check_chunks(plan, opts)
    check_placed(plan, opts)
    problem = span_problem(opts.model_config, plan.meta.get("chunks", 1), opts.cp) or tied_problem(plan, opts)
    if problem:  # a window split by chunks or context ranks; what would move a tied copy apart
        raise ModelError(problem)
    if opts.zero == 3 and any(i.op in (Opcode.O, Opcode.L) for steps in plan.ranks for step in steps for i in step):
        raise PlanError("--zero 3 does not compose with offload (O, L) yet: an offloaded forward's saved state "
                        "holds the stage's gathered weights; compile without 'offload F' or use --zero 2")
    load_task_modules(opts.tasks)
    for name in sorted({i.op for steps in plan.ranks for step in steps for i in step} - BUILTIN):
        task_handler(name, opts.ignore_tasks)
        precision.check_task(name, opts.dtype)


def check_messages(plan: Plan) -> None:
    """For every step program and ordered pair of ranks, the sends must equal the receives in order
    (messages match by order, not by tag: schedc.plan.channels); a mismatch would corrupt tensors or hang."""
    for k in range(plan.cycle_steps):
        streams = [steps[k] for steps in plan.ranks]
        for rank, stream in enumerate(streams):
            for i in stream:
                if i.op in COMM and not (isinstance(i.peer, int) and 0 <= i.peer < plan.devices):
                    raise PlanError(f"rank {rank}: {i} has no valid peer (ranks 0..{plan.devices - 1})")
        for (a, b), n, sent, received in mismatches(streams):
            raise PlanError(f"step program {k}: message #{n} from rank {a} to rank {b} is sent as "
                            f"{_message_name(sent, n)} but received as {_message_name(received, n)} "
                            "(messages match in order)")


def _message_name(messages: list, n: int) -> str:
    if n >= len(messages):
        return "nothing"
    direction, stage, mb, pipe = messages[n]
    return event_name(direction, stage, mb) + (f" of pipeline {pipe}" if pipe else "")


def run_pipeline(plan: Plan, opts, keep_group: bool = False) -> int:
    """Train on this rank; keep_group: leave the process group joined, for another plan to run in this
    process (tests run several plans per launch)."""
    env = Env.read()
    check_plan(plan, opts, env)
    pieces, runs = model_runs(opts, plan.meta["stages"])
    context.configure(opts.model_config.seq, 1, 0, None)  # none while shapes are traced (after a --cp plan)
    local = replace(opts.model_config, seq=opts.model_config.seq // opts.cp)  # a context rank's tokens
    shapes = precision.boundary_shapes(runs, local) if opts.dtype == precision.MAIN \
        else boundary_shapes(pieces, runs, local, opts.dtype == "bf16")  # bf16-main: on meta, no forward
    dataset = make_dataset(opts)
    device = pick_device(opts.device, env)
    matmul_precision(opts, device)
    world = start(plan, opts.dp, env, device, opts.timeout, opts.tp, opts.cp, opts.ep)
    warm_up(world)  # every channel's communicator made before step 0
    if world.cp > 1:
        dataset = context.ContextData(dataset, world.cp, world.context)
    try:
        executor = build_executor(plan, opts, world, runs, shapes)
        del pieces, runs
        return train(plan, opts, world, executor, dataset)
    finally:
        if not keep_group:
            stop()


def build_executor(plan: Plan, opts, world: World, runs: list[list], shapes: list) -> Executor:
    tp = TensorGroup(world.tp, world.tensor, world.tensor_group, opts.sequence_parallel)
    held = held_stages(plan, world.plan_rank)
    for s in held:  # this rank's pieces get their weights; the others stay on the meta device (init.py)
        keep_local_experts(runs[s], ExpertGroup(world.ep, world.lane % world.ep, world.expert_group))
        materialize_pieces(runs[s], opts.seed)
    stages = {s: Stage(parallel_run(runs[s], tp)).to(world.device) for s in held}
    _recompute(stages, len(runs), opts.recompute)
    tied = tied_pair(plan, runs, stages, world, opts.timeout)  # a tied model's embedding and copy (tied.py)
    shards = _shards(stages, opts, world)
    shards = precision.MainParams(stages) if opts.dtype == precision.MAIN else shards  # bf16-main: fp32 main
    if shards is not None:
        params = shards.parameters()
    else:
        params = [p for stage in stages.values() for p in stage.parameters() if p.requires_grad]
    executor = Executor(plan, world, stages, shapes, make_optimizer(params, opts), opts.ignore_tasks)
    executor.shards = shards
    executor.buckets = of_run(plan, opts, world, stages)  # --overlap-grad-reduce (buckets.py)
    executor.tied = tied
    if world.ep > 1:  # each op's expert all-to-alls against the plan's declared ones (exchanges.py)
        check_exchanges(executor)
    if opts.model_config.experts and opts.report_out:
        count_routed(executor)
    context.configure(opts.model_config.seq, world.cp, world.context, world.context_group)
    executor.scale /= world.cp  # a context rank's loss is the mean over 1/cp of the sequence's tokens
    executor.tp, executor.messages = tp, Messages(tp, opts.scatter_gather)
    last = stages.get(plan.meta["stages"] - 1)
    if last is not None and getattr(last.pieces[-1], "vocab_parallel", False):
        executor.loss_fn = vocab_parallel_loss(tp)
    if world.device.type == "cuda" and (opts.trace_out or opts.report_out or opts.profile_out):
        executor.clock = DeviceClock()  # device events, read at each step's end (clocks.py)
    if opts.fault and opts.fault[0] == world.rank:
        executor.fault = opts.fault[1:]
    if opts.report_out or opts.metrics_out:
        executor.meter = SavedBytes.of(stages)
        if shards is not None and shards.level == 3:  # a gathered stage's weights are parameters, not activations
            shards.on_gather = executor.meter.add_parameters
    _training(executor, plan, opts, world)
    return executor


def _shards(stages: dict[int, Stage], opts, world: World):
    """Flat gradient buffers for every stage; with --zero 1, 2 or 3 over more than one data x context
    rank this rank's shards (sharding.py, zero.py), else None. The shards are over the gradient-averaging
    group, d x cp (Megatron-Core's distributed optimizer over its data-and-context group), in its order."""
    count, index = world.dp * world.cp, world.replica * world.cp + world.context  # world.dp_ranks()'s order
    sharded = opts.zero >= 1 and count > 1
    for stage in stages.values():
        attach_flat_grads(stage, count if sharded else 1)
        if world.ep > 1:  # the experts' gradients apart, reduced over their own group
            attach_expert_grads(stage)
    if not sharded:
        return None
    from .sharding import Shards
    from .zero import ZeroShards
    if opts.zero == 1:  # each data x context rank steps 1/(d cp) of the weights
        return Shards(stages, count, index, world.dp_group, world.dp_ranks())
    return ZeroShards(stages, count, index, world.dp_group, world.dp_ranks(), opts.zero,
                      opts.reshard_after_forward)


def _training(executor: Executor, plan: Plan, opts, world: World) -> None:
    """--loss, --dtype, --clip-grad and the learning-rate schedule, as the reference applies them."""
    if opts.loss is not None:
        if executor.loss_fn is not lm_loss:
            raise ModelError("--loss takes a microbatch's whole logits, and under --tp the GPT's head keeps them "
                             "split over the tensor ranks (its loss is the vocabulary-parallel cross entropy): "
                             "give one of --loss and --tp")
        executor.loss_fn = load_loss(opts)
    executor.autocast = lambda: autocast(opts, world.device)
    executor.set_lr = lambda step: set_learning_rate(executor.optimizer, opts, step)
    if opts.clip_grad is not None:
        executor.clip_grad = opts.clip_grad
        first = {s: min(pipe["placement"][s] for pipe in plan.meta["pipelines"]) for s in executor.stages}
        executor.clip_stages = [s for s in sorted(executor.stages)
                                if world.replica == 0 and world.context == 0 and first[s] == world.plan_rank]


def _recompute(stages: dict[int, Stage], count: int, mode: str) -> None:
    """--recompute on this rank's stages (of `count`): their layers, all pieces but the model's first and
    last; selective needs each layer to name its attention core."""
    for s, stage in stages.items():
        if not apply_recompute(stage, mode, s == 0, s == count - 1):
            raise ModelError(f"--recompute selective recomputes the attention core of each layer, and stage {s}'s "
                             "layers name none (a module with a `recompute_core` attribute, as the GPT's Block "
                             "has); use --recompute full")


def identity(plan: Plan, opts, world: World) -> dict:
    return checkpoint.identity(plan.hash, world.size, opts)


def train(plan: Plan, opts, world: World, executor: Executor, dataset) -> int:
    first = checkpoint.load(opts.resume, executor, identity(plan, opts, world)) if opts.resume else 0
    if opts.resume:
        checkpoint.check_steps_left(opts.resume, first, opts.steps)
    opts.first_step = first
    if opts.save_grads:
        layout = saved_layout(opts.model_config, opts.model_code)
        executor.before_update = _grad_dumper(opts.save_grads, first, world, layout)
    if not opts.trace_out:
        executor.record_until = first + opts.warmup + MEASURED_STEPS
    count, tokens = global_microbatches(plan, opts.dp), tokens_per_step(plan, opts)
    dist.barrier()
    origin = _shared_origin(time.perf_counter_ns())
    window = Window(first)
    with Watchdog(executor, opts.timeout):
        for step in range(first, opts.steps):
            batch = dataset.batch(step, count, opts.model_config.mb_size)
            executor.run_step(step, batch.pinned() if world.device.type == "cuda" else batch)
            read = logged(opts, step, first)  # the step's one host synchronization (readings.py)
            loss = _mean_loss(executor) if read else None
            _after_step(opts, world, executor, step, first, loss, window.mean(step) if read else 0.0, tokens)
            if read:
                window.restart(step)
    _finish(plan, opts, world, executor, origin, first)
    return 0


def _shared_origin(local: int) -> int:
    """The trace's time zero: the earliest reading, after the barrier, among the ranks of this host.
    perf_counter is the host's monotonic clock, shared by its processes, so one origin puts their
    events on one time base (each rank's own origin set them apart by however late it left the
    barrier: consumers seemed to start before their producers ended). Other hosts keep theirs."""
    host = os.environ.get("GROUP_RANK", "0")
    readings: list = [None] * dist.get_world_size()
    dist.all_gather_object(readings, (host, local))
    return min(t for h, t in readings if h == host)


def _mean_loss(executor: Executor) -> float:
    loss = executor.take_loss()
    dist.all_reduce(loss)
    return loss.item() * executor.scale / executor.world.tp  # every tensor rank of the last stage adds it


def _after_step(opts, world, executor, step, first, loss, seconds, tokens) -> None:
    if loss is None:
        executor.take_loss()  # unread: dropped on the device
    else:
        extra = _step_memory(executor) if opts.metrics_out else None  # collective
        if world.rank == 0:
            log_step(opts, step, loss, seconds, tokens, extra)
    if step == first and opts.save_grads and world.rank == 0:
        write_loss(opts.save_grads, loss)
    due = (step + 1) % opts.every == 0 if opts.every else step + 1 == opts.steps
    if opts.save and due:
        executor.current = None
        checkpoint.save(opts.save, step + 1, executor, identity(executor.plan, opts, world))


def _step_memory(executor: Executor) -> dict:
    """The step's peak of live saved activation bytes, the largest over the ranks (collective)."""
    peak = torch.tensor([float(executor.meter.step_peak_bytes)], device=executor.world.device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return {"peak_saved_bytes": int(peak.item())}


def _grad_dumper(directory: str, first: int, world: World, layout=dict):
    """At the first step, gather every stage's synced gradients to rank 0 and write grads.pt, under
    the unpartitioned model's names (tensor-parallel shards gathered in replica 0's tensor groups), in
    `layout` (gpt2_names.saved_layout: a GPT-2 description's under GPT-2's own)."""
    def dump(executor: Executor) -> None:
        if executor.step_no != first:
            return
        if executor.shards is not None and executor.shards.level >= 2:  # the reduce-scattered shards, whole
            executor.shards.gather_gradients()
        mine = {} if world.replica and world.ep == 1 else {
            name: grad for stage in executor.stages.values() for name, grad in gathered_gradients(stage, executor.tp).items()}
        experts = {name for stage in executor.stages.values() for name in expert_names(stage)}
        if world.ep > 1:  # the experts from the ranks of the first expert group, the rest from replica 0
            mine = {k: v for k, v in mine.items() if (world.lane < world.ep if k in experts else world.lane == 0)}
        mine = {} if world.tensor or (world.context and world.ep == 1) else mine
        if executor.tied is not None:  # the copy's gradient is the embedding's (tied.py)
            mine.pop(OUTPUT, None)
        parts = [None] * world.size if world.rank == 0 else None
        dist.gather_object((mine, executor.sent_bytes), parts, dst=0)
        if world.rank == 0:
            write_grads(directory, layout({k: v for part, _ in parts for k, v in part.items()}))
            write_sent(directory, [sent for _, sent in parts])
    return dump


def _finish(plan: Plan, opts, world: World, executor: Executor, origin: int, first: int) -> None:
    """Gather timed events to rank 0: trace, report, profile."""
    if opts.quiet and not (opts.trace_out or opts.report_out or opts.profile_out):
        return  # the same on every rank: gathering is collective
    programs = plan.ranks[world.plan_rank]
    mine = [trace.record(world.rank, step, programs[step % len(programs)][index],
                         start - origin, end - origin, wait)
            for step, index, start, end, wait in executor.events]
    summary = executor.meter.summary() if executor.meter is not None else None
    if summary is not None:
        summary["parameter_bytes"] = parameter_bytes(executor)
        summary["state_bytes"] = state_bytes(executor.stages, executor.shards, executor.optimizer)
        summary["plan_rank"] = world.plan_rank
        summary["peak_rss_bytes"] = peak_rss_bytes()
    routed = {} if world.tensor else {k: v for s in executor.stages.values() for k, v in routed_tokens(s).items()}
    parts = [None] * world.size if world.rank == 0 else None
    dist.gather_object((mine, summary, routed), parts, dst=0)
    if world.rank != 0:
        return
    events = [e for part, _, _ in parts for e in part]
    measured = [e for e in events if e.step >= first + opts.warmup]
    memory = trace.memory_report([summary for _, summary, _ in parts]) if summary is not None else None
    _write_outputs(plan, opts, world, events, measured, memory, tokens_per_expert([r for _, _, r in parts],
                                                                                  opts.steps - first))


def _write_outputs(plan: Plan, opts, world: World, events: list, measured: list, memory: dict | None = None,
                   experts: dict | None = None) -> None:
    if opts.trace_out:
        trace.write_json(opts.trace_out, trace.chrome_trace(events, plan))
    rep = trace.report(measured, plan, world.size)
    if memory is not None:
        rep["memory"] = memory
    if experts:
        rep["tokens_per_expert_per_step"] = experts
    if opts.report_out:
        trace.write_json(opts.report_out, rep)
    if opts.profile_out:
        trace.write_json(opts.profile_out, trace.profile(measured or events, plan.meta["stages"],
                                                                  opts.model_config.mb_size, plan.meta.get("chunks", 1)))
    if not opts.quiet:
        print(trace.format_report(rep), flush=True)


def parameter_bytes(executor: Executor) -> int:
    """The most weight bytes this rank held at once: every stage's parameters, and with --zero its
    optimizer's shards (ZeRO-3: the shards and the gathered stages at their peak, zero.py)."""
    shards = executor.shards
    if shards is not None and shards.level == 3:
        return shards.parameter_bytes()
    whole = sum(p.numel() * p.element_size() for stage in executor.stages.values() for p in stage.parameters())
    return whole + (0 if shards is None else sum(s.numel() * s.element_size() for s in shards.parameters()))


def peak_rss_bytes() -> int:
    """This process's peak resident host memory so far (getrusage's ru_maxrss: KiB on Linux, bytes on macOS)."""
    import resource
    import sys
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
