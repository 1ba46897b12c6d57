"""Adaptive transport: send a tensor uncompressed when compressing it would not pay.

Two rules, both decided from quantities that are identical on every worker (so every worker picks
the same collectives for a tensor):

* size: tensors with fewer than ``min_numel`` elements (biases, norms) go as plain fp32
  allreduce: the codec's fixed costs and extra collectives outweigh their few bytes;
* cost (only when the link rate is known, ``link_gbps``): after ``measure_steps`` steps, the
  codec's cost per element is compared with the wire seconds per element it saves at that rate;
  compression stays on only if it saves at least ``1 + margin`` times what it costs, else gradients
  go as fp32 (error-feedback residuals are folded into the next gradient, so nothing is lost).
  Where the backend itself sums the codec's payload more slowly than fp32 (float16 on CPU
  backends: Gloo and MPI sum it one element at a time, about 20 ns per element on the
  development host, against 0.2 ns for the cast), that cost is measured once by timing an
  allreduce of each dtype (:func:`backend_sum_cost`), after waiting for the gradients in flight
  (pipelining) so that their traffic does not skew it, and counted with the codec's.

The decision must come out the same in repeated runs on the same machine, so the cost is measured
the way a busy machine disturbs least: the codec's CPU time on its own thread (a preempted thread,
or one waiting for the GIL, accrues none), per step, the lowest over the measured steps (cache and
memory-bandwidth interference only ever add to it), and the slowest worker's (one Max allreduce, so every worker decides alike). The margin keeps a codec whose
cost is near the break-even point off, where a small shift would otherwise flip the decision.
"""
from __future__ import annotations

import dataclasses
import time

import torch
import horovod.torch as hvd

from . import communicator


@dataclasses.dataclass
class Adaptive:
    min_numel: int = 8192
    link_gbps: float | None = None
    measure_steps: int = 5
    enabled: bool = True
    margin: float = 0.5

    # filled in by the optimizer once the cost rule has been evaluated
    decided: bool = False
    compress: bool = True
    codec_s_per_element: float | None = None
    saved_s_per_element: float | None = None
    backend_s_per_element: float | None = None    # the backend's extra summing cost (see backend_sum_cost)

    def uses_codec(self, numel: int) -> bool:
        if not self.enabled:
            return True
        return numel >= self.min_numel and self.compress

    def decide(self, codec_s_per_element: float, bits_per_element: float, workers: int,
               backend_s_per_element: float = 0.0) -> None:
        """Cost rule: compress iff (1 + margin) * (codec + backend time per element) <= wire time
        saved per element."""
        self.decided = True
        self.codec_s_per_element = codec_s_per_element
        self.backend_s_per_element = backend_s_per_element
        if not self.enabled or not self.link_gbps or workers < 2:
            return
        wire_factor = 2 * (workers - 1) / workers              # ring allreduce, per worker
        saved_bits = max(32.0 - bits_per_element, 0.0) * wire_factor
        self.saved_s_per_element = saved_bits / (self.link_gbps * 1e9)
        cost = codec_s_per_element + backend_s_per_element
        self.compress = (1.0 + self.margin) * cost <= self.saved_s_per_element

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def backend_sum_cost(dtype: torch.dtype, device, process_set=hvd.global_process_set,
                     numel: int = 1 << 20, repeats: int = 5) -> float:
    """What an allreduce in ``dtype`` costs per element beyond its share of an fp32 one, in seconds.

    Times ``repeats`` allreduces of ``numel`` elements in ``dtype`` and in float32, interleaved (after
    one of each untimed), and returns ``max(0, t_dtype - t_fp32 * bits / 32) / numel``, the lowest
    time of each (interference only adds) and the slowest worker's (one Max allreduce, so every
    worker agrees). On a link-bound backend that sums in hardware (NCCL) it is about 0; where the
    backend sums ``dtype`` in software (Gloo and MPI on CPU tensors, float16) it is that summing
    time. A collective: every worker of ``process_set`` must call it at the same point, with no
    other collective in flight (the caller waits for its own first)."""
    # zeros: the allreduces run in place, and sums of zeros stay finite at any worker count
    low, fp32 = torch.zeros(numel, dtype=dtype, device=device), torch.zeros(numel, dtype=torch.float32, device=device)
    best = {dtype: float("inf"), torch.float32: float("inf")}
    for i in range(repeats + 1):
        for t in (low, fp32):
            t0 = time.perf_counter()
            communicator.allreduce(t, f"hx.adaptive.probe.{str(t.dtype)[6:]}.{i}", hvd.Sum, process_set,
                                   spin=True)
            if i:                                             # the first round sets up buffers
                best[t.dtype] = min(best[t.dtype], time.perf_counter() - t0)
    bits = torch.finfo(dtype).bits
    local = max(0.0, best[dtype] - best[torch.float32] * bits / 32) / numel
    return float(communicator.allreduce(torch.tensor([local], dtype=torch.float64, device="cpu"),
                                        "hx.adaptive.probe.cost", hvd.Max, process_set)[0])
