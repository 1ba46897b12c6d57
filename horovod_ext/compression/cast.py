"""No compression, and low-precision transport with full-precision accumulation (fp16, bf16).

Devices: every tensor a codec makes is made on the gradient's device; the one exception is
Horovod's alltoall ``splits``, kept on the CPU on purpose (Horovod reads it on the host and copies a
device one there synchronously, see ``DoAlltoall`` in horovod/torch/mpi_ops_v2.cc).

Non-finite values: NaN/Inf on any worker reach every worker's result (a sum with a NaN is NaN, with
an Inf is Inf or NaN, in any order), so the reduced result, identical everywhere, is not finite.
These codecs keep no state, and do not look at values (no host sync); the optimizer checks the
result.

``hvd.join()`` (measured on Horovod 0.28.1, Gloo): a rank that has joined takes part in every
allreduce with zeros, and ``op=hvd.Average`` still divides by the full process-set size (joined
ranks included); allgather, alltoall and broadcast fail on the active ranks with
``HorovodInternalError: ... is not supported with Join at this time`` (the joined rank is not
affected and later collectives work). Hence:

* ``none`` and ``fp16`` (one allreduce) give exactly what ``hvd.allreduce(op=...)`` gives under join;
* ``bf16`` (alltoall + allgather) cannot: on the active ranks its reduction fails; when the
  scheduler passes that error into the codec (``generator.throw``) it raises
  :class:`JoinNotSupportedError`, which names the codec and the codecs that work with join.

Process sets (``process_set=`` of ``hvd.add_process_set``): all three work on any process set, the
rank and size being the process set's.
"""
from __future__ import annotations

import torch
import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError

from .base import Compressor, ReduceContext, ReduceGenerator, scale_for_op

#: the codecs whose collectives are all allreduces, hence usable while a rank has joined
JOIN_COMPATIBLE = "none, fp16, global_qsgd, random_block or powersgd"


class JoinNotSupportedError(RuntimeError):
    """A codec's collective (allgather, alltoall) failed because a rank has called ``hvd.join()``."""


def reraise_collective_error(label: str, kind: str, err: BaseException):
    """Raise ``err``, or, when it is Horovod's refusal of ``kind`` under join, a clear error naming the codec."""
    if isinstance(err, HorovodInternalError) and "Join" in str(err):
        raise JoinNotSupportedError(
            f"compression {label!r} cannot reduce while a worker has called hvd.join(): it needs Horovod's "
            f"{kind}, which Horovod does not run with join ({err}). Use compression {JOIN_COMPATIBLE} "
            f"(allreduce only) with hvd.join().") from err
    raise err


class NoCompression(Compressor):
    """The fp32 allreduce of ``hvd.DistributedOptimizer``: same call, same name, same result."""
    label = "none"
    supported_ops = (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product)

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        out = yield ctx.comm.allreduce_(grad, name=ctx.key, op=ctx.op, prescale_factor=ctx.prescale_factor,
                                        postscale_factor=ctx.postscale_factor)
        return out


class CastAllreduce(Compressor):
    """Cast to a dtype Horovod can sum (fp16) and allreduce it, as Horovod's ``Compression.fp16``.

    The sum is computed in fp16 by the backend (on GPUs, NCCL does it natively)."""

    reads_input_later = False     # the wire copy is made in the first phase

    def __init__(self, dtype: torch.dtype = torch.float16):
        self.dtype = dtype
        self.label = {torch.float16: "fp16"}.get(dtype, str(dtype))
        self.backend_sum_dtype = dtype

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        with ctx.compressing():
            wire = grad.to(self.dtype, copy=True) if grad.dtype.is_floating_point else grad.clone()
        out = yield ctx.comm.allreduce_(wire, name=ctx.op_name(self.label), op=ctx.op,
                                        prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor)
        with ctx.decompressing():
            return out.to(grad.dtype).view_as(grad)


class CastTwoPhase(Compressor):
    """Low-precision transport with fp32 accumulation, for dtypes Horovod cannot sum (bf16).

    Horovod's PyTorch binding has no bf16 allreduce, so the bf16 bit patterns travel as int16
    (which alltoall and allgather accept): a reduce-scatter made of one ``alltoall`` (each worker
    sends every other worker its slice; nothing is sent to itself), a local fp32 sum of the
    slices, then an ``allgather`` of the reduced slice, rounded to the wire format again.
    Each worker hands Horovod exactly 16 bits per gradient element, and the traffic per worker is
    that of a ring allreduce in 16 bits. Small tensors (fewer than 64 elements per worker) and a
    single worker use one allgather of the whole tensor, summed locally.

    Not usable while a rank has called ``hvd.join()`` (Horovod runs neither collective then).
    """

    reads_input_later = False     # the wire copy is made in the first phase

    def __init__(self, dtype: torch.dtype = torch.bfloat16, small: int = 64):
        self.dtype = dtype
        self.small = small
        self.label = {torch.bfloat16: "bf16", torch.float16: "fp16-2phase"}.get(dtype, str(dtype))

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        n, rank = ctx.size, ctx.comm.rank
        flat = grad.reshape(-1)
        numel = flat.numel()
        with ctx.compressing():
            wire = flat.to(self.dtype, copy=True)
        if n == 1 or numel < self.small * n:
            try:
                gathered = yield ctx.comm.allgather(wire.view(torch.int16), name=ctx.op_name(self.label))
            except HorovodInternalError as err:
                reraise_collective_error(self.label, "allgather", err)
            with ctx.decompressing():
                parts = gathered.view(self.dtype).view(n, numel).to(torch.float32)
                total = parts.sum(0)
                return scale_for_op(total, ctx).to(grad.dtype).view_as(grad)
        bounds = [numel * i // n for i in range(n + 1)]
        sizes = [bounds[i + 1] - bounds[i] for i in range(n)]
        sizes[rank] = 0
        # On the CPU on purpose: Horovod reads the splits on the host (a device tensor would be copied
        # there synchronously, a stream sync per tensor).
        splits = torch.tensor(sizes, dtype=torch.int32, device="cpu")
        send = torch.cat([wire[bounds[i]:bounds[i + 1]] for i in range(n) if i != rank]).view(torch.int16)
        try:
            received, _ = (yield ctx.comm.alltoall(send, splits, name=ctx.op_name(self.label + ".rs")))
        except HorovodInternalError as err:
            reraise_collective_error(self.label, "alltoall", err)
        mine_size = bounds[rank + 1] - bounds[rank]
        with ctx.decompressing():
            mine = wire[bounds[rank]:bounds[rank + 1]].to(torch.float32)
            others = received.view(self.dtype).view(n - 1, mine_size).to(torch.float32)
            reduced = scale_for_op(mine + others.sum(0), ctx)
        with ctx.compressing():
            reduced_wire = reduced.to(self.dtype).view(torch.int16)
        try:
            gathered = yield ctx.comm.allgather(reduced_wire, name=ctx.op_name(self.label + ".ag"))
        except HorovodInternalError as err:
            reraise_collective_error(self.label, "allgather", err)
        with ctx.decompressing():
            return gathered.view(self.dtype).to(grad.dtype).view_as(grad)
