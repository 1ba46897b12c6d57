"""Global-QSGD: allreduce-compatible stochastic quantization with a shared global scale.

Per tensor and step:
1. every worker computes max|g| locally per bucket of ``bucket`` consecutive elements (QSGD's
   bucketing; ``bucket=0``: one scale for the whole tensor, as in the Global-QSGD paper); one small
   ``Max`` allreduce makes the scales global (the same ``s`` everywhere), carrying a non-finite flag
   alongside so all workers agree on NaN/Inf. With one scale per tensor, every element far below
   the tensor's largest is mostly rounding noise: on the BFA model's real gradients the averaged
   gradient's relative L2 error was 0.21 per tensor and 0.043 with 512-element buckets, for 32/512
   extra bits per element (see the README);
2. each worker rounds ``g * m / s`` stochastically to an integer in [-m, m]
   (E[q] = g * m / s, so the estimate is unbiased), with m = floor((2**(bits-1) - 1) / n) so that
   the n-worker sum fits a ``bits``-wide lane (see :mod:`horovod_ext.packing`);
3. the integers are packed 64/bits to an int64 word and summed by an ordinary Horovod ``Sum``
   allreduce; the lane sums are unpacked and rescaled once: avg = sum(q) * s / (m * n).
Per worker the error of an element is below s/m (s its bucket's scale), hence so is the error of
the average.

The Sum payload carries one more int64 word: 1 from every worker, so its sum is the number c of
workers that contributed. A rank that has called ``hvd.join()`` takes part in allreduces with all-zero
words (measured on Horovod 0.28.1), and an all-zero word is not a neutral element of the offset-binary
lanes (a zero lane means q = -m); unpacking with c instead of n removes exactly the offsets that were
added. So under join the result is what ``hvd.allreduce(op=...)`` gives for the plain tensors
(joined ranks count as zeros; Average divides by the process-set size, joined ranks included), within
the quantization bound. The scale header is a Max allreduce of values >= 0, for which the joined
ranks' zeros are neutral too. Works on any process set (rank and size are the process set's).

Non-finite values: a worker whose gradient holds NaN/Inf raises the flag in the header; the Max
makes it global, and every worker returns a NaN-filled result and sets ``ctx.nonfinite`` (the
optimizer applies its policy, see ``nonfinite``; the codec itself neither raises nor skips). The
codec's dither counter advances all the same (it is drawn when the reduction starts), identically
on every worker. Devices: every tensor is made on the
gradient's device; the host reads the header once per tensor (flag, largest and smallest scale, in
one transfer), which the control flow needs.

Speed (:mod:`horovod_ext.kernels`): three passes over the data. One reads the gradient for the
bucket scales; one reads it again and writes the packed bytes (scale, dither, floor, clamp, offset,
pack in one loop); after the allreduce one reads the summed bytes and writes the averaged gradient
straight into ``p.grad`` where the optimizer allows it (``ctx.out``). The dither is a counter-based
hash of (worker, tensor, draw, element), so no generator state is read or written element by
element, and any element's noise can be recomputed: the native float32 CPU kernels and the torch
reference (CUDA, float64) give the same bits. Its 24-bit resolution makes E[q] = g*m/s to within
2**-24 of a level.
"""
from __future__ import annotations

import torch
import horovod.torch as hvd

from .. import packing
from ..kernels import qsgd as kernels
from .base import Compressor, ReduceContext, ReduceGenerator, stable_hash

NONFINITE_POLICIES = ("raise", "skip")


