"""Driving codec generators: one reduction in flight, a phase-by-phase scheduler, a background
driver that advances reductions while the training thread computes, and ``hx.allreduce``
(a compressed allreduce of one tensor, outside any optimizer)."""
from __future__ import annotations

import collections
import threading

import horovod.torch as hvd
import torch

from .communicator import Communicator
from .compression import Compression, Compressor, NonFiniteGradientError, ReduceContext


class Reduction:
    """One reduction in flight (a tensor, or a group of tensors for a grouped allreduce): the codec's
    generator and the Horovod handle it waits on.

    When it ends, ``finite`` holds a 0-dim bool tensor on the result's device (no host sync): whether
    the reduced result is free of NaN/Inf. The result is identical on every worker, so every worker
    reaches the same verdict without another collective."""
    __slots__ = ("ctx", "gen", "handle", "result", "done", "error", "finite")

    def __init__(self, codec: Compressor, tensor, ctx: ReduceContext):
        self.ctx, self.gen, self.handle, self.result, self.done = ctx, codec.reduce(tensor, ctx), None, None, False
        self.error = self.finite = None
        self._advance(first=True)

    def _advance(self, value=None, first: bool = False) -> None:
        try:
            self.handle = next(self.gen) if first else self.gen.send(value)
        except StopIteration as stop:
            self.result, self.handle = stop.value, None
            self.finite = all_finite(self.result)
            self.done = True

    def step(self) -> None:
        """Wait for the current collective and run the codec up to its next one (or its end).

        A collective's error (e.g. Horovod refusing an allgather while a rank has joined) is thrown
        into the codec, which may translate it into one that names the codec."""
        try:
            value = Communicator.wait(self.handle)
        except Exception as err:
            self.gen.throw(err)
            raise
        self._advance(value)


class Driver:
    """A background thread that advances reductions as their collectives finish.

    The training thread runs each codec's first phase (compress, enqueue) from the backward hook and
    hands the reduction over; this thread waits on Horovod handles (Horovod waits without the GIL),
    decompresses and issues later phases, round-robin, so communication and codec work of step t
    proceed while the training thread computes backward (and, with pipelining, step t+1).
    """

    def __init__(self):
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hx-driver", daemon=True)
        self._thread.start()

    def submit(self, red: Reduction) -> None:
        with self._cond:
            self._queue.append(red)
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                red = self._queue.popleft()
            try:
                if not red.done:
                    red.step()
            except BaseException as err:   # surfaced in the training thread by wait()
                red.error, red.done = err, True
            with self._cond:
                if not red.done:
                    self._queue.append(red)
                self._cond.notify_all()

    def wait(self, reductions) -> None:
        """Block until every reduction is done; re-raise the first error a codec or Horovod raised."""
        reds = list(reductions)
        with self._cond:
            self._cond.wait_for(lambda: all(r.done for r in reds))
        for r in reds:
            if r.error is not None:
                raise r.error


def all_finite(result) -> torch.Tensor:
    """0-dim bool tensor: no NaN/Inf in ``result`` (a tensor, a sparse tensor or a list of them)."""
    if isinstance(result, (list, tuple)):
        flags = [all_finite(r) for r in result]
        return torch.stack([f.to(flags[0].device) for f in flags]).all() if flags else torch.tensor(True)
    values = result._values() if result.is_sparse else result
    if not values.dtype.is_floating_point:
        return torch.ones((), dtype=torch.bool, device=values.device)
    return torch.isfinite(values).all()


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
    if ctx.nonfinite or not bool(red.finite):
        raise NonFiniteGradientError(f"non-finite value (NaN or Inf) in {name!r} on at least one worker")
    return red.result
