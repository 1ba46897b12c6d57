"""``hx.Compression``: the codecs, named like Horovod's ``hvd.Compression``.

``Compression.none`` and ``.fp16`` / ``.bf16`` are ready-made instances (as in Horovod);
``global_qsgd``, ``topk``, ``random_block`` and ``powersgd`` are factories that take their parameters.
"""
from __future__ import annotations

import re

import torch

from .base import Compressor, NonFiniteGradientError, ReduceContext
from .cast import CastAllreduce, CastTwoPhase, NoCompression
from .powersgd import PowerSGD
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
    def topk(ratio: float, importance: bool = False, error_feedback: bool = True, detached: bool | None = None,
             coeff: float = 0.3, transport: str = "allgather") -> Compressor:
        """Keep the ``ratio`` largest entries per tensor (by |g|, or |g|*(|w|+mean|w|) with importance);
        ``detached``: DEF (the default with error feedback), ``False``: classic error feedback. DEF is
        level with it under plain SGD and ahead under momentum and Adam (convergence benchmark, 3 seeds);
        each worker's model then differs from the synchronized one by coeff * D(residual);
        ``transport``: ``"allgather"`` of every worker's pairs, or ``"sparse_allreduce"`` (SparCML's
        recursive doubling with a dense switch; power-of-two worker counts, else allgather)."""
        return TopK(ratio, importance=importance, error_feedback=error_feedback, detached=detached, coeff=coeff,
                    transport=transport)

    @staticmethod
    def random_block(ratio: float, detached: bool = True, coeff: float = 0.3, seed: int = 0,
                     error_feedback: bool = True) -> Compressor:
        """A random contiguous block per tensor from a shared seed; DEF when ``detached`` (else classic
        error feedback, or none with ``error_feedback=False``)."""
        return RandomBlock(ratio, detached=detached, coeff=coeff, seed=seed, error_feedback=error_feedback)

    @staticmethod
    def powersgd(rank: int = 4, min_compression_rate: float = 2.0, seed: int = 0,
                 error_feedback: bool = True) -> Compressor:
        """PowerSGD: a rank-``rank`` approximation per matrix, two allreduces (P, then Q), error feedback and
        warm start, as PyTorch DDP's ``powerSGD_hook``. 1-D tensors, and matrices whose
        (n + m) * rank * ``min_compression_rate`` >= n * m, go as a plain allreduce; ``seed`` draws the
        first Q (the same on every worker)."""
        return PowerSGD(rank=rank, min_compression_rate=min_compression_rate, seed=seed,
                        error_feedback=error_feedback)

    @staticmethod
    def from_spec(spec: str) -> Compressor:
        """Build a codec from a short string (its ``label``), for configs and command lines.

        ``none`` (or ``fp32``), ``fp16``, ``bf16``;
        ``global_qsgd8`` (8, 4 or 2 bits) with ``-bN`` (N-element buckets; 512 by default) or ``-tensor``
        (one scale per tensor), ``-sN`` (rounding seed), ``-skip`` (skip non-finite steps by default);
        ``topk0.01`` (DEF) with ``-imp`` (importance-weighted), ``-ef`` (classic error feedback) or
        ``-noef`` (none), ``-cX`` (DEF coefficient, 0.3), ``-sar`` (sparse allreduce transport instead of
        allgather; ``-def`` is accepted and changes nothing);
        ``random_block0.01`` (DEF) with ``-ef`` (classic error feedback) or ``-noef``, ``-cX`` (DEF
        coefficient, 0.3), ``-sN`` (block seed); ``powersgd4`` (rank 4 by default) with ``-mcrX``
        (minimum compression rate, 2), ``-sN`` (seed of the first Q), ``-noef`` (no error feedback).
        Every option is checked; an unknown one is an error that lists the valid ones. Every codec's
        ``label`` parses back to the same codec."""
        s = spec.strip().lower()
        for prefix in sorted(_PARSERS, key=len, reverse=True):
            if s.startswith(prefix):
                body, rest = re.match(r"([0-9.]*(?:e[-+]?[0-9]+)?)(.*)", s[len(prefix):]).groups()
                if rest and not rest.startswith("-"):
                    raise ValueError(f"compression {spec!r}: expected -OPTION after {prefix + body!r}, got {rest!r}")
                return _PARSERS[prefix](spec, body, rest[1:].split("-") if rest else [])
        raise ValueError(f"unknown compression {spec!r}; expected one of none, fp16, bf16, "
                         f"global_qsgd8|4|2[-bN|-tensor][-sN][-skip], topkRATIO[-imp][-ef|-noef][-cX][-sar], "
                         f"random_blockRATIO[-ef|-noef][-cX][-sN], powersgdRANK[-mcrX][-sN][-noef]")


