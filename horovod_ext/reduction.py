"""Driving codec generators: one reduction in flight, a phase-by-phase scheduler, a background
driver that advances reductions while the training thread computes, the rounds of an optimizer's
reductions (pending, pipelined in flight, ready), and ``hx.allreduce`` (a compressed allreduce of
one tensor, outside any optimizer)."""
from __future__ import annotations

import collections
import threading
import time
import warnings

import horovod.torch as hvd
import torch

from .finite import all_finite
from .communicator import Communicator
from .compression import Compression, Compressor, NonFiniteGradientError, ReduceContext


class Reduction:
    """One reduction in flight (a tensor, or a group of tensors for a grouped allreduce): the codec's
    generator and the Horovod handle it waits on.

    When it ends, ``finite`` holds a 0-dim bool tensor on the result's device (no host sync): whether
    the reduced result is free of NaN/Inf. The result is identical on every worker, so every worker
    reaches the same verdict without another collective."""
    __slots__ = ("ctx", "gen", "handle", "result", "done", "error", "finite", "started")

    def __init__(self, codec: Compressor, tensor, ctx: ReduceContext, start: bool = True):
        """``start=False`` leaves the codec's first phase (its compression, up to the first collective)
        to whoever calls :meth:`step` first: the driver thread, so it overlaps backward."""
        self.ctx, self.gen, self.handle, self.result, self.done = ctx, codec.reduce(tensor, ctx), None, None, False
        self.error = self.finite = None
        self.started = False
        if start:
            self._advance(first=True)

    def _advance(self, value=None, first: bool = False) -> None:
        self.started = True
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
        if not self.started:
            self._advance(first=True)
            return
        try:
            value = Communicator.wait(self.handle)
        except Exception as err:
            self.gen.throw(err)
            raise
        self._advance(value)


class Driver:
    """A background thread that advances reductions as their collectives finish.

    The training thread hands each reduction over from the backward hook (pipelining: after running
    the codec's first phase itself); this thread starts the ones not started yet (compress, enqueue),
    polls the Horovod handles of the others and advances those whose collective has finished
    (decompress, next phase), so communication and codec work of step t proceed while the training
    thread computes backward (and, with pipelining, step t+1). It never blocks on one handle while
    another reduction could be started or advanced.
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
        # One pass over the queue at a time: start every reduction not yet started (its first phase,
        # the compression), and advance every one whose collective has finished; never block on one
        # handle while another reduction could be started or advanced. With nothing to do, sleep on
        # the condition with a short, growing timeout (a submit wakes it): no spinning.
        delay = 5e-5
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                batch = list(self._queue)
            progressed = False
            for red in batch:
                if red.done:
                    continue
                try:
                    if red.started and not hvd.poll(red.handle):
                        continue
                    red.step()
                except BaseException as err:   # surfaced in the training thread by wait()
                    red.error, red.done = err, True
                progressed = True
            with self._cond:
                self._queue = collections.deque(r for r in self._queue if not r.done)
                self._cond.notify_all()
                if progressed:
                    delay = 5e-5
                else:
                    self._cond.wait(timeout=delay)
                    delay = min(2 * delay, 2e-3)

    def wait(self, reductions) -> None:
        """Block until every reduction is done; re-raise the first error a codec or Horovod raised."""
        reds = list(reductions)
        with self._cond:
            self._cond.wait_for(lambda: all(r.done for r in reds))
        for r in reds:
            if r.error is not None:
                raise r.error


def complete(reductions) -> None:
    """Run reductions to completion one phase of all of them at a time, so that the second-phase
    collectives of every tensor are in flight together."""
    active = [r for r in reductions if not r.done]
    while active:
        for red in active:
            red.step()
        active = [r for r in active if not r.done]


class Done:
    """A finished reduction restored from a checkpoint (a pipelined gradient that was in flight)."""
    __slots__ = ("ctx", "result", "done", "error", "finite")

    def __init__(self, ctx: ReduceContext, result: torch.Tensor):
        self.ctx, self.result, self.done, self.error = ctx, result, True, None
        self.finite = all_finite(result)


class Member:
    """One gradient's share of a grouped reduction."""
    __slots__ = ("red", "index")

    def __init__(self, red: Reduction, index: int):
        self.red, self.index = red, index

    @property
    def result(self):
        return self.red.result[self.index]


