"""Horovod collectives as used by the compressors, with byte accounting.

Every collective a compressor issues goes through here, so what is counted as "handed to
Horovod" is exactly what Horovod receives. All calls are asynchronous and return Horovod
handles; compressors yield them to the optimizer's scheduler, which waits for them.
"""
from __future__ import annotations

import io
import time

import torch
import horovod.torch as hvd

from .stats import CommStats


class Communicator:
    """Thin wrapper over ``horovod.torch`` collectives bound to a process set and a stats object."""

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
        return hvd.allreduce_async_(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, process_set=self.process_set)

    def grouped_allreduce_(self, tensors: list, name: str, op, prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0):
        for t in tensors:
            self._count(t, "allreduce")
        return hvd.grouped_allreduce_async_(list(tensors), name=name, op=op, prescale_factor=prescale_factor,
                                            postscale_factor=postscale_factor, process_set=self.process_set)

    def allgather(self, tensor: torch.Tensor, name: str):
        self._count(tensor, "allgather")
        return hvd.allgather_async(tensor, name=name, process_set=self.process_set)

    def alltoall(self, tensor: torch.Tensor, splits: torch.Tensor, name: str):
        # The slice a worker sends to itself never leaves the process; count only the others.
        own = int(splits[self.rank]) if splits.numel() else 0
        per_row = tensor[0].numel() * tensor.element_size() if tensor.dim() > 1 else tensor.element_size()
        nbytes = (tensor.shape[0] - own) * per_row
        self.stats.bytes_handed += nbytes
        self.stats.bytes_alltoall += nbytes
        self.stats.collectives += 1
        self.stats.alltoall_calls += 1
        return hvd.alltoall_async(tensor, splits=splits, name=name, process_set=self.process_set)

    @staticmethod
    def wait(handle):
        """Wait for a collective without spinning.

        ``hvd.synchronize`` busy-waits (poll, yield, re-take the GIL, poll ...): from a background
        thread that steals a core and the GIL from the training thread. Polling with a short,
        growing sleep (50 us to 2 ms) leaves both to the work that matters."""
        delay = 5e-5
        while not hvd.poll(handle):
            time.sleep(delay)
            delay = min(2 * delay, 2e-3)
        return hvd.synchronize(handle)


def allgather_object(obj, name: str, process_set=hvd.global_process_set) -> list:
    """``hvd.allgather_object`` on any process set (Horovod 0.28.1's takes only the global one).
    Blocking; for small objects (settings, codec state at checkpoint time)."""
    import cloudpickle
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = hvd.allgather(torch.tensor([data.numel()], dtype=torch.int64), name=f"{name}.sz",
                          process_set=process_set).tolist()
    gathered = hvd.allgather(data, name=f"{name}.t", process_set=process_set).numpy().tobytes()
    out, start = [], 0
    for n in sizes:
        out.append(cloudpickle.loads(gathered[start:start + n]))
        start += n
    return out
