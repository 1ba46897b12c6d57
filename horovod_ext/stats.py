"""What a step cost in communication: bytes handed to Horovod, bits per gradient element, codec time."""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager


@dataclasses.dataclass
class CommStats:
    """Counters for one optimizer step (``last``) and for the whole run (``total``).

    ``bytes_handed`` counts the bytes of every tensor this worker passes to a Horovod collective
    (allreduce, allgather, alltoall): what one worker contributes, before Horovod's own fusion.
    ``bits_per_element`` divides that by the number of gradient elements reduced in the step.
    ``wait_s`` is the time the training thread spent blocked waiting for reductions (exposed
    communication, including waiting for slower workers); ``compress_s``/``decompress_s`` is codec
    work, wherever it ran (training thread or the background driver).
    """
    steps: int = 0
    bytes_handed: int = 0
    gradient_elements: int = 0
    compressed_elements: int = 0
    collectives: int = 0
    allreduce_calls: int = 0
    allgather_calls: int = 0
    alltoall_calls: int = 0
    bytes_allreduce: int = 0
    bytes_allgather: int = 0
    bytes_alltoall: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    compress_cpu_s: float = 0.0      # the same work as CPU time of the thread that did it
    decompress_cpu_s: float = 0.0
    wait_s: float = 0.0
    skipped_steps: int = 0

    @property
    def bits_per_element(self) -> float:
        return 8.0 * self.bytes_handed / self.gradient_elements if self.gradient_elements else 0.0

    def wire_bytes(self, workers: int) -> float:
        """Bytes one worker sends on the wire for these collectives, by the textbook cost of each:
        ring allreduce 2(n-1)/n of its input, allgather (n-1)/n of the gathered result, alltoall
        what it sends to the others."""
        n = max(workers, 1)
        return (2 * (n - 1) / n * self.bytes_allreduce + (n - 1) * self.bytes_allgather + self.bytes_alltoall)

    def add(self, other: "CommStats") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["bits_per_element"] = self.bits_per_element
        if self.steps:
            d["bytes_per_step"] = self.bytes_handed / self.steps
        return d

    @contextmanager
    def timing(self, field: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, field, getattr(self, field) + time.perf_counter() - t0)


class Ledger:
    """One optimizer's counters, kept in one place: the step in progress (``step``, which the
    communicator and the codecs add to), the last finished step, the whole run, and the steps after
    the warm-up (``measured``: what the adaptive cost rule looks at)."""

    def __init__(self):
        self.step, self.last, self.total, self.measured = CommStats(), CommStats(), CommStats(), CommStats()
        #: per measured step: codec CPU seconds per compressed element (the adaptive rule takes the lowest)
        self.step_costs: list[float] = []

    def end_step(self, count_step: bool, measured: bool) -> None:
        """Close the step in progress: ``count_step`` False for a flush (work, but not a step)."""
        self.step.steps = 1 if count_step else 0
        self.last = dataclasses.replace(self.step)
        self.total.add(self.step)
        if measured:
            self.measured.add(self.step)
            if self.step.compressed_elements and len(self.step_costs) < 1000:   # the first steps decide
                self.step_costs.append((self.step.compress_cpu_s + self.step.decompress_cpu_s)
                                       / self.step.compressed_elements)
        for f in dataclasses.fields(CommStats):      # in place: the communicator holds this object
            setattr(self.step, f.name, f.default)

    def skipped(self) -> None:
        """A step whose averaged gradient was not finite, skipped (or raised) on every worker."""
        self.total.skipped_steps += 1
        self.last.skipped_steps += 1
