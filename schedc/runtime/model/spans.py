"""What a long-context config changes in the decoder's attention: a sliding window's banded causal mask
(Mistral's sliding_window) and Llama 3.1's "llama3" rope_scaling of the rotary inverse frequencies (as
Hugging Face's _compute_llama3_parameters; no change of cost).

    band(5, 2):  0 - - - -      query i attends to keys i - window < j <= i: min(window, i + 1) of them
                 0 0 - - -      (-: -inf)
                 - 0 0 - -
                 - - 0 0 -
                 - - - 0 0
"""
from __future__ import annotations

import math

import torch


def band(seq: int, window: int) -> torch.Tensor:
    """The [seq, seq] additive mask of causal attention within a sliding window: 0 where a query attends,
    -inf elsewhere (in fp32: scaled_dot_product_attention reads it as it is, where it would convert a
    boolean mask into a new tensor that its backward keeps, an activation of s x s per layer)."""
    i = torch.arange(seq).unsqueeze(1)
    j = torch.arange(seq).unsqueeze(0)
    attends = (j <= i) & (j > i - window)
    return torch.zeros(seq, seq).masked_fill(~attends, float("-inf"))


def llama3_frequencies(inverse: torch.Tensor, scaling: tuple[float, float, float, int]) -> torch.Tensor:
    """Llama 3.1's rotary inverse frequencies: a wavelength longer than original / low_freq_factor is
    divided by `factor`, one shorter than original / high_freq_factor kept, those between blended by
    how far original / wavelength lies from low_freq_factor to high_freq_factor."""
    factor, low, high, original = scaling
    wavelength = 2 * math.pi / inverse
    scaled = torch.where(wavelength > original / low, inverse / factor, inverse)
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(medium, blended, scaled)


def span_problem(cfg, chunks: int, cp: int) -> str | None:
    """Why the runtime cannot run a model's sliding window under this plan (None when it can): a window
    shorter than the sequence is one banded mask over a whole sequence, which sequence chunks (Seq1F1B)
    and context ranks split (refused by name, before launch)."""
    split = [what for what, on in (("sequence chunks (Seq1F1B)", chunks > 1), (f"--cp {cp}", cp > 1)) if on]
    if cfg.window is not None and cfg.window < cfg.seq and split:
        return (f"sliding_window {cfg.window} (< seq {cfg.seq}) with {split[0]}: the runtime's windowed attention "
                "masks a whole sequence at once; compile without chunks, or --cp 1")
    return None
