"""Which runtime options compose, and what they need of each other: tensor and sequence parallelism,
the ZeRO levels, context parallelism, expert parallelism, and the step's own switches (--dtype
bf16-main, --overlap-grad-reduce, --log-every). Each check returns its refusal, None where the options
compose; options.py raises it before any process starts."""
from __future__ import annotations

import argparse

from ..model.experts import ep_problem
from ..model.gpt import tp_problem


def tensor_parallel(opts: argparse.Namespace) -> str | None:
    """--tp and --sequence-parallel: the model's heads and sequence split over the tensor ranks."""
    cfg = opts.model_config
    if opts.tp < 1:
        return f"--tp must be >= 1, got {opts.tp}"
    if opts.sequence_parallel and opts.tp == 1:
        return "--sequence-parallel needs --tp 2 or more"
    if opts.tp > 1 and not opts.model_code and tp_problem(cfg, opts.tp):
        return tp_problem(cfg, opts.tp)
    if opts.tp > 1 and not opts.model_code and opts.loss:
        return ("--loss takes a microbatch's whole logits, and under --tp the GPT's head keeps them split "
                "over the tensor ranks (its loss is the vocabulary-parallel cross entropy): give one of "
                "--loss and --tp")
    if opts.sequence_parallel and cfg.seq % opts.tp:
        return f"--sequence-parallel: --tp {opts.tp} does not divide the sequence length {cfg.seq}"
    return None


def zero(opts: argparse.Namespace) -> str | None:
    """--zero 2 or 3 (its level already settled): the ranks it shards over; what it does not compose
    with yet."""
    if opts.zero < 2:
        return None
    if opts.dp * opts.cp < 2:
        return (f"--zero {opts.zero} shards over the data-parallel ranks: give --dp 2 or more (or --cp 2 "
                "or more: the shards are over d x cp)")
    given = [name for name, on in (("--clip-grad", opts.clip_grad is not None), ("--save", opts.save),
                                   ("--resume", opts.resume), ("--tasks", opts.tasks)) if on]
    if given:
        return (f"--zero {opts.zero} does not compose with {given[0]} yet (it reads or writes the whole "
                "gradients or optimizer state); use --zero 1 or leave it out")
    return None


def context(opts: argparse.Namespace) -> str | None:
    """--cp: the sequence cut into 2 cp equal chunks (and each rank's part into t under sequence
    parallelism); what it does not compose with yet."""
    cp, seq = opts.cp, opts.model_config.seq
    if cp < 1:
        return f"--cp must be >= 1, got {cp}"
    if cp == 1:
        return None
    if seq % (2 * cp):
        return (f"--cp {cp} cuts the sequence into {2 * cp} equal chunks; the sequence length {seq} "
                f"(--seq) does not divide into {2 * cp}")
    if opts.sequence_parallel and (seq // cp) % opts.tp:
        return (f"--sequence-parallel with --cp {cp}: --tp {opts.tp} does not divide each context rank's "
                f"{seq // cp} tokens")
    given = [(name, why) for name, on, why in (
        ("--model-code", opts.model_code, "a user model's attention does not exchange keys and values over the "
         "context ranks"),
        ("--tasks", opts.tasks, "K-FAC's factors are taken over whole sequences")) if on]
    if given:
        return f"--cp {cp} does not compose with {given[0][0]} yet ({given[0][1]}); leave one of them out"
    return None


def experts(opts: argparse.Namespace) -> str | None:
    """--ep: experts to split, ep dividing them and d x cp (experts.ep_problem); what it does not compose
    with yet (the whole gradients or optimizer state read or written in one place)."""
    others = {"--zero": opts.zero >= 1, "--clip-grad": opts.clip_grad is not None, "--save": bool(opts.save),
              "--resume": bool(opts.resume), "--tasks": bool(opts.tasks), "--model-code": bool(opts.model_code),
              "--sequence-parallel": opts.sequence_parallel}
    return ep_problem(opts.model_config, opts.ep, opts.dp * opts.cp, others)


def step(opts: argparse.Namespace) -> str | None:
    """--dtype bf16-main (what its fp32 main weights do not compose with yet), --overlap-grad-reduce and
    --bucket-size, --log-every."""
    given = [name for name, on in (("--zero", opts.zero >= 1 and opts.dp > 1), ("--tasks", opts.tasks),
                                   ("--ep", opts.ep > 1), ("tied embeddings", opts.model_config.tied_embeddings)) if on]
    if opts.dtype == "bf16-main" and given:
        return (f"--dtype bf16-main does not compose with {given[0]} yet (the distributed optimizer "
                "shards bf16 weights; tasks, experts' buffers and tied copies read .grad, which "
                "bf16-main keeps in main_grad); use --dtype bf16 or leave it out")
    if opts.bucket_size is not None and (opts.bucket_size < 1 or not opts.overlap_grad_reduce):
        return f"--bucket-size sizes --overlap-grad-reduce's buckets: give it with --overlap-grad-reduce, 1 or more (got {opts.bucket_size})"  # noqa: E501
    if opts.overlap_grad_reduce and opts.zero >= 2:
        return f"--overlap-grad-reduce all-reduces the gradients; --zero {opts.zero} reduce-scatters them at the step's end: give one of them"  # noqa: E501
    if opts.log_every < 1:
        return f"--log-every must be 1 or more, got {opts.log_every}"
    return None
