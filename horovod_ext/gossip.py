"""``hx.Gossip``: decentralized averaging, D-PSGD on a ring and SGP (PushSum) on an exponential graph.

Instead of every worker averaging with all (allreduce), each step every worker takes a local step
of the base optimizer and then mixes its parameters with one or two peers (adapt, then combine):

* ``topology="ring"`` (D-PSGD, Lian et al., NeurIPS 2017): x_i <- (x_i + x_{i-1} + x_{i+1}) / 3, a
  symmetric doubly stochastic matrix (two workers: (x_0 + x_1) / 2). Each worker sends its model to
  both neighbours.
* ``topology="exponential"`` (SGP, Assran et al., ICML 2019): at step k every worker sends half its
  mass to the peer 2^m ahead (m = k mod ceil(log2(n)), the one-peer time-varying exponential graph)
  and keeps half: x_i <- (x_i + x_{i-2^m}) / 2. Each worker sends its model to one peer.
  With ``push_sum=True`` the PushSum weight w travels with the parameters (numerator x = z * w,
  de-biased model z = x / w, which is what the model's parameters hold); on this graph every worker
  receives from exactly one peer, so w stays 1 and z = x exactly, as the paper notes for it.

Every ``average_every`` steps (0: never) and at ``flush()`` an exact average (allreduce) of the
parameters and the base optimizer's floating-point buffers brings the workers back together, so after
``flush()`` (call it at epoch end, before evaluating and checkpointing) every worker holds the same
model and state, and a checkpoint written by rank 0 resumes exactly.

Two workers mix by one allreduce Average (the pair's mean is what both graphs ask for). From three on,
every step is one ``alltoall`` with per-peer splits of the parameters flattened into one buffer
(and w): the pairing is a function of the step and the rank only, the same on every
worker, so no worker waits for a message that is not coming.
"""
from __future__ import annotations

import dataclasses
import time

import torch
import horovod.torch as hvd

from . import communicator
from .averaging import ModelAveraging

TOPOLOGIES = ("ring", "exponential")


def parse_spec(spec: str) -> dict:
    """``gossip-ring`` | ``gossip-exp`` with ``-a<k>`` (an exact average every k steps) -> Gossip's
    arguments (ring: D-PSGD; exp: SGP with PushSum weights). Used by hx-bench, the convergence
    benchmark and the recipe's config."""
    parts = spec.split("-")
    kinds = {"ring": ("ring", False), "exp": ("exponential", True)}
    if parts[0] != "gossip" or len(parts) < 2 or parts[1] not in kinds:
        raise ValueError(f"Gossip spec {spec!r}: expected gossip-ring or gossip-exp, optionally -a<k> "
                         f"(an exact average every k steps), e.g. gossip-exp-a10")
    out = {"topology": kinds[parts[1]][0], "push_sum": kinds[parts[1]][1], "average_every": 0}
    for part in parts[2:]:
        if part[:1] == "a" and part[1:].isdigit():
            out["average_every"] = int(part[1:])
        else:
            raise ValueError(f"Gossip spec {spec!r}: unknown option -{part}; valid: -a<k>")
    return out


def peers(topology: str, step: int, rank: int, size: int) -> tuple[list[int], list[int]]:
    """(send to, receive from) of ``rank`` at ``step``: the same rule on every worker."""
    if size == 1:
        return [], []
    if topology == "ring":
        if size == 2:
            return [1 - rank], [1 - rank]
        return [(rank - 1) % size, (rank + 1) % size], [(rank - 1) % size, (rank + 1) % size]
    shifts = [1 << m for m in range((size - 1).bit_length())]
    s = shifts[step % len(shifts)]
    return [(rank + s) % size], [(rank - s) % size]


