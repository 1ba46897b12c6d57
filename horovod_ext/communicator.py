"""Horovod collectives as horovod_ext issues them: counted, and pinned for Horovod's background thread.

Every collective the library (and the recipe's trainer) issues goes through here, so what is
counted as "handed to Horovod" is exactly what Horovod receives. ``Communicator`` methods are
asynchronous and return Horovod handles; compressors yield them to the optimizer's scheduler, which
waits for them with :func:`wait`. The module functions ``allreduce``/``allgather`` are blocking
versions for small tensors (settings, metrics, digests).

Pinning (why every tensor handed to Horovod gets a second C++ reference)
------------------------------------------------------------------------
In torch 2.14 a tensor's Python object is kept alive by C++ references, and whichever thread drops
the last C++ reference other than the Python object's own must take the GIL to release it (c10
``intrusive_ptr``: the 2 -> 1 transition calls ``decref_pyobject``). Horovod 0.28.1 holds each
queued op's tensors in C++. When its background loop stops (a lost worker's Gloo error, or a
shutdown) it destroys the ops still queued *while holding the process-set table's mutex*, so it
waits for the GIL there; a Python thread that enqueues another op meanwhile (a gradient hook, the
driver thread) holds the GIL and waits for that mutex: both wait for ever. That was the elastic
lost-worker hang (stacks in ``docs/evidence/2026-12-03-elastic-hang-stacks.txt``; reproduced with
plain ``hvd.allreduce_async_`` by ``tests/test_finalize_deadlock.py``). So before handing a tensor
to Horovod we take one more C++ reference to it (a DLPack capsule: ``to_dlpack`` shares the tensor
itself, views included, for about 0.2 us) and keep it until the op's handle has succeeded; then
Horovod's own release is never the one that needs the GIL. The reference of an op that failed is
kept until Horovod has been re-initialised (its old background thread is then gone), because a
failed op may still sit in the queue that thread is destroying.
"""
from __future__ import annotations

import io
import threading
import time

import torch
import horovod.torch as hvd
from horovod.torch import mpi_ops as _mpi_ops
from torch.utils.dlpack import to_dlpack

from .stats import CommStats


class _Pins:
    """Handle -> the C++ references held for that op's tensors, for the current Horovod instance.

    Horovod rebuilds ``mpi_ops._handle_map`` at every ``hvd.init()``, so its identity tells which
    instance an op belongs to: when it changes, the previous instance's background thread has been
    joined (``hvd.shutdown`` joins it before the next init) and the pins of its ops, failed or never
    waited for, are dropped. Handles can repeat within one instance: ``hvd.shutdown`` restarts them
    at 0 before it stops the background thread, so an op enqueued in between gets the handle of one
    still queued; the older op's pins are then kept aside until the next instance."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: dict[int, list] = {}
        self._superseded: list = []
        self._instance = None

    def hold(self, handle: int, capsules: list) -> None:
        instance = getattr(_mpi_ops, "_handle_map", None)
        with self._lock:
            if instance is not self._instance:
                self._held.clear()
                self._superseded.clear()
                self._instance = instance
            older = self._held.get(handle)
            if older is not None:
                self._superseded.append(older)
            self._held[handle] = capsules

    def release(self, handle: int) -> None:
        with self._lock:
            self._held.pop(handle, None)

    def __len__(self) -> int:
        """Ops pinned (for tests)."""
        return len(self._held) + len(self._superseded)


_pins = _Pins()


def _capsules(*tensors) -> list:
    return [to_dlpack(t) for t in tensors if t is not None]


def _issue(capsules: list, start) -> int:
    """Run ``start`` (which enqueues one Horovod op and returns its handle) with ``capsules`` pinned
    from before the enqueue to the handle's end."""
    handle = start()
    _pins.hold(handle, capsules)
    return handle


def wait(handle, spin: bool = False):
    """Wait for a collective without spinning; release its pins once it has succeeded.

    ``hvd.synchronize`` busy-waits (poll, yield, re-take the GIL, poll ...): from a background
    thread that steals a core and the GIL from the training thread. Polling with a short, growing
    sleep (50 us to 2 ms) leaves both to the work that matters. ``spin``: busy-wait anyway, for
    timing probes that need the collective's end to the microsecond."""
    delay = 5e-5
    while not spin and not hvd.poll(handle):
        time.sleep(delay)
        delay = min(2 * delay, 2e-3)
    out = hvd.synchronize(handle)      # raises if the op failed: its pins stay (see the module docstring)
    _pins.release(handle)
    return out


def allreduce_async_(tensor: torch.Tensor, name: str, op, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set=hvd.global_process_set) -> int:
    """``hvd.allreduce_async_``, pinned."""
    return _issue(_capsules(tensor), lambda: hvd.allreduce_async_(
        tensor, name=name, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        process_set=process_set))


