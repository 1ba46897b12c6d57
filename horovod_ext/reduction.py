"""Driving codec generators: one reduction in flight, a phase-by-phase scheduler, and
``hx.allreduce`` (a compressed allreduce of one tensor, outside any optimizer)."""
from __future__ import annotations

import horovod.torch as hvd
import torch

from .communicator import Communicator
from .compression import Compression, Compressor, NonFiniteGradientError, ReduceContext


class Reduction:
    """One tensor's reduction in flight: the codec's generator and the Horovod handle it waits on."""
    __slots__ = ("ctx", "gen", "handle", "result", "done")

    def __init__(self, codec: Compressor, tensor: torch.Tensor, ctx: ReduceContext):
        self.ctx, self.gen, self.handle, self.result, self.done = ctx, codec.reduce(tensor, ctx), None, None, False
        self._advance(first=True)

    def _advance(self, value=None, first: bool = False) -> None:
        try:
            self.handle = next(self.gen) if first else self.gen.send(value)
        except StopIteration as stop:
            self.result, self.done, self.handle = stop.value, True, None

    def step(self) -> None:
        """Wait for the current collective and run the codec up to its next one (or its end)."""
        stats = self.ctx.comm.stats
        with stats.timing("wait_s"):
            out = Communicator.wait(self.handle)
        self._advance(out)


def complete(reductions) -> None:
    """Run reductions to completion one phase of all of them at a time, so that the second-phase
    collectives of every tensor are in flight together."""
    active = [r for r in reductions if not r.done]
    while active:
        for red in active:
            red.step()
        active = [r for r in active if not r.done]


_functional_comms: dict = {}


def allreduce(tensor: torch.Tensor, name: str, compression: Compressor = Compression.none, op=hvd.Average,
              process_set=hvd.global_process_set, state: dict | None = None) -> torch.Tensor:
    """Compressed allreduce of one tensor; returns the reduced tensor (``tensor`` may be modified).

    ``state`` is the codec's per-name state (error-feedback residuals); pass the same dict on every
    call for the same tensor to keep it. Raises :class:`NonFiniteGradientError` on every worker when
    a codec that checks finiteness (Global-QSGD) sees NaN/Inf on any worker.
    """
    compression.validate(process_set.size(), op)
    comm = _functional_comms.setdefault(id(process_set), Communicator(process_set))
    ctx = ReduceContext(name=name, state=state if state is not None else {}, comm=comm, op=op)
    red = Reduction(compression, tensor, ctx)
    complete([red])
    if ctx.nonfinite:
        raise NonFiniteGradientError(f"non-finite value (NaN or Inf) in {name!r} on at least one worker")
    return red.result
