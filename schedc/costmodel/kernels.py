"""A cluster's attention kernel: the optional [attention] table of a cluster file, the achieved TFLOP/s
of the fused (flash) attention kernel its software stack runs, by sequence length, forward with and
without the causal mask and backward, and how the stack's context parallelism exchanges keys and values.

    [attention]
    kernel = "FlashAttention-2 (torch SDPA)"     # what the figures are of (free text)
    lengths = [512, 1024, 2048, 4096, 8192, 16384]
    forward_tflops = [...]          # no mask, one per length
    forward_causal_tflops = [...]   # causal mask, FLOPs counted as half of the unmasked
    backward_tflops = [...]         # no mask
    context_parallel = "p2p"        # "p2p": Megatron-Core / Transformer Engine's ring; "all-gather":
                                    # torch's late-2024 ring (costmodel/attention.py says what each does)
    repeated_kv = false             # the model repeats K/V to the query heads before the kernel
    measured_peak_tflops = 989      # optional: the 16-bit peak of the GPU the figures are of; the rates
                                    # then follow the cluster's peak_tflops (a clocked-down GPU's)

Without the table a flash kernel is charged as a GEMM (costmodel/stages.py's attention_terms), as
before; with it costmodel/attention.py charges each block of the attention at the table's rate.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ..diagnostics import Diagnostic, Source, error
from .located import locate, unknown_keys

RATE_KEYS = ("forward_tflops", "forward_causal_tflops", "backward_tflops")
EXCHANGES = ("p2p", "all-gather")
KEYS = ("kernel", "lengths", *RATE_KEYS, "context_parallel", "repeated_kv", "measured_peak_tflops")
MAX_POINTS = 64


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """A flash attention kernel's achieved FLOP/s at the lengths it was measured at (ascending), and
    the stack's context-parallel exchange."""

    name: str
    lengths: tuple[float, ...]
    forward: tuple[float, ...]          # FLOP/s, no mask
    forward_causal: tuple[float, ...]   # FLOP/s, causal (FLOPs counted as half the unmasked)
    backward: tuple[float, ...]         # FLOP/s, no mask
    context_parallel: str = "p2p"
    repeated_kv: bool = False
    measured_peak: float = 0.0          # FLOP/s: the peak of the GPU measured; 0: the figures as they stand

    def scaled(self, peak: float) -> float:
        """What the figures are multiplied by on a GPU of this 16-bit peak: peak over the measured
        GPU's (a compute-bound kernel follows the tensor cores' clock), 1 when none is given."""
        return peak / self.measured_peak if self.measured_peak else 1.0

    def rate(self, which: str, length: float) -> float:
        """FLOP/s of `which` ("forward", "forward_causal", "backward", "backward_causal") at a block
        of `length` keys: linear in log2(length) between the measured lengths, the end figures past
        them. A causal backward's is the unmasked backward's scaled by the forward's causal/unmasked
        ratio at that length (the papers give the backward without a mask; the mask wastes the same
        share of the diagonal tiles in both passes).

        >>> k = AttentionKernel("k", (1024, 4096), (200e12, 400e12), (100e12, 300e12), (150e12, 300e12))
        >>> k.rate("forward", 2048) / 1e12, k.rate("forward", 99) / 1e12, k.rate("backward_causal", 4096) / 1e12
        (300.0, 200.0, 225.0)
        """
        if which == "backward_causal":
            return self.rate("backward", length) * self.rate("forward_causal", length) / self.rate("forward", length)
        figures = getattr(self, which)
        x = math.log2(min(max(length, self.lengths[0]), self.lengths[-1]))
        for i in range(1, len(self.lengths)):
            lo, hi = math.log2(self.lengths[i - 1]), math.log2(self.lengths[i])
            if x <= hi:
                share = (x - lo) / (hi - lo)
                return figures[i - 1] + share * (figures[i] - figures[i - 1])
        return figures[-1]


