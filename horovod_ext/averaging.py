"""What SlowMo and Gossip share: a wrapper around a base optimizer whose workers' models drift apart
between exact averages, and the exact average itself.

Both take local (or differently averaged) steps and, now and then, bring every worker to the same
model with one allreduce Average per parameter and per floating-point buffer of the base optimizer
(momentum, Adam's moments; not 0-dim counters such as Adam's step, the same on every worker). After
such an average the whole state is replicated, so ``flush()`` (which forces one) makes a rank-0
checkpoint complete. The wrapper forwards ``param_groups``, ``state`` and ``zero_grad`` to the base
optimizer, so learning-rate schedules and ``hvd.broadcast_optimizer_state(opt.optimizer, 0)`` work.
"""
from __future__ import annotations

import contextlib
import time

import torch
import horovod.torch as hvd

from . import communicator
from .stats import CommStats


class ModelAveraging:
    """Base of :class:`~horovod_ext.slowmo.SlowMo` and :class:`~horovod_ext.gossip.Gossip`."""

    kind = "averaging"           # names the subclass in messages and Horovod op names

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters, process_set):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{self.kind} wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.process_set = process_set
        params = [p for g in optimizer.param_groups for p in g["params"]]
        named = list(named_parameters) if named_parameters is not None else None
        by_id = {id(p): n for n, p in named} if named is not None else {}
        if named is not None and any(id(p) not in by_id for p in params):
            missing = sum(id(p) not in by_id for p in params)
            raise ValueError(f"{self.kind}: {missing} of the optimizer's parameters are not in named_parameters")
        #: parameter -> name, in the optimizer's order (the Horovod op names and checkpoint keys)
        self._names = {p: by_id.get(id(p), f"param.{i}") for i, p in enumerate(params)}
        self._stats = CommStats()    # what this wrapper handed to Horovod (not an inner optimizer's)

    # ---------------------------------------------------------------- the optimizer interface
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True):
        return self.optimizer.zero_grad(set_to_none=set_to_none)

    def synchronize(self):
        """Gradients stay local: nothing to wait for before clipping (a subclass with an inner
        data-parallel optimizer waits for its)."""

    def skip_synchronize(self):
        return contextlib.nullcontext()

    # ---------------------------------------------------------------- the exact average
    def float_buffers(self) -> list[tuple[str, torch.Tensor]]:
        """The base optimizer's floating-point tensors with more than one element, in a fixed order."""
        out = []
        for p, name in self._names.items():
            for key, value in sorted(self.optimizer.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                    out.append((f"{name}.{key}", value))
        return out

    @torch.no_grad()
    def exact_average(self, buffers: bool) -> None:
        """Every worker's parameters (and, with ``buffers``, the base optimizer's) replaced by their
        mean over the process set: one allreduce Average each, all in flight together."""
        tensors = [(name, p.data) for p, name in self._names.items()]
        if buffers:
            tensors += self.float_buffers()
        t0 = time.perf_counter()
        handles = [communicator.allreduce_async_(t, f"hx.{self.kind}.avg.{name}", hvd.Average,
                                                 process_set=self.process_set) for name, t in tensors]
        for h in handles:
            communicator.wait(h)
        self.count(t0, "allreduce", sum(t.numel() * t.element_size() for _, t in tensors), calls=len(tensors))

    def count(self, t0: float, kind: str, nbytes: int, calls: int = 1) -> None:
        """Book a collective that started at ``t0`` and has just finished (``kind``: allreduce or alltoall)."""
        st = self._stats
        st.wait_s += time.perf_counter() - t0
        st.bytes_handed += nbytes
        setattr(st, f"bytes_{kind}", getattr(st, f"bytes_{kind}") + nbytes)
        setattr(st, f"{kind}_calls", getattr(st, f"{kind}_calls") + calls)
        st.collectives += calls