def _options(spec: str, flags: list[str], allowed: dict) -> dict:
    """Parse ``flags`` against ``allowed`` ({name: value parser or None for a bare flag})."""
    out = {}
    for f in flags:
        for name, parse in sorted(allowed.items(), key=lambda kv: -len(kv[0])):
            if parse is None and f == name:
                out[name] = True
                break
            if parse is not None and f.startswith(name) and f != name:
                try:
                    out[name] = parse(f[len(name):])
                except ValueError:
                    raise ValueError(f"option -{f} in {spec!r}: {f[len(name):]!r} is not a valid value") from None
                break
        else:
            valid = ", ".join(f"-{n}" if p is None else f"-{n}VALUE" for n, p in allowed.items())
            raise ValueError(f"unknown option -{f} in compression {spec!r}; valid options: {valid}")
    return out


def _number(kind: str, spec: str, body: str, default: float, parse=float):
    try:
        return parse(body) if body else default
    except ValueError:
        raise ValueError(f"compression {spec!r}: {body!r} is not a valid {kind}") from None


def _plain(codec: Compressor):
    def parse(spec, body, flags):
        if body or flags:
            raise ValueError(f"compression {spec!r}: {codec.label!r} takes no options")
        return codec
    return parse


def _global_qsgd(spec, body, flags):
    o = _options(spec, flags, {"tensor": None, "b": int, "s": int, "skip": None})
    if "tensor" in o and "b" in o:
        raise ValueError(f"compression {spec!r}: -tensor and -bN both set the scale's extent; give one")
    return Compression.global_qsgd(_number("bit width", spec, body, 8, int), seed=o.get("s"),
                                   nonfinite="skip" if o.get("skip") else "raise",
                                   bucket=0 if o.get("tensor") else o.get("b", 512))


def _feedback(spec: str, o: dict) -> dict:
    """The sparsifiers' residual options: DEF by default, ``-ef`` classic error feedback, ``-noef`` none (``-def``
    is accepted and changes nothing); ``-cX`` is DEF's coefficient and cannot go with the other two."""
    if sum(k in o for k in ("def", "ef", "noef")) > 1:
        raise ValueError(f"compression {spec!r}: give at most one of -def, -ef, -noef")
    if "c" in o and ("ef" in o or "noef" in o):
        raise ValueError(f"compression {spec!r}: -cX is DEF's coefficient; it cannot go with -ef or -noef")
    return {"detached": not (o.get("ef") or o.get("noef")), "error_feedback": not o.get("noef"),
            "coeff": o.get("c", 0.3)}


_FEEDBACK_OPTIONS = {"def": None, "ef": None, "noef": None, "c": float}


def _topk(spec, body, flags):
    o = _options(spec, flags, {"imp": None, **_FEEDBACK_OPTIONS, "sar": None})
    return Compression.topk(_number("ratio", spec, body, 0.01), importance=bool(o.get("imp")),
                            transport="sparse_allreduce" if o.get("sar") else "allgather", **_feedback(spec, o))


def _random_block(spec, body, flags):
    o = _options(spec, flags, {**_FEEDBACK_OPTIONS, "s": int})
    return Compression.random_block(_number("ratio", spec, body, 0.01), seed=o.get("s", 0), **_feedback(spec, o))


def _powersgd(spec, body, flags):
    o = _options(spec, flags, {"mcr": float, "s": int, "noef": None})
    return Compression.powersgd(_number("rank", spec, body, 4, int), min_compression_rate=o.get("mcr", 2.0),
                                seed=o.get("s", 0), error_feedback=not o.get("noef"))


_PARSERS = {"none": _plain(Compression.none), "fp32": _plain(Compression.none), "fp16": _plain(Compression.fp16),
            "bf16": _plain(Compression.bf16), "global_qsgd": _global_qsgd, "topk": _topk,
            "random_block": _random_block, "powersgd": _powersgd}


__all__ = ["Compression", "Compressor", "ReduceContext", "NonFiniteGradientError"]