class Gossip(ModelAveraging):
    """Wrap ``optimizer`` with decentralized averaging (see the module docstring).

    Args:
        optimizer: the base optimizer (local steps).
        named_parameters: the model's ``named_parameters()`` (names the Horovod ops and checks).
        topology: ``"ring"`` (D-PSGD) or ``"exponential"`` (SGP's one-peer exponential graph).
        push_sum: carry PushSum weights (exponential graph only; default: on for it, off for the ring).
        average_every: an exact allreduce average every this many steps (0: only at ``flush()``).
        process_set: the Horovod process set that gossips.
    """

    kind = "gossip"

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters=None, topology: str = "exponential",
                 push_sum: bool | None = None, average_every: int = 0, process_set=hvd.global_process_set):
        if topology not in TOPOLOGIES:
            raise ValueError(f"Gossip topology must be one of {TOPOLOGIES}, got {topology!r}")
        if push_sum is None:
            push_sum = topology == "exponential"
        if push_sum and topology != "exponential":
            raise ValueError("Gossip push_sum=True is SGP on the exponential graph; the ring (D-PSGD) mixes with "
                             "a symmetric matrix: pass push_sum=False")
        if not isinstance(average_every, int) or average_every < 0:
            raise ValueError(f"Gossip average_every must be an integer >= 0, got {average_every!r}")
        super().__init__(optimizer, named_parameters, process_set)
        self.topology, self.push_sum, self.average_every = topology, bool(push_sum), average_every
        self._params = list(self._names)
        self.steps = 0                 # gossip steps taken (the graph's clock)
        self.since_average = 0
        self.weight = 1.0              # PushSum weight w
        self._buf: torch.Tensor | None = None      # the flattened model, reused every step

    def step(self, closure=None):
        """A local step, then one gossip round; every ``average_every`` steps an exact average."""
        loss = self.optimizer.step(closure)
        self._mix()
        self.since_average += 1
        if self.average_every and self.since_average >= self.average_every:
            self._average()
        return loss

    def flush(self):
        """An exact average of the models (and buffers) if any step was taken since the last one."""
        if self.since_average:
            self._average()

    # ---------------------------------------------------------------- communication
    @torch.no_grad()
    def _mix(self) -> None:
        size, rank = self.process_set.size(), self.process_set.rank()
        send_to, recv_from = peers(self.topology, self.steps, rank, size)
        self.steps += 1
        if not send_to:
            return
        flat = self._flatten()
        t0 = time.perf_counter()
        if size == 2:
            # Two workers: both graphs mix (x_0 + x_1) / 2, which is one allreduce Average, a ring that
            # runs both directions at the link's rate (the alltoall of the model reached about half).
            communicator.allreduce(flat, "hx.gossip.pair", hvd.Average, self.process_set)
            self.count(t0, "allreduce", flat.numel() * flat.element_size())
            mixed = flat
        else:
            splits = torch.zeros(size, dtype=torch.int32, device="cpu")   # Horovod reads splits on the host
            for peer in send_to:
                splits[peer] = flat.numel()
            payload = flat if len(send_to) == 1 else torch.cat([flat] * len(send_to))   # slices in rank order
            handle = communicator.alltoall_async(payload, splits, "hx.gossip.mix", self.process_set)
            received, _ = communicator.wait(handle)
            self.count(t0, "alltoall", payload.numel() * payload.element_size())
            parts = dict(zip(sorted(recv_from), received.view(len(recv_from), flat.numel())))
            if self.topology == "ring":
                mixed = flat.clone()
                for peer in recv_from:                # own, then left, then right (the replay's order)
                    mixed += parts[peer]
                mixed *= 1.0 / (len(recv_from) + 1)
            else:
                mixed = (flat + parts[recv_from[0]]) * 0.5
        if self.push_sum:
            self.weight = float(mixed[-1])
            mixed = mixed[:-1]
            if self.weight != 1.0:                    # de-bias: z = x / w (on this graph w stays 1)
                mixed = mixed / self.weight
        self._write(mixed)

    def _flatten(self) -> torch.Tensor:
        """The parameters in one buffer (reused), times w and with w appended under PushSum."""
        numel = sum(p.numel() for p in self._params) + (1 if self.push_sum else 0)
        ref = self._params[0]
        if self._buf is None or self._buf.numel() != numel or self._buf.device != ref.device:
            self._buf = torch.empty(numel, dtype=ref.dtype, device=ref.device)
        flat, offset = self._buf, 0
        for p in self._params:
            flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
            offset += p.numel()
        if self.push_sum:                             # numerator x = z * w, and w itself, travel together
            flat[-1] = self.weight
            if self.weight != 1.0:
                flat[:-1] *= self.weight
        return flat

    def _write(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self._params:
            n = p.numel()
            p.data.copy_(flat[offset:offset + n].view_as(p))
            offset += n

    def _average(self) -> None:
        self.exact_average(buffers=True)
        self.weight = 1.0
        self.since_average = 0

    # ---------------------------------------------------------------- reporting and checkpoints
    def comm_stats(self) -> dict:
        total = dataclasses.replace(self._stats, steps=self.steps,
                                    gradient_elements=self.steps * sum(p.numel() for p in self._params))
        return {"compression": f"gossip-{self.topology}" + ("-pushsum" if self.push_sum else ""),
                "workers": self.process_set.size(), "adaptive": None, "total": total.as_dict(),
                "gossip": {"topology": self.topology, "push_sum": self.push_sum, "average_every": self.average_every,
                           "steps": self.steps, "since_average": self.since_average, "weight": self.weight}}

    def state_dict(self) -> dict:
        sd = self.optimizer.state_dict()
        sd["gossip"] = {"topology": self.topology, "push_sum": self.push_sum, "average_every": self.average_every,
                        "steps": self.steps, "since_average": self.since_average, "weight": self.weight}
        return sd

    def gather_state_dict(self, root_rank: int = 0):
        """The state dict on ``root_rank`` (call after ``flush()``: it is then the same everywhere)."""
        return self.state_dict() if self.process_set.rank() == root_rank else None

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        mine = state_dict.pop("gossip", None)
        if mine is None:
            raise ValueError("this optimizer state has no 'gossip' entry: it was not written by hx.Gossip")
        self.optimizer.load_state_dict(state_dict)
        self.steps, self.since_average = int(mine["steps"]), int(mine["since_average"])
        self.weight = float(mine["weight"])

    @classmethod
    def from_spec(cls, optimizer, named_parameters, spec: str, process_set=hvd.global_process_set):
        """Build from a spec string (see :func:`parse_spec`)."""
        return cls(optimizer, named_parameters, process_set=process_set, **parse_spec(spec))

    def __repr__(self) -> str:
        return (f"Gossip(topology={self.topology!r}, push_sum={self.push_sum}, average_every={self.average_every}, "
                f"base={type(self.optimizer).__name__})")
