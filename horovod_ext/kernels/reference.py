"""The torch reference of the native kernels: the same arithmetic in vectorized torch ops.

It runs on any device and dtype (CUDA gradients, float64 work), and for float32 on the CPU it gives
the bits the native kernels give (tests/test_kernels.py). See qsgd.cpp for the formulas.
"""
from __future__ import annotations

import torch

from .. import packing

M32 = 0xFFFFFFFF


def dither(n: int, klo: int, khi: int, device, dtype=torch.float32, start: int = 0) -> torch.Tensor:
    """Uniform [0, 1) noise for elements start..start+n-1: 24 bits of a counter-based hash, so any
    element's draw can be recomputed without a generator's sequential state."""
    x = torch.arange(start, start + n, dtype=torch.int64, device=device)
    x = ((x + klo) & M32) ^ khi
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32       # the int64 product wraps; its low 32 bits are exact
    x ^= x >> 16
    return (x >> 8).to(dtype) * (2.0 ** -24)


def bucket_amax(flat: torch.Tensor, bucket: int) -> torch.Tensor:
    """max|x| of each run of ``bucket`` elements (the last run may be shorter), as float32."""
    full = flat.numel() // bucket * bucket
    parts = [flat[:full].view(-1, bucket).abs().amax(1)] if full else []
    if full < flat.numel():
        parts.append(flat[full:].abs().max().reshape(1))
    return torch.cat(parts).to(torch.float32)


def per_bucket(x: torch.Tensor, bucket: int, factors: torch.Tensor) -> torch.Tensor:
    """Multiply each run of ``bucket`` elements of ``x`` (1-D, owned) by its factor, in place."""
    full = x.numel() // bucket * bucket
    if full:
        x[:full].view(-1, bucket).mul_(factors[:full // bucket, None])
    if full < x.numel():
        x[full:].mul_(factors[-1])
    return x


def encode(flat: torch.Tensor, bucket: int, factor: torch.Tensor, m: int, bits: int, klo: int, khi: int,
           extra_words: int = 0) -> torch.Tensor:
    """q = clamp(floor(x * factor + u), -m, m), packed (``factor``'s dtype is the working dtype)."""
    work = factor.dtype
    v = per_bucket(flat.to(work, copy=True), bucket, factor)
    q = v.add_(dither(v.numel(), klo, khi, v.device, work)).floor_().clamp_(-m, m)
    return packing.pack(q, bits, m, extra_words=extra_words)


def decode(words: torch.Tensor, numel: int, bucket: int, scale: torch.Tensor, m: int, bits: int, workers) -> torch.Tensor:
    """The lane sums of ``words`` times their bucket's ``scale`` (in ``scale``'s dtype)."""
    sums = packing.unpack(words, bits, m, workers, numel)
    return per_bucket(sums.to(scale.dtype), bucket, scale)