def distinct(entries: dict) -> list:
    """The distinct reductions behind ``entries`` (param -> reduction; a grouped one serves several)."""
    seen, out = set(), []
    for e in entries.values():
        red = e.red if isinstance(e, Member) else e
        if id(red) not in seen:
            seen.add(id(red))
            out.append(red)
    return out


class Rounds:
    """An optimizer's reductions, round by round (a round ends at each ``synchronize()``).

    ``pending``: started during the current backward; ``inflight``: with pipelining, last round's,
    still on the wire, applied at the next round; ``ready``: written into the gradients by the last
    round, not yet applied. ``count`` (rounds so far) gives the pipeline slot, so two rounds in
    flight use distinct Horovod op names, whether or not the step of a round was applied."""

    def __init__(self, driver: "Driver | None"):
        self.driver = driver
        self.pending: dict = {}
        self.inflight: dict = {}
        self.ready: dict = {}
        self.ready_nonfinite: list[str] = []
        self.count = 0

    def slot(self, pipelining: bool) -> int | None:
        return self.count % 2 if pipelining else None

    def start(self, entries: dict) -> None:
        """Add this backward's reductions (param -> Reduction or Member) and hand them to the driver."""
        self.pending.update(entries)
        if self.driver is not None:
            for red in distinct(entries):
                self.driver.submit(red)

    def end(self, pipelining: bool) -> dict:
        """End the round; return what it applies. Pipelined (after the first round), last round's
        reductions, while this round's stay in flight."""
        if pipelining and self.count > 0:
            out, self.inflight, self.pending = self.inflight, self.pending, {}
        else:
            out, self.pending = self.pending, {}
        self.count += 1
        return out

    def take_inflight(self) -> dict:
        out, self.inflight = self.inflight, {}
        return out

    def wait(self, entries: dict, stats) -> None:
        reds = [r for r in distinct(entries) if not isinstance(r, Done)]
        with stats.timing("wait_s"):
            if self.driver is not None:
                self.driver.wait(reds)
            else:
                complete(reds)

    @staticmethod
    def nonfinite_names(entries: dict) -> list[str]:
        """Names of reduced gradients holding NaN/Inf: one host sync for the whole round."""
        reds = distinct(entries)
        if not reds:
            return []
        flags = [r.finite for r in reds]
        if bool(torch.stack([f.to(flags[0].device) for f in flags]).all()):
            return []
        return [r.ctx.name for r in reds if not bool(r.finite)]

    def carried(self, names: dict, stats) -> dict:
        """The pipelined gradients in flight, waited for: {name: reduced tensor} (for checkpoints)."""
        if not self.inflight:
            return {}
        self.wait(self.inflight, stats)
        return {names[p]: e.result.detach().clone() for p, e in self.inflight.items()}

    def clear(self) -> None:
        self.pending.clear()
        self.inflight.clear()
        self.ready.clear()
        self.ready_nonfinite = []

    def abandon(self, timeout: float) -> tuple[int, int]:
        """Drop every reduction (after a lost worker) so that none issues another collective; return
        (dropped, unfinished). Closes each unfinished codec generator, so it can never start another
        phase (after Horovod re-initialises, such an op would meet the new round's ops under the same
        name), and gives the driver up to ``timeout`` seconds to see its Horovod handle fail."""
        dropped = [r for r in distinct({**self.pending, **self.inflight}) if not isinstance(r, Done)]
        unfinished = [r for r in dropped if not r.done]
        for red in unfinished:
            deadline = time.monotonic() + 5.0
            while True:
                try:
                    red.gen.close()
                    break
                except ValueError:         # the driver thread is inside this generator right now
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.001)
        if self.driver is not None and unfinished:
            with self.driver._cond:
                finished = self.driver._cond.wait_for(lambda: all(r.done for r in unfinished), timeout)
            if not finished:
                warnings.warn(f"horovod_ext: {sum(not r.done for r in unfinished)} abandoned reduction(s) still wait "
                              f"on Horovod after {timeout:.0f} s; their generators are closed, so they issue no "
                              f"further collectives", stacklevel=3)
        self.clear()
        return len(dropped), len(unfinished)


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