def read_attention(table: dict, source: Source, diags: list[Diagnostic]) -> AttentionKernel | None:
    """The cluster's [attention] table (None without it); every bad key located in diags."""
    given = table.get("attention")
    if not isinstance(given, dict):
        return None
    where = lambda k: locate(source, k, "attention")  # noqa: E731
    before = len(diags)
    diags += unknown_keys([k for k in given if k not in KEYS],
                          lambda k: f"unknown key 'attention.{k}' (keys: {', '.join(KEYS)})", where)
    lengths = _figures(given, "lengths", "the block lengths the rates were measured at, ascending", where, diags)
    if lengths and any(b <= a for a, b in zip(lengths, lengths[1:])):
        diags.append(error("'attention.lengths' must ascend", where("lengths")))
    rates = {key: _figures(given, key, "TFLOP/s, one per length", where, diags) for key in RATE_KEYS}
    for key, figures in rates.items():
        if lengths and figures and len(figures) != len(lengths):
            diags.append(error(f"'attention.{key}' has {len(figures)} figures for {len(lengths)} lengths",
                               where(key)))
    _within_peak(rates, given, table, where, diags)
    exchange = given.get("context_parallel", "p2p")
    if exchange not in EXCHANGES:
        diags.append(error(f"'attention.context_parallel' must be one of {', '.join(EXCHANGES)}, got {exchange!r}",
                           where("context_parallel")))
    repeated = given.get("repeated_kv", False)
    if not isinstance(repeated, bool):
        diags.append(error(f"'attention.repeated_kv' must be true or false, got {repeated!r}", where("repeated_kv")))
    measured = given.get("measured_peak_tflops", 0.0)
    if not isinstance(measured, (int, float)) or isinstance(measured, bool) or not (measured == 0 or 1e-6 <= measured <= 1e15):
        diags.append(error(f"'attention.measured_peak_tflops' must be a number from 1e-06 to 1e+15, got {measured!r}",
                           where("measured_peak_tflops")))
    name = given.get("kernel", "")
    if not isinstance(name, str):
        diags.append(error(f"'attention.kernel' must be a string, got {name!r}", where("kernel")))
    if len(diags) > before:
        return None
    tera = {key: tuple(v * 1e12 for v in figures) for key, figures in rates.items()}
    return AttentionKernel(name, tuple(lengths), tera["forward_tflops"], tera["forward_causal_tflops"],
                           tera["backward_tflops"], exchange, repeated, float(measured) * 1e12)


def _within_peak(rates: dict, given: dict, table: dict, where, diags: list[Diagnostic]) -> None:
    """Each rate at most the 16-bit peak of the GPU it was measured on (measured_peak_tflops, else the
    file's [gpu] peak_tflops): a kernel past its tensor cores' peak is a typo (a causal rate counts half
    the unmasked FLOPs, so it is held to the peak too)."""
    gpu = table.get("gpu")
    peak = given.get("measured_peak_tflops") or (gpu.get("peak_tflops") if isinstance(gpu, dict) else None)
    if not isinstance(peak, (int, float)) or isinstance(peak, bool) or not 0 < peak < math.inf:
        return
    for key, figures in rates.items():
        if figures and max(figures) > peak:
            diags.append(error(f"'attention.{key}' reaches {max(figures):,g} TFLOP/s, past the {peak:,g} TFLOP/s 16-bit "
                               "peak of the GPU it was measured on ('attention.measured_peak_tflops', else "
                               "'gpu.peak_tflops'): a kernel runs at most at its GPU's peak", where(key)))


def _figures(given: dict, key: str, doc: str, where, diags: list[Diagnostic]) -> list[float]:
    """A required list of positive numbers (1 to MAX_POINTS of them); [] after an error."""
    value = given.get(key)
    if value is None:
        diags.append(error(f"missing field 'attention.{key}' ({doc})", where(key)))
        return []
    good = (isinstance(value, list) and 1 <= len(value) <= MAX_POINTS
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 1e-6 <= v <= 1e15 for v in value))
    if not good:
        diags.append(error(f"'attention.{key}' must be a list of 1 to {MAX_POINTS} numbers from 1e-06 to 1e+15, "
                           f"got {value!r} ({doc})", where(key)))
        return []
    return [float(v) for v in value]


def dump_attention(kernel: AttentionKernel | None) -> str:
    """The [attention] table's TOML text (read_attention reads it back to the same kernel); '' for None."""
    if kernel is None:
        return ""
    figures = lambda values, scale: "[" + ", ".join(repr(v / scale) for v in values) + "]"  # noqa: E731
    return (f"\n[attention]\nkernel = {json.dumps(kernel.name)}\nlengths = {figures(kernel.lengths, 1)}\n"
            f"forward_tflops = {figures(kernel.forward, 1e12)}\n"
            f"forward_causal_tflops = {figures(kernel.forward_causal, 1e12)}\n"
            f"backward_tflops = {figures(kernel.backward, 1e12)}\n"
            f"context_parallel = {json.dumps(kernel.context_parallel)}\n"
            f"repeated_kv = {'true' if kernel.repeated_kv else 'false'}\n"
            + (f"measured_peak_tflops = {kernel.measured_peak / 1e12!r}\n" if kernel.measured_peak else ""))
