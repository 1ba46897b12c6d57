"""Global-QSGD: allreduce-compatible stochastic quantization with a shared global scale.

Per tensor and step:
1. every worker computes max|g| locally; one tiny ``Max`` allreduce makes it global (the same
   scale ``s`` everywhere), carrying a non-finite flag alongside so all workers agree on NaN/Inf;
2. each worker rounds ``g * m / s`` stochastically to an integer in [-m, m]
   (E[q] = g * m / s, so the estimate is unbiased), with m = floor((2**(bits-1) - 1) / n) so that
   the n-worker sum fits a ``bits``-wide lane (see :mod:`horovod_ext.packing`);
3. the integers are packed 64/bits to an int64 word and summed by an ordinary Horovod ``Sum``
   allreduce; the lane sums are unpacked and rescaled once: avg = sum(q) * s / (m * n).
Per worker the error of an element is below s/m, hence so is the error of the average.
"""
from __future__ import annotations

import torch
import horovod.torch as hvd

from .. import packing
from .base import Compressor, ReduceContext, Reduction

NONFINITE_POLICIES = ("raise", "skip")


class GlobalQSGD(Compressor):
    def __init__(self, bits: int = 8, seed: int | None = None, nonfinite: str = "raise"):
        if bits not in packing.SUPPORTED_BITS:
            raise ValueError(f"global_qsgd: bits must be one of {packing.SUPPORTED_BITS}, got {bits!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"global_qsgd: nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        self.bits = bits
        self.seed = seed
        self.nonfinite = nonfinite
        self.label = f"global_qsgd{bits}"

    def validate(self, world_size: int, op) -> None:
        super().validate(world_size, op)
        packing.check_capacity(self.bits, world_size)

    def _generator(self, ctx: ReduceContext, device) -> torch.Generator:
        gen = ctx.state.get("rng")
        if gen is None:
            gen = torch.Generator(device=device)
            base = self.seed if self.seed is not None else torch.initial_seed()
            # Independent rounding noise per worker and per parameter (zlib-free stable hash).
            gen.manual_seed((base * 1_000_003 + ctx.comm.rank * 7919 + _stable_hash(ctx.name)) % (2**63))
            ctx.state["rng"] = gen
        return gen

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> Reduction:
        n = ctx.size
        m = packing.check_capacity(self.bits, n)
        flat = grad.reshape(-1)
        if not flat.dtype.is_floating_point:
            raise TypeError(f"global_qsgd: gradient {ctx.name!r} has dtype {flat.dtype}; expected a floating dtype")
        with ctx.compressing():
            amax = flat.abs().max().to(torch.float32) if flat.numel() else torch.zeros((), dtype=torch.float32)
            finite = bool(torch.isfinite(amax))
            header = torch.stack([amax if finite else torch.zeros_like(amax),
                                  torch.tensor(0.0 if finite else 1.0)])
        header = yield ctx.comm.allreduce_(header, name=ctx.op_name("scale"), op=hvd.Max)
        scale, flag = float(header[0]), float(header[1])
        if flag > 0:
            ctx.nonfinite = True
            return torch.zeros_like(grad)
        if scale == 0.0 or flat.numel() == 0:
            # Still take part in the payload collective: every worker must issue the same ops.
            words = torch.zeros(packing.packed_words(flat.numel(), self.bits), dtype=torch.int64)
            yield ctx.comm.allreduce_(words, name=ctx.op_name("q"), op=hvd.Sum)
            return torch.zeros_like(grad)
        # fp32 arithmetic unless the scale is so small or large that m/s or s/m leaves fp32's normal range
        work = torch.float32 if 1e-30 < scale < 1e30 else torch.float64
        with ctx.compressing():
            v = flat.to(work).mul_(m / scale)
            noise = torch.rand(v.shape, generator=self._generator(ctx, v.device), dtype=work)
            q = v.add_(noise).floor_().clamp_(-m, m)
            words = packing.pack(q, self.bits, m)
        total = yield ctx.comm.allreduce_(words, name=ctx.op_name("q"), op=hvd.Sum)
        with ctx.decompressing():
            sums = packing.unpack(total, self.bits, m, n, flat.numel())
            denom = m * (n if ctx.average else 1)
            out = sums.to(work).mul_(scale / denom)
            return out.to(grad.dtype).view_as(grad)


def _stable_hash(text: str) -> int:
    h = 1469598103934665603
    for ch in text.encode():
        h = ((h ^ ch) * 1099511628211) % (2**64)
    return h
