"""No compression, and low-precision transport with full-precision accumulation (fp16, bf16)."""
from __future__ import annotations

import torch
import horovod.torch as hvd

from .base import Compressor, ReduceContext, Reduction, scale_for_op


class NoCompression(Compressor):
    """The fp32 allreduce of ``hvd.DistributedOptimizer``: same call, same name, same result."""
    label = "none"
    supported_ops = (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product)

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> Reduction:
        out = yield ctx.comm.allreduce_(grad, name=ctx.key, op=ctx.op)
        return out


class CastAllreduce(Compressor):
    """Cast to a dtype Horovod can sum (fp16) and allreduce it, as Horovod's ``Compression.fp16``.

    The sum is computed in fp16 by the backend (on GPUs, NCCL does it natively)."""

    def __init__(self, dtype: torch.dtype = torch.float16):
        self.dtype = dtype
        self.label = {torch.float16: "fp16"}.get(dtype, str(dtype))

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> Reduction:
        with ctx.compressing():
            wire = grad.to(self.dtype) if grad.dtype.is_floating_point else grad
        out = yield ctx.comm.allreduce_(wire, name=ctx.op_name(self.label), op=ctx.op)
        with ctx.decompressing():
            return out.to(grad.dtype).view_as(grad)


class CastTwoPhase(Compressor):
    """Low-precision transport with fp32 accumulation, for dtypes Horovod cannot sum (bf16).

    Horovod's PyTorch binding has no bf16 allreduce, so the bf16 bit patterns travel as int16
    (which alltoall and allgather accept): a reduce-scatter made of one ``alltoall`` (each worker
    sends every other worker its slice; nothing is sent to itself), a local fp32 sum of the
    slices, then an ``allgather`` of the reduced slice, rounded to the wire format again.
    Each worker hands Horovod exactly 16 bits per gradient element, and the traffic per worker is
    that of a ring allreduce in 16 bits. Small tensors (fewer than 64 elements per worker) are
    allgathered whole and summed locally.
    """

    def __init__(self, dtype: torch.dtype = torch.bfloat16, small: int = 64):
        self.dtype = dtype
        self.small = small
        self.label = {torch.bfloat16: "bf16", torch.float16: "fp16-2phase"}.get(dtype, str(dtype))

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> Reduction:
        n, rank = ctx.size, ctx.comm.rank
        flat = grad.reshape(-1)
        numel = flat.numel()
        with ctx.compressing():
            wire = flat.to(self.dtype)
        if numel < self.small * n:
            gathered = yield ctx.comm.allgather(wire.view(torch.int16), name=ctx.op_name(self.label))
            with ctx.decompressing():
                parts = gathered.view(self.dtype).view(n, numel).to(torch.float32)
                total = parts.sum(0)
                return scale_for_op(total, ctx).to(grad.dtype).view_as(grad)
        bounds = [numel * i // n for i in range(n + 1)]
        sizes = [bounds[i + 1] - bounds[i] for i in range(n)]
        splits = torch.tensor(sizes, dtype=torch.int32)
        splits[rank] = 0
        send = torch.cat([wire[bounds[i]:bounds[i + 1]] for i in range(n) if i != rank]).view(torch.int16)
        received, _ = (yield ctx.comm.alltoall(send, splits, name=ctx.op_name(self.label + ".rs")))
        with ctx.decompressing():
            mine = wire[bounds[rank]:bounds[rank + 1]].to(torch.float32)
            others = received.view(self.dtype).view(n - 1, sizes[rank]).to(torch.float32)
            reduced = scale_for_op(mine + others.sum(0), ctx)
        with ctx.compressing():
            reduced_wire = reduced.to(self.dtype).view(torch.int16)
        gathered = yield ctx.comm.allgather(reduced_wire, name=ctx.op_name(self.label + ".ag"))
        with ctx.decompressing():
            return gathered.view(self.dtype).to(grad.dtype).view_as(grad)
