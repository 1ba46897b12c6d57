"""The one interface every gradient codec plugs into.

Horovod's own ``Compressor`` is two static functions around a single allreduce. Compressed
allreduce needs more: several collectives per tensor (a global scale, then the payload), state per
parameter name (error-feedback residuals), and sometimes a say in the parameter update (DEF). So a
codec here is, like a PyTorch DDP communication hook, a function plus explicit state:

``Compressor.reduce(grad, ctx)`` is a generator. It issues Horovod collectives through
``ctx.comm`` and yields each handle; the optimizer's scheduler waits for the handle and sends the
result back in. The generator's return value is the reduced gradient. Because every tensor's
generator is advanced phase by phase, the phase-2 collectives of all tensors are in flight
together, and phase 1 starts during backward, as soon as a gradient is ready.
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from typing import Any, Generator

import torch
import horovod.torch as hvd

from ..communicator import Communicator

ReduceGenerator = Generator[Any, Any, torch.Tensor]


class NonFiniteGradientError(FloatingPointError):
    """Raised on every worker when a gradient holds NaN or Inf and the codec cannot average it."""


@dataclasses.dataclass
class ReduceContext:
    """Everything a codec may use while reducing one gradient tensor."""
    name: str                 # unique, stable parameter name (the Horovod op name is derived from it)
    state: dict               # this parameter's persistent codec state (residuals, step counters)
    comm: Communicator
    op: Any                   # hvd.Average or hvd.Sum
    param: torch.Tensor | None = None
    nonfinite: bool = False   # set by a codec when the global gradient is not finite
    slot: int | None = None   # pipeline slot: two steps in flight need distinct Horovod op names
    # Horovod's gradient_predivide_factor f: scale by 1/f before the sum and f/n after it (op Average).
    # Codecs that sum in floating point (none, fp16, Horovod compressors) honour it; for the others
    # it changes nothing but rounding, and they ignore it.
    prescale_factor: float = 1.0
    postscale_factor: float = 1.0
    # Where the result may be written (p.grad, when nothing else writes it before the result is
    # applied); a codec that decodes straight into it saves a full pass and a fresh allocation.
    out: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def average(self) -> bool:
        return self.op == hvd.Average

    @property
    def key(self) -> str:
        """Unique Horovod op name for this tensor in this slot (the plain name when not pipelined)."""
        return self.name if self.slot is None else f"{self.name}@{self.slot}"

    def op_name(self, phase: str) -> str:
        return f"hx.{self.key}.{phase}"

    def output(self, dtype: torch.dtype):
        """``out`` when a result of ``dtype`` may be written there (same dtype, contiguous), else None.
        Returning that very tensor from ``reduce`` lets the optimizer skip its copy into ``p.grad``."""
        out = self.out
        return out if out is not None and out.dtype == dtype and out.is_contiguous() else None

    # Codec work is timed twice: wall time (what a step waits for) and this thread's CPU time, which a
    # busy machine does not inflate (a preempted thread accrues none), for the adaptive cost rule.
    @contextmanager
    def compressing(self):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.comm.stats.compress_s += time.perf_counter() - t0
            self.comm.stats.compress_cpu_s += time.thread_time() - c0

    @contextmanager
    def decompressing(self):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.comm.stats.decompress_s += time.perf_counter() - t0
            self.comm.stats.decompress_cpu_s += time.thread_time() - c0


class Compressor:
    """Base class: configuration only; per-parameter state lives in ``ctx.state``.

    The contract with the optimizer, beyond ``reduce``:

    * ``label``: a short identifier; ``Compression.from_spec(label)`` builds the same codec again;
    * ``nonfinite``: the codec's default for the optimizer's non-finite policy (``None``: ``"raise"``).
      Whatever the policy, NaN/Inf in any worker's input must reach every worker's result;
    * state: ``ctx.state`` holds tensors, numbers and ``torch.Generator`` only (checkpoints load with
      ``weights_only=True``). Keys in ``per_worker_averaged`` are per worker and averaged when a
      checkpoint moves to another worker count; keys in ``per_worker_fresh`` are per worker and
      start fresh there; every other key is replicated (the same on every worker);
    * ``release(state)``: what the codec holds back (error feedback), handed over when the optimizer
      sends a tensor uncompressed instead;
    * ``before_step`` / ``after_step`` / ``on_load``: a say in the parameter update (DEF).
    """

    #: short identifier used in logs, benchmarks and JSON; parses back to the same codec
    label: str = "base"
    #: ops this codec can reduce with
    supported_ops = (hvd.Average, hvd.Sum)
    #: default non-finite policy for the optimizer ("raise" or "skip"; None: the optimizer's default)
    nonfinite: str | None = None
    #: state keys that are per worker: averaged, or started fresh, when the worker count changes
    per_worker_averaged: tuple = ("residual",)
    per_worker_fresh: tuple = ("rng",)
    #: whether ``reduce`` reads its input after its first yield; if not, the optimizer hands it
    #: ``p.grad`` itself even when pipelining (no snapshot copy), because the codec has taken what
    #: it needs before the next backward can write ``p.grad``
    reads_input_later: bool = True
    #: whether ``reduce`` writes its result into ``ctx.out`` when given one (the optimizer then hands
    #: it p.grad, or, pipelining, a buffer kept per parameter and slot instead of a fresh tensor)
    uses_out: bool = False
    #: the dtype Horovod's backend sums this codec's payload in, when that sum may cost more than an
    #: fp32 one (float16: Gloo and MPI sum it in software on CPU tensors); the adaptive rule then
    #: measures that cost once and counts it with the codec's (None: nothing to measure)
    backend_sum_dtype: torch.dtype | None = None

    def release(self, state: dict):
        """Take what error feedback held back out of ``state`` (None when nothing is held)."""
        return state.pop("residual", None)

    def validate(self, world_size: int, op) -> None:
        """Raise a clear error when this codec cannot serve ``world_size`` workers with ``op``."""
        if op not in self.supported_ops:
            raise ValueError(f"compression {self.label!r} supports op=hvd.Average or hvd.Sum, got {op!r}")

    def reduce(self, grad: torch.Tensor, ctx: ReduceContext) -> ReduceGenerator:  # pragma: no cover
        raise NotImplementedError

    # Hooks around the wrapped optimizer's step; only DEF uses them.
    def before_step(self, param: torch.Tensor, state: dict, group: dict) -> None:
        pass

    def after_step(self, param: torch.Tensor, state: dict, group: dict) -> None:
        pass

    def on_load(self, param: torch.Tensor, state: dict, group: dict) -> None:
        """After a checkpoint restored ``state`` (and the model): re-derive what is per worker in the
        parameters themselves (DEF: this worker's x = x~ - coeff * lr * e, from its own residual)."""
        pass

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"


def stable_hash(text: str) -> int:
    """A hash of ``text`` that is the same in every process and run (Python's ``hash`` is salted)."""
    h = 1469598103934665603
    for ch in text.encode():
        h = ((h ^ ch) * 1099511628211) % (2**64)
    return h


def scale_for_op(tensor: torch.Tensor, ctx: ReduceContext) -> torch.Tensor:
    """Turn a sum over workers into what ``ctx.op`` asks for (in place)."""
    if ctx.average and ctx.size > 1:
        tensor.div_(ctx.size)
    return tensor
