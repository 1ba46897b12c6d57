"""Adaptive transport: send a tensor uncompressed when compressing it would not pay.

Two rules, both decided from quantities that are identical on every worker (so every worker picks
the same collectives for a tensor):

* size: tensors with fewer than ``min_numel`` elements (biases, norms) go as plain fp32
  allreduce: the codec's fixed costs and extra collectives outweigh their few bytes;
* cost (only when the link rate is known, ``link_gbps``): after ``measure_steps`` steps, the
  codec's cost per element is compared with the wire seconds per element it saves at that rate;
  compression stays on only if it saves at least ``1 + margin`` times what it costs, else gradients
  go as fp32 (error-feedback residuals are folded into the next gradient, so nothing is lost).

The decision must come out the same in repeated runs on the same machine, so the cost is measured
the way a busy machine disturbs least: the codec's CPU time on its own thread (a preempted thread,
or one waiting for the GIL, accrues none), per step, the lowest over the measured steps (cache and
memory-bandwidth interference only ever add to it), and the slowest worker's (one Max allreduce, so every worker decides alike). The margin keeps a codec whose
cost is near the break-even point off, where a small shift would otherwise flip the decision.
"""
from __future__ import annotations

import dataclasses


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

    def uses_codec(self, numel: int) -> bool:
        if not self.enabled:
            return True
        return numel >= self.min_numel and self.compress

    def decide(self, codec_s_per_element: float, bits_per_element: float, workers: int) -> None:
        """Cost rule: compress iff (1 + margin) * codec time per element <= wire time saved per element."""
        self.decided = True
        self.codec_s_per_element = codec_s_per_element
        if not self.enabled or not self.link_gbps or workers < 2:
            return
        wire_factor = 2 * (workers - 1) / workers              # ring allreduce, per worker
        saved_bits = max(32.0 - bits_per_element, 0.0) * wire_factor
        self.saved_s_per_element = saved_bits / (self.link_gbps * 1e9)
        self.compress = (1.0 + self.margin) * codec_s_per_element <= self.saved_s_per_element

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
