"""Sparse allreduce (SparCML's recursive doubling, Renggli et al., SC 2019) on Horovod's alltoall.

Top-k's default transport gathers every worker's (index, value) pairs, so each worker receives
(n - 1) * k pairs whatever the overlap between workers. Here the sum is built in log2(n) rounds:
in round r each worker swaps its running sum with the worker whose rank differs in bit r (one
``alltoall`` whose splits are zero for every other worker) and adds what it receives. Where the
workers' indices overlap, the running sums stay smaller than the gathered pairs, so fewer bytes
move; round r's payload is at most 2^r * k pairs.

The dense switch, stated: a running sum travels sparse (int32 indices + values) while that is
smaller than the dense tensor, i.e. while count * (1 + w) < numel * w int32 words (w = 1 for float32
values, 2 for float64), so for float32 while fewer than half the elements are nonzero; from the
first round where the union reaches that size it travels dense (values only) for the remaining
rounds. Both partners of a round compute the same union, so they switch together; every payload
starts with a two-word header (mode, count), so that partners in different modes still understand each
other, then the values, then (sparse) the indices.

Every worker ends with the same bits: each round adds exactly two operands per element (x + y, or
0 + x for an index only one side holds), and floating-point addition of two operands is
commutative. The worker count must be a power of two (recursive doubling pairs every worker in
every round); :func:`applies` says whether it does, and the codec falls back to allgather otherwise.
"""
from __future__ import annotations

import torch

from .base import ReduceContext

SPARSE, DENSE = 0, 1


def applies(workers: int) -> bool:
    """Recursive doubling needs a power-of-two worker count (> 1)."""
    return workers > 1 and workers & (workers - 1) == 0


def words_per_value(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size() // 4


def dense_is_smaller(count: int, numel: int, dtype: torch.dtype) -> bool:
    """The switch rule: send dense once count * (1 + w) >= numel * w int32 words."""
    w = words_per_value(dtype)
    return count * (1 + w) >= numel * w


def encode(mode: int, idx: torch.Tensor | None, vals: torch.Tensor) -> torch.Tensor:
    """One int32 tensor: [mode, count] + the values' bits + indices (sparse only). The values start
    at word 2, so float64 values stay 8-byte aligned when viewed back."""
    count = vals.numel()
    head = torch.tensor([mode, count], dtype=torch.int32, device=vals.device)
    parts = [head, vals.contiguous().view(torch.int32)] + ([idx.to(torch.int32)] if mode == SPARSE else [])
    return torch.cat(parts)


def decode(payload: torch.Tensor, dtype: torch.dtype):
    """Inverse of :func:`encode`: (mode, idx or None, values)."""
    mode, count = (int(v) for v in payload[:2].tolist())
    w = words_per_value(dtype)
    vals = payload[2:2 + count * w].view(dtype)
    if mode == SPARSE:
        return SPARSE, payload[2 + count * w:2 + count * (w + 1)].to(torch.int64), vals
    return DENSE, None, vals


def merge(a: tuple, b: tuple, numel: int):
    """(mode, idx, vals) + (mode, idx, vals): the sum, sparse (sorted unique indices) or dense."""
    (ma, ia, va), (mb, ib, vb) = a, b
    if ma == DENSE or mb == DENSE:
        if ma == DENSE and mb == DENSE:
            return DENSE, None, va + vb
        dense, (idx, vals) = (va, (ib, vb)) if ma == DENSE else (vb, (ia, va))
        return DENSE, None, dense.clone().index_add_(0, idx, vals)
    idx, inverse = torch.unique(torch.cat([ia, ib]), sorted=True, return_inverse=True)
    vals = va.new_zeros(idx.numel()).index_add_(0, inverse, torch.cat([va, vb]))
    if dense_is_smaller(idx.numel(), numel, va.dtype):
        return DENSE, None, va.new_zeros(numel).index_put_((idx,), vals)
    return SPARSE, idx, vals


def recursive_doubling(idx: torch.Tensor, vals: torch.Tensor, numel: int, ctx: ReduceContext, label: str):
    """A codec phase generator (``yield from`` it inside ``reduce``): the sum over the workers of
    the sparse tensors (idx, vals) of length ``numel``; returns (mode, idx or None, values)."""
    n, rank = ctx.size, ctx.comm.rank
    if not applies(n):
        raise ValueError(f"sparse allreduce needs a power-of-two worker count, got {n}")
    with ctx.compressing():
        order = torch.argsort(idx)
        state = (SPARSE, idx[order], vals[order])
        if dense_is_smaller(idx.numel(), numel, vals.dtype):
            state = (DENSE, None, vals.new_zeros(numel).index_put_((idx,), vals, accumulate=True))
    r = 0
    while (1 << r) < n:
        partner = rank ^ (1 << r)
        with ctx.compressing():
            payload = encode(*state)
            splits = torch.zeros(n, dtype=torch.int32, device="cpu")   # Horovod reads splits on the host
            splits[partner] = payload.numel()
        received, _ = yield ctx.comm.alltoall(payload, splits, name=ctx.op_name(f"{label}.sar{r}"))
        with ctx.decompressing():
            state = merge(state, decode(received, vals.dtype), numel)
        r += 1
    return state