def grouped_allreduce_async_(tensors: list, name: str, op, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set=hvd.global_process_set) -> int:
    """``hvd.grouped_allreduce_async_``, pinned."""
    tensors = list(tensors)
    return _issue(_capsules(*tensors), lambda: hvd.grouped_allreduce_async_(
        tensors, name=name, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        process_set=process_set))


def allgather_async(tensor: torch.Tensor, name: str, process_set=hvd.global_process_set) -> int:
    """``hvd.allgather_async``, pinned: the output Horovod fills is made (and pinned) here, so it is
    pinned before the op is queued (``mpi_ops._allgather_async`` takes it; Horovod 0.28.1, the last
    release)."""
    output = tensor.new()
    return _issue(_capsules(tensor, output), lambda: _mpi_ops._allgather_async(tensor, output, name, process_set))


def alltoall_async(tensor: torch.Tensor, splits: torch.Tensor, name: str, process_set=hvd.global_process_set) -> int:
    """``hvd.alltoall_async`` with explicit ``splits``, pinned (outputs made here, as for allgather)."""
    output, received_splits = tensor.new(), splits.new()
    return _issue(_capsules(tensor, splits, output, received_splits),
                  lambda: _mpi_ops._alltoall_async(tensor, splits, output, received_splits, name, process_set))


def allreduce(tensor: torch.Tensor, name: str, op, process_set=hvd.global_process_set,
              spin: bool = False) -> torch.Tensor:
    """Blocking allreduce of ``tensor`` in place (pinned); returns it. For small tensors (metrics,
    agreed settings) that may be reduced while the driver thread or a hook enqueues other ops."""
    return wait(allreduce_async_(tensor, name, op, process_set=process_set), spin=spin)


def allgather(tensor: torch.Tensor, name: str, process_set=hvd.global_process_set) -> torch.Tensor:
    """Blocking allgather (pinned)."""
    return wait(allgather_async(tensor, name, process_set))


class Communicator:
    """The pinned collectives bound to a process set and a stats object (bytes handed to Horovod)."""

    def __init__(self, process_set=hvd.global_process_set, stats: CommStats | None = None):
        self.process_set = process_set
        self.stats = stats if stats is not None else CommStats()

    @property
    def size(self) -> int:
        return self.process_set.size()

    @property
    def rank(self) -> int:
        return self.process_set.rank()

    def _count(self, tensor: torch.Tensor, kind: str) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        self.stats.bytes_handed += nbytes
        self.stats.collectives += 1
        setattr(self.stats, f"{kind}_calls", getattr(self.stats, f"{kind}_calls") + 1)
        setattr(self.stats, f"bytes_{kind}", getattr(self.stats, f"bytes_{kind}") + nbytes)

    def allreduce_(self, tensor: torch.Tensor, name: str, op, prescale_factor: float = 1.0,
                   postscale_factor: float = 1.0):
        self._count(tensor, "allreduce")
        return allreduce_async_(tensor, name, op, prescale_factor, postscale_factor, self.process_set)

    def grouped_allreduce_(self, tensors: list, name: str, op, prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0):
        for t in tensors:
            self._count(t, "allreduce")
        return grouped_allreduce_async_(tensors, name, op, prescale_factor, postscale_factor, self.process_set)

    def allgather(self, tensor: torch.Tensor, name: str):
        self._count(tensor, "allgather")
        return allgather_async(tensor, name, self.process_set)

    def alltoall(self, tensor: torch.Tensor, splits: torch.Tensor, name: str):
        # The slice a worker sends to itself never leaves the process; count only the others.
        own = int(splits[self.rank]) if splits.numel() else 0
        per_row = tensor[0].numel() * tensor.element_size() if tensor.dim() > 1 else tensor.element_size()
        nbytes = (tensor.shape[0] - own) * per_row
        self.stats.bytes_handed += nbytes
        self.stats.bytes_alltoall += nbytes
        self.stats.collectives += 1
        self.stats.alltoall_calls += 1
        return alltoall_async(tensor, splits, name, self.process_set)

    wait = staticmethod(wait)


def allgather_object(obj, name: str, process_set=hvd.global_process_set) -> list:
    """``hvd.allgather_object`` on any process set (Horovod 0.28.1's takes only the global one).
    Blocking; for small objects (settings, codec state at checkpoint time)."""
    import cloudpickle
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), f"{name}.sz", process_set).tolist()
    gathered = allgather(data, f"{name}.t", process_set).numpy().tobytes()
    out, start = [], 0
    for n in sizes:
        out.append(cloudpickle.loads(gathered[start:start + n]))
        start += n
    return out