class GlobalQSGD(Compressor):
    per_worker_averaged = ()
    uses_out = True
    per_worker_fresh = ("dither_base", "rng")      # "rng": checkpoints written before the counter-based dither

    def __init__(self, bits: int = 8, seed: int | None = None, nonfinite: str = "raise", bucket: int = 512):
        if bits not in packing.SUPPORTED_BITS:
            raise ValueError(f"global_qsgd: bits must be one of {packing.SUPPORTED_BITS}, got {bits!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"global_qsgd: nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if not isinstance(bucket, int) or bucket < 0:
            raise ValueError(f"global_qsgd: bucket must be an int >= 0 (0: one scale per tensor), got {bucket!r}")
        self.bits = bits
        self.seed = seed
        #: the default non-finite policy of an optimizer using this codec ("raise" or "skip"); the
        #: codec itself only reports (NaN result, ctx.nonfinite)
        self.nonfinite = nonfinite
        self.bucket = bucket
        self.label = (f"global_qsgd{bits}" + ("" if bucket == 512 else f"-b{bucket}" if bucket else "-tensor")
                      + (f"-s{seed}" if seed is not None else "") + ("-skip" if nonfinite == "skip" else ""))

    def validate(self, world_size: int, op) -> None:
        super().validate(world_size, op)
        packing.check_capacity(self.bits, world_size)

    def _dither_key(self, ctx: ReduceContext) -> tuple[int, int]:
        """This worker's dither key for this tensor's next draw; the draw counter advances."""
        st = ctx.state
        if "dither_base" not in st:
            base = self.seed if self.seed is not None else torch.initial_seed()
            # Independent rounding noise per worker and per parameter (zlib-free stable hash).
            st["dither_base"] = (base * 1_000_003 + ctx.comm.rank * 7919 + stable_hash(ctx.name)) % (2**63)
            st["dither_step"] = 0
        step = st["dither_step"]
        st["dither_step"] = step + 1
        return kernels.step_key(st["dither_base"], step)

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        n = ctx.size
        m = packing.check_capacity(self.bits, n)
        flat = grad.reshape(-1)
        if not flat.dtype.is_floating_point:
            raise TypeError(f"global_qsgd: gradient {ctx.name!r} has dtype {flat.dtype}; expected a floating dtype")
        size = flat.numel()
        dev = flat.device
        bucket = self.bucket if 0 < self.bucket < size else max(size, 1)
        # The draw is taken in the first phase (in the order the reductions start, on one thread), not
        # when the payload is encoded: with pipelining two reductions of a tensor are in flight, and their
        # scale allreduces may finish in either order; a resumed run must draw as the uninterrupted one.
        key = self._dither_key(ctx)
        with ctx.compressing():
            amax = kernels.bucket_amax(flat, bucket) if size else torch.zeros(1, dtype=torch.float32, device=dev)
            finite = torch.isfinite(amax)
            # scales (a non-finite bucket sends 0: the flag says it all) and the non-finite flag, no host sync
            header = torch.cat([amax.where(finite, 0.0), (~finite.all()).to(torch.float32).reshape(1)])
        header = yield ctx.comm.allreduce_(header, name=ctx.op_name("scale"), op=hvd.Max)
        scales = header[:-1]
        # One host read for the control flow: the flag, the largest scale and the smallest non-zero one.
        flag, top, low = torch.stack([header[-1], scales.max(),
                                      scales.where(scales > 0, float("inf")).min()]).tolist()
        if flag > 0:
            ctx.nonfinite = True
            return torch.full_like(grad, float("nan"))
        words = packing.packed_words(size, self.bits)
        if top == 0.0 or size == 0:
            # Still take part in the payload collective: every worker must issue the same ops.
            payload = torch.zeros(words + 1, dtype=torch.int64, device=dev)
            payload[-1] = 1
            yield ctx.comm.allreduce_(payload, name=ctx.op_name("q"), op=hvd.Sum)
            return torch.zeros_like(grad)
        # fp32 arithmetic unless a scale is so small or large that m/s or s/m leaves fp32's normal range
        work = torch.float32 if 1e-30 < low and top < 1e30 else torch.float64
        s = scales.to(work)
        s = torch.where(s > 0, s, 1.0)  # an all-zero bucket quantizes to zeros whatever its scale
        with ctx.compressing():
            payload = kernels.encode(flat, bucket, m / s, m, self.bits, key, extra_words=1)
            payload[-1] = 1                      # counts the contributing workers (see the module docstring)
        total = yield ctx.comm.allreduce_(payload, name=ctx.op_name("q"), op=hvd.Sum)
        with ctx.decompressing():
            denom = m * (n if ctx.average else 1)
            workers = int(total[words]) if total.device.type == "cpu" else total[words]
            out = ctx.output(work) if grad.dtype == work else None
            result = kernels.decode(total[:words], size, bucket, s / denom, m, self.bits, workers,
                                    out=None if out is None else out.view(-1))
            if out is not None:
                return out
            return result.to(grad.dtype).view_as(grad)


