"""What ``hvd.DistributedOptimizer`` does that is not a codec of ours, expressed as codecs.

* :func:`as_codec` accepts Horovod's own compression objects: ``hvd.Compression.none`` and ``.fp16``
  mean ours; any other ``horovod.torch.compression.Compressor`` runs as Horovod runs it (compress,
  one allreduce, decompress), so a script that already passes one keeps working.
* :class:`SparseAllgather` is Horovod's reduction of a sparse gradient (``sparse_allreduce_async``):
  every worker's values and indices are allgathered, and the concatenation is the sum.
* :class:`GroupedAllreduce` is Horovod's grouped allreduce (``groups=``): the gradients of one group
  go to Horovod as one ``grouped_allreduce_async_``, which it fuses and completes together.
"""
from __future__ import annotations

import torch
import horovod.torch as hvd
from horovod.torch.compression import Compressor as HorovodCompressorBase, FP16Compressor, NoneCompressor

from .base import Compressor, ReduceContext, ReduceGenerator


def _horovod_compressor(obj) -> bool:
    return (isinstance(obj, type) and issubclass(obj, HorovodCompressorBase)) or isinstance(obj, HorovodCompressorBase)


def as_codec(compression) -> Compressor:
    """An hx codec for ``compression``: ours as is, Horovod's mapped or wrapped; a clear error otherwise."""
    from . import Compression
    if isinstance(compression, Compressor):
        return compression
    if compression is NoneCompressor or isinstance(compression, NoneCompressor):
        return Compression.none
    if compression is FP16Compressor or isinstance(compression, FP16Compressor):
        return Compression.fp16
    if _horovod_compressor(compression):
        return HorovodCompressor(compression)
    raise TypeError(f"compression must be an hx.Compression codec (e.g. hx.Compression.global_qsgd(8)) or a Horovod "
                    f"compressor (hvd.Compression.none, hvd.Compression.fp16, a horovod.torch.compression."
                    f"Compressor subclass); got {compression!r}")


class HorovodCompressor(Compressor):
    """A user's Horovod ``Compressor`` run exactly as ``hvd.DistributedOptimizer`` runs it."""
    supported_ops = (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product)

    def __init__(self, compressor):
        self.compressor = compressor
        self.label = f"horovod:{getattr(compressor, '__name__', type(compressor).__name__)}"

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        with ctx.compressing():
            wire, hctx = self.compressor.compress(grad)
        out = yield ctx.comm.allreduce_(wire, name=ctx.key, op=ctx.op, prescale_factor=ctx.prescale_factor,
                                        postscale_factor=ctx.postscale_factor)
        with ctx.decompressing():
            return self.compressor.decompress(out, hctx)


class SparseAllgather(Compressor):
    """A sparse gradient as Horovod reduces it: allgather of values and of indices; average divides."""
    label = "sparse-allgather"
    supported_ops = (hvd.Average, hvd.Sum)

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:
        indices = ctx.comm.allgather(grad._indices().transpose(0, 1).contiguous(), name=f"{ctx.key}.indices")
        values = ctx.comm.allgather(grad._values(), name=f"{ctx.key}.values")
        values = yield values                    # values first, as Horovod waits (horovod issue 2961)
        indices = yield indices
        if ctx.average:
            values = values / ctx.size
        if indices.dim() == 0 or values.dim() == 0:
            return grad.new().resize_as_(grad)
        return grad.new(indices.transpose(0, 1), values, grad.size())


class GroupedAllreduce(Compressor):
    """One ``grouped_allreduce_async_`` for a list of dense gradients; returns the list."""
    label = "grouped"
    supported_ops = (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product)

    def reduce(self, grads: list, ctx: ReduceContext) -> ReduceGenerator:
        out = yield ctx.comm.grouped_allreduce_(grads, name=ctx.key, op=ctx.op, prescale_factor=ctx.prescale_factor,
                                                postscale_factor=ctx.postscale_factor)
        return list(out)

