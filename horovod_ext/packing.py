"""Integer lane packing that makes quantized values summable by Horovod's int64 allreduce.

Horovod's PyTorch binding cannot allreduce int8, so b-bit values travel as lanes of an int64
word (64/b lanes per word). The packing is chosen so that an ordinary integer Sum of n packed
words equals the packed lane-wise sums, with no carry between lanes and no int64 overflow at any
partial sum:

* each worker quantizes to integers q in [-m, m] with m = floor((2**(b-1) - 1) / n);
* every lane except the top one of a word stores q + m (offset binary, in [0, 2m]); n of them sum
  to at most 2nm <= 2**b - 2, so a lane never carries into its neighbour;
* the top lane stores q in two's complement; the word's signed value is then
  low_part + q_top * 2**(64-b), and n of them sum to |sum q_top| <= nm <= 2**(b-1) - 1, which is
  within the lane's signed range, so every partial sum is a valid int64 (no wrap-around, no UB).

Packing works on bytes (uint8 views), which is several times faster on CPUs than per-lane
shifts of int64 words.
"""
from __future__ import annotations

import torch

SUPPORTED_BITS = (2, 4, 8)
WORD_BITS = 64


def levels_for(bits: int, workers: int) -> int:
    """Largest m such that the n-worker sum of values in [-m, m] fits a ``bits``-wide lane."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return ((1 << (bits - 1)) - 1) // workers


def check_capacity(bits: int, workers: int) -> int:
    """Levels per side for ``workers``; a clear error when the sum cannot fit ``bits``."""
    m = levels_for(bits, workers)
    if m < 1:
        max_workers = (1 << (bits - 1)) - 1
        raise ValueError(
            f"{bits}-bit lanes cannot carry the sum of {workers} workers: the n-worker sum of "
            f"values in [-1, 1] needs n <= {max_workers} at {bits} bits. Use more bits "
            f"(8 bits carry up to 127 workers) or fewer workers.")
    return m


def lanes_per_word(bits: int) -> int:
    return WORD_BITS // bits


def packed_words(numel: int, bits: int) -> int:
    """Number of int64 words that hold ``numel`` lanes of ``bits`` bits."""
    lpw = lanes_per_word(bits)
    return (numel + lpw - 1) // lpw


def pack(q: torch.Tensor, bits: int, m: int, extra_words: int = 0) -> torch.Tensor:
    """Pack integers ``q`` (any integer or integral float dtype, values in [-m, m]) into int64 words.

    Returns a 1-D int64 tensor on ``q``'s device: ``packed_words(q.numel(), bits)`` words, padding
    lanes 0, then ``extra_words`` zero words for the caller (Global-QSGD counts contributors in one).
    """
    n = q.numel()
    lpw = lanes_per_word(bits)
    words = packed_words(n, bits)
    rows = words + extra_words
    lanes = torch.zeros(rows * lpw, dtype=torch.int16, device=q.device)
    lanes[:n] = q.reshape(-1).to(torch.int16)
    lanes = lanes.view(rows, lpw)
    body = lanes[:words]
    mask = (1 << bits) - 1
    body[:, :-1] += m                     # offset binary for the lower lanes
    body[:, -1] &= mask                   # two's complement for the top lane
    per_byte = 8 // bits
    lanes = lanes.to(torch.uint8).view(rows * 8, per_byte)
    if per_byte == 1:
        byte = lanes.reshape(-1)
    else:
        byte = lanes[:, 0].clone()
        for i in range(1, per_byte):
            byte |= lanes[:, i] << (bits * i)
    return byte.view(torch.int64)


def unpack(words: torch.Tensor, bits: int, m: int, workers, numel: int) -> torch.Tensor:
    """Inverse of the sum of :func:`pack` over ``workers`` workers: the lane sums as int32, length ``numel``.

    ``workers`` (an int, or a 0-dim integer tensor so that no host sync is needed) is the number of
    workers whose offsets are in the sum; a worker that contributed all-zero words (a rank that has
    called ``hvd.join()``) added no offset and is not counted."""
    if words.dtype != torch.int64:
        raise TypeError(f"packed words must be int64, got {words.dtype}")
    lpw = lanes_per_word(bits)
    nwords = words.numel()
    per_byte = 8 // bits
    byte = words.contiguous().view(torch.uint8).reshape(-1)
    if per_byte == 1:
        lanes = byte.to(torch.int32)
    else:
        mask = (1 << bits) - 1
        parts = [((byte >> (bits * i)) & mask) for i in range(per_byte)]
        lanes = torch.stack(parts, dim=1).reshape(-1).to(torch.int32)
    lanes = lanes.view(nwords, lpw)
    if torch.is_tensor(workers):
        lanes[:, :-1] -= (workers * m).to(torch.int32)
    else:
        lanes[:, :-1] -= workers * m
    top = lanes[:, -1]
    half = 1 << (bits - 1)
    lanes[:, -1] = torch.where(top >= half, top - (1 << bits), top)
    return lanes.reshape(-1)[:numel]
