"""``hx.Compression``: the codecs, named like Horovod's ``hvd.Compression``.

``Compression.none`` and ``.fp16`` / ``.bf16`` are ready-made instances (as in Horovod);
``global_qsgd``, ``topk`` and ``random_block`` are factories that take their parameters.
"""
from __future__ import annotations

import torch

from .base import Compressor, NonFiniteGradientError, ReduceContext
from .cast import CastAllreduce, CastTwoPhase, NoCompression
from .quantize import GlobalQSGD
from .sparsify import RandomBlock, TopK


class Compression:
    """Namespace of gradient codecs for :func:`horovod_ext.DistributedOptimizer`."""

    none: Compressor = NoCompression()
    fp16: Compressor = CastAllreduce(torch.float16)
    bf16: Compressor = CastTwoPhase(torch.bfloat16)

    @staticmethod
    def global_qsgd(bits: int = 8, seed: int | None = None, nonfinite: str = "raise",
                    bucket: int = 512) -> Compressor:
        """Global-QSGD with ``bits`` bits per element on the wire (8, 4 or 2).

        ``bucket``: elements per shared scale (one float32 each in the Max allreduce); 0 gives one
        scale per tensor. ``nonfinite``: ``"raise"`` (every worker raises NonFiniteGradientError) or
        ``"skip"`` (every worker skips the step)."""
        return GlobalQSGD(bits=bits, seed=seed, nonfinite=nonfinite, bucket=bucket)

    @staticmethod
    def topk(ratio: float, importance: bool = False, error_feedback: bool = True) -> Compressor:
        """Keep the ``ratio`` largest entries per tensor (by |g|, or |g|*(|w|+mean|w|) with importance)."""
        return TopK(ratio, importance=importance, error_feedback=error_feedback)

    @staticmethod
    def random_block(ratio: float, detached: bool = True, coeff: float = 0.3, seed: int = 0) -> Compressor:
        """A random contiguous block per tensor from a shared seed; DEF when ``detached``."""
        return RandomBlock(ratio, detached=detached, coeff=coeff, seed=seed)

    @staticmethod
    def from_spec(spec: str) -> Compressor:
        """Build a codec from a short string, for configs and command lines.

        Examples: ``none``, ``fp16``, ``bf16``, ``global_qsgd8`` (512-element buckets),
        ``global_qsgd8-b4096``, ``global_qsgd8-tensor`` (one scale per tensor), ``global_qsgd4``,
        ``topk0.01``, ``topk0.01-imp``, ``random_block0.01``, ``random_block0.01-ef``."""
        s = spec.strip().lower()
        if s in ("none", "fp32"):
            return Compression.none
        if s == "fp16":
            return Compression.fp16
        if s == "bf16":
            return Compression.bf16
        if s.startswith("global_qsgd"):
            body, *flags = s[len("global_qsgd"):].split("-")
            bucket = 512
            for f in flags:
                if f == "tensor":
                    bucket = 0
                elif f.startswith("b") and f[1:].isdigit():
                    bucket = int(f[1:])
                else:
                    raise ValueError(f"unknown global_qsgd option {f!r} in {spec!r}; expected -bN or -tensor")
            return Compression.global_qsgd(int(body or 8), bucket=bucket)
        if s.startswith("topk"):
            body, *flags = s[len("topk"):].split("-")
            return Compression.topk(float(body or 0.01), importance="imp" in flags,
                                    error_feedback="noef" not in flags)
        if s.startswith("random_block"):
            body, *flags = s[len("random_block"):].split("-")
            return Compression.random_block(float(body or 0.01), detached="ef" not in flags)
        raise ValueError(f"unknown compression {spec!r}; expected one of none, fp16, bf16, global_qsgd8|4|2[-bN|-tensor], "
                         f"topkRATIO[-imp][-noef], random_blockRATIO[-ef]")


__all__ = ["Compression", "Compressor", "ReduceContext", "NonFiniteGradientError"]
