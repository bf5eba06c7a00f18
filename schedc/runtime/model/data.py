# Training data: byte-level tokens of real text that ships with Python (the source of a few standard
# library modules), synthetic tokens, or the user's data (--data pkg.mod:fn). Batches are a pure
# function of (seed, step), so every rank draws the same global batch, a resumed run continues where it
# stopped, and the reference sees the same data.
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from ..errors import UserError

CORPUS_MODULES = ("argparse", "difflib", "textwrap", "inspect", "typing")


class DataError(UserError):
    """Data that cannot be loaded or does not fit the model."""


def load_corpus(modules: tuple[str, ...] = CORPUS_MODULES) -> torch.Tensor:
    """The concatenated source text of `modules` as a 1-D tensor of byte values."""
    chunks = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        chunks.append(Path(spec.origin).read_bytes())
    data = b"\n".join(chunks)
    if not data:
        raise DataError(f"none of the standard library modules {', '.join(modules)} has source text "
                        "here; use --synthetic")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's global batch: `count` microbatches of `size` sequences, inputs and next-token targets."""

    tokens: torch.Tensor
    targets: torch.Tensor
    size: int

    def microbatch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slice(index * self.size, (index + 1) * self.size)
        return self.tokens[rows], self.targets[rows]

    def pinned(self) -> Batch:
        """The batch in page-locked host memory (on CUDA: each microbatch's non_blocking copy to the
        GPU then runs asynchronously, where pageable memory makes it a synchronous staged copy)."""
        return Batch(*(t if t.is_pinned() else t.pin_memory() for t in (self.tokens, self.targets)), self.size)


class Dataset:
    """Draws global batches deterministically from (seed, step). The interface a user's data provides
    too: batch(step, microbatches, size) -> Batch, the same for every rank and every call."""

    def __init__(self, seq: int, vocab: int, seed: int, synthetic: bool):
        self.seq, self.vocab, self.seed = seq, vocab, seed
        self.corpus = None if synthetic else load_corpus()
        if self.corpus is not None and vocab < 256:
            raise DataError(f"byte-level text needs --vocab 256 or more (got {vocab}); or use --synthetic")
        if self.corpus is not None and len(self.corpus) <= seq + 1:
            raise DataError(f"the text corpus is shorter than one sequence of {seq} tokens")

    def batch(self, step: int, microbatches: int, size: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        rows = microbatches * size
        if self.corpus is None:
            windows = torch.randint(0, self.vocab, (rows, self.seq + 1), generator=gen)
        else:
            starts = torch.randint(0, len(self.corpus) - self.seq - 1, (rows, 1), generator=gen)
            windows = self.corpus[starts + torch.arange(self.seq + 1)]
        return Batch(windows[:, :-1].contiguous(), windows[:, 1:].contiguous(), size)


def load_dataset(spec: str, cfg, seed: int):
    """--data 'pkg.mod:fn': fn(cfg, seed) returns the data, an object whose batch(step, microbatches,
    size) gives a Batch: `microbatches * size` rows of model inputs (`tokens`) and of what the last
    piece's output is scored against (`targets`, as the loss reads them: class indices [rows, 1] for
    logits [rows, 1, classes]). Its first batch is checked here, before any rank starts."""
    from ..process.plugins import call_user, load_function
    data = call_user(load_function(spec, "--data", DataError), "--data", spec, DataError, cfg, seed)
    if not callable(getattr(data, "batch", None)):
        raise DataError(f"--data {spec!r}: the function must return an object with a method "
                        "batch(step, microbatches, size)")
    first = call_user(data.batch, "--data", spec, DataError, 0, 1, cfg.mb_size)
    if not isinstance(first, Batch) or len(first.tokens) != cfg.mb_size or len(first.targets) != cfg.mb_size:
        raise DataError(f"--data {spec!r}: batch(step, 1, {cfg.mb_size}) must return a Batch of "
                        f"{cfg.mb_size} rows of tokens and targets, got {_describe(first)}")
    return data


def _describe(batch) -> str:
    if not isinstance(batch, Batch):
        return type(batch).__name__
    return f"{len(batch.tokens)} rows of tokens and {len(batch.targets)} of targets"
