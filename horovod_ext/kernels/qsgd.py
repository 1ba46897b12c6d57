"""Global-QSGD's three passes (scales, encode, decode), on the native kernels where they apply and
on the torch reference elsewhere; both give the same bits."""
from __future__ import annotations

import torch

from .. import packing
from . import native, reference

MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64's finalizer: a 64-bit key per (worker, tensor, step) from a counter."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def step_key(base: int, step: int) -> tuple[int, int]:
    """(klo, khi) of the dither of draw ``step`` of the stream ``base`` (one per worker and tensor)."""
    k = _mix64((base + _mix64(step)) & MASK64)
    return k & 0xFFFFFFFF, k >> 32


def _fast(x: torch.Tensor, work: torch.dtype) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and work == torch.float32 and x.is_contiguous()
            and native() is not None)


def _lanes_ok(numel: int, bucket: int, bits: int) -> bool:
    return bucket >= numel or bucket % packing.lanes_per_word(bits) == 0


def bucket_amax(flat: torch.Tensor, bucket: int) -> torch.Tensor:
    """max|x| per ``bucket`` elements as float32 (non-finite where a bucket holds NaN/Inf)."""
    if _fast(flat, torch.float32) and flat.numel():
        out = torch.empty((flat.numel() + bucket - 1) // bucket, dtype=torch.float32, device=flat.device)
        native().hx_bucket_amax(flat.data_ptr(), flat.numel(), bucket, out.data_ptr())
        return out
    return reference.bucket_amax(flat, bucket)


def encode(flat: torch.Tensor, bucket: int, factor: torch.Tensor, m: int, bits: int, key: tuple[int, int],
           extra_words: int = 0) -> torch.Tensor:
    """Quantize ``flat`` (times its bucket's ``factor`` = m / scale, plus dither) and pack it into int64
    words, then ``extra_words`` zero words. ``factor``'s dtype is the working dtype."""
    n = flat.numel()
    if _fast(flat, factor.dtype) and _lanes_ok(n, bucket, bits) and n:
        words = packing.packed_words(n, bits)
        out = torch.empty(words + extra_words, dtype=torch.int64, device=flat.device)
        if extra_words:
            out[words:] = 0
        f = factor.contiguous()
        native().hx_qsgd_encode(flat.data_ptr(), n, bucket, f.data_ptr(), m, bits, key[0], key[1], out.data_ptr())
        return out
    return reference.encode(flat, bucket, factor, m, bits, key[0], key[1], extra_words)


def decode(words: torch.Tensor, numel: int, bucket: int, scale: torch.Tensor, m: int, bits: int, workers: int,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Unpack the summed ``words`` and multiply each lane sum by its bucket's ``scale`` (scale / (m * d)),
    writing into ``out`` (float32, contiguous, ``numel`` elements) where given, else a new tensor in
    ``scale``'s dtype. ``workers``: how many workers' offsets the lanes carry."""
    if (words.device.type == "cpu" and scale.dtype == torch.float32 and _lanes_ok(numel, bucket, bits)
            and native() is not None and numel):
        if out is None or out.dtype != torch.float32 or not out.is_contiguous() or out.device.type != "cpu":
            out = torch.empty(numel, dtype=torch.float32, device=words.device)
        w = words.contiguous()
        s = scale.contiguous()
        native().hx_qsgd_decode(w.data_ptr(), numel, bucket, s.data_ptr(), int(workers) * m, bits, out.data_ptr())
        return out
    result = reference.decode(words, numel, bucket, scale, m, bits, workers)
    if out is not None:
        out.view(-1).copy_(result)
        return out
    return result
