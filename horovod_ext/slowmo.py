"""``hx.SlowMo``: local steps, an exact average every ``tau`` steps, and a slow momentum on top.

SlowMo (Wang et al., ICLR 2020) runs a base optimizer on every worker and communicates every
``tau`` steps only: the parameters are averaged exactly (one allreduce each), and a slow momentum
is applied to the displacement the period produced. With x0 the parameters at the period's start
(the same on every worker), x the average after ``tau`` base steps and gamma the base learning rate
of the parameter's group (at the time of the average):

    u  <- slow_momentum * u + (x0 - x) / gamma
    x0 <- x0 - slow_lr * gamma * u,        and every worker continues from x0.

``slow_lr=1, slow_momentum=0`` is plain periodic averaging (local SGD). The base step may be
local (``inner=None``, the paper's Local SGD base) or itself a data-parallel step through any
horovod_ext codec (``inner="global_qsgd8"``, a :class:`Compressor`, ...): the gradients are then
averaged every step and the period only adds the slow momentum (BMUF-like).

The base optimizer's buffers (SGD momentum, Adam moments) are per worker during a period; at the
average they are averaged too (``buffers="average"``, the default) or cleared (``"reset"``), so
after every average the whole state is the same on every worker. ``flush()`` ends the period
early (call it at epoch end, before evaluating or saving): then the model, the optimizer's state
and ``state_dict()`` are what every worker holds, and a checkpoint written by rank 0 resumes
exactly. The anchor x0 is taken at the first ``step()``, so ``hvd.broadcast_parameters`` may be
called after construction, as with ``hvd.DistributedOptimizer``.

Communication: one fp32 allreduce of the model (and of the base optimizer's floating-point
buffers, with ``buffers="average"``) per period, against one of the gradients per step for
allreduce SGD.
"""
from __future__ import annotations

import dataclasses

import torch
import horovod.torch as hvd

from .averaging import ModelAveraging
from .stats import CommStats

BUFFER_POLICIES = ("average", "reset")


def parse_spec(spec: str) -> dict:
    """``slowmo<tau>[-m<slow_momentum>][-a<slow_lr>][-reset][-<codec spec>]`` -> SlowMo's arguments, e.g.
    ``slowmo4`` (tau 4, the paper's slow momentum 0.5 and slow lr 1.0, local base steps),
    ``slowmo8-m0`` (periodic averaging), ``slowmo4-global_qsgd8`` (gradients averaged every step
    through Global-QSGD 8-bit). Used by hx-bench, the convergence benchmark and the recipe's config."""
    head, *rest = spec.split("-")
    if not head.startswith("slowmo") or not head[6:].isdigit():
        raise ValueError(f"SlowMo spec {spec!r}: expected slowmo<tau>[-m<momentum>][-a<slow lr>][-reset][-<codec>], "
                         f"e.g. slowmo4 or slowmo4-m0.5-a1.0")
    out = {"tau": int(head[6:]), "slow_momentum": 0.5, "slow_lr": 1.0, "buffers": "average", "inner": None}
    for i, part in enumerate(rest):
        try:
            if part[:1] == "m" and part[1:2].isdigit():
                out["slow_momentum"] = float(part[1:])
            elif part[:1] == "a" and part[1:2].isdigit():
                out["slow_lr"] = float(part[1:])
            elif part == "reset":
                out["buffers"] = "reset"
            else:                                       # the rest is the inner codec's own spec
                out["inner"] = "-".join(rest[i:])
                break
        except ValueError:
            raise ValueError(f"SlowMo spec {spec!r}: {part!r} is not m<number> or a<number>") from None
    return out


class SlowMo(ModelAveraging):
    """Wrap ``optimizer`` (a ``torch.optim.Optimizer`` over the model's parameters) with SlowMo.

    Args:
        optimizer: the base optimizer; it updates this worker's copy of the model between averages.
        named_parameters: the model's ``named_parameters()`` (names key the checkpoint state and
            the Horovod op names); without it, parameters are named by position.
        tau: steps per period (base steps between two averages); ``tau=1`` averages every step.
        slow_lr, slow_momentum: the slow learning rate (alpha) and momentum (beta); the paper's
            defaults are 1.0 and 0.5 (``slow_momentum=0``, ``slow_lr=1``: periodic model averaging).
        inner: ``None`` for local base steps, or a codec (``hx.Compression...`` or a spec string such
            as ``"global_qsgd8"``) to average gradients every step through ``hx.DistributedOptimizer``.
        buffers: what happens to the base optimizer's per-worker buffers at each average:
            ``"average"`` or ``"reset"``.
        process_set: the Horovod process set whose workers average together.
        **inner_kwargs: passed to ``hx.DistributedOptimizer`` when ``inner`` is a codec (e.g.
            ``pipeline=True``).
    """

    kind = "slowmo"

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters=None, tau: int = 48,
                 slow_lr: float = 1.0, slow_momentum: float = 0.5, inner=None, buffers: str = "average",
                 process_set=hvd.global_process_set, **inner_kwargs):
        if not isinstance(tau, int) or tau < 1:
            raise ValueError(f"SlowMo tau must be an integer >= 1 (steps between averages), got {tau!r}")
        if slow_lr <= 0:
            raise ValueError(f"SlowMo slow_lr must be > 0, got {slow_lr!r}")
        if not 0 <= slow_momentum < 1:
            raise ValueError(f"SlowMo slow_momentum must be in [0, 1), got {slow_momentum!r}")
        if buffers not in BUFFER_POLICIES:
            raise ValueError(f"SlowMo buffers must be one of {BUFFER_POLICIES}, got {buffers!r}")
        named = list(named_parameters) if named_parameters is not None else None
        if inner is not None:
            from .optimizer import DistributedOptimizer
            from .compression import Compression
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise TypeError(f"SlowMo wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
            codec = Compression.from_spec(inner) if isinstance(inner, str) else inner
            optimizer = DistributedOptimizer(optimizer, named, compression=codec, process_set=process_set,
                                             **inner_kwargs)
        elif inner_kwargs:
            raise TypeError(f"SlowMo got {sorted(inner_kwargs)} but no inner codec to pass them to")
        super().__init__(optimizer, named, process_set)
        self.tau, self.slow_lr, self.slow_momentum = tau, float(slow_lr), float(slow_momentum)
        self.buffers = buffers
        self.inner = None if inner is None else optimizer.comm_stats()["compression"]
        self._anchor: dict[torch.Tensor, torch.Tensor] = {}      # x0, replicated; taken at the first step
        self._momentum: dict[torch.Tensor, torch.Tensor] = {}    # u, replicated
        self.local_steps = 0                                       # base steps since the last average
        self.periods = 0                                           # averages done
        self._steps = 0

    def step(self, closure=None):
        """One base step; every ``tau``-th also averages and applies the slow momentum."""
        if not self._anchor:
            self._take_anchor()
        loss = self.optimizer.step(closure)
        self.local_steps += 1
        self._steps += 1
        if self.local_steps >= self.tau:
            self._average()
        return loss

    def synchronize(self):
        """The inner optimizer's (gradients averaged, e.g. before clipping); local steps: nothing."""
        if hasattr(self.optimizer, "synchronize"):
            self.optimizer.synchronize()

    def skip_synchronize(self):
        """The inner optimizer's context (use after ``synchronize()``); local steps: a no-op context."""
        if hasattr(self.optimizer, "skip_synchronize"):
            return self.optimizer.skip_synchronize()
        return super().skip_synchronize()

    def flush(self):
        """End the period now (a shorter one) if any base step was taken since the last average:
        afterwards every worker holds the same model and optimizer state. Call at epoch end."""
        if hasattr(self.optimizer, "flush"):
            self.optimizer.flush()
        if self.local_steps:
            self._average()

    def comm_stats(self) -> dict:
        """As ``hx.DistributedOptimizer.comm_stats()``: ``total`` counts the inner codec's traffic (if
        any) and the averages'; ``slowmo`` the settings and the periods done."""
        inner = self.optimizer.comm_stats() if hasattr(self.optimizer, "comm_stats") else None
        total = CommStats()
        if inner is not None:
            for f in dataclasses.fields(CommStats):
                setattr(total, f.name, inner["total"][f.name])
        else:
            total.steps = self._steps
            total.gradient_elements = self._steps * sum(p.numel() for p in self._names)
        total.add(self._stats)
        return {"compression": f"slowmo{self.tau}" + (f"-{self.inner}" if self.inner else ""),
                "workers": self.process_set.size(), "adaptive": inner["adaptive"] if inner else None,
                "total": total.as_dict(),
                "slowmo": {"tau": self.tau, "slow_lr": self.slow_lr, "slow_momentum": self.slow_momentum,
                           "buffers": self.buffers, "inner": self.inner, "periods": self.periods,
                           "local_steps": self.local_steps}}

    # ---------------------------------------------------------------- the period's end
    @torch.no_grad()
    def _take_anchor(self) -> None:
        self._anchor = {p: p.detach().clone() for p in self._names}

    @torch.no_grad()
    def _average(self) -> None:
        """The exact average of the parameters (and buffers), then the slow momentum step."""
        self.exact_average(buffers=self.buffers == "average")
        if self.buffers == "reset":
            self.optimizer.state.clear()
        for group in self.param_groups:
            gamma = float(group["lr"])
            if gamma <= 0:
                raise ValueError(f"SlowMo needs a positive base learning rate to scale the slow momentum, "
                                 f"got lr={gamma!r} in a parameter group")
            for p in group["params"]:
                x0 = self._anchor[p]
                u = self._momentum.get(p)
                if u is None:
                    u = self._momentum[p] = torch.zeros_like(p)
                u.mul_(self.slow_momentum).add_(x0 - p, alpha=1.0 / gamma)
                x0.add_(u, alpha=-self.slow_lr * gamma)
                p.copy_(x0)
        self.local_steps = 0
        self.periods += 1

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """The base optimizer's state plus SlowMo's (anchor, slow momentum, position in the period)
        under ``"slowmo"``. After ``flush()`` it is the same on every worker."""
        sd = self.optimizer.state_dict()
        sd["slowmo"] = {"tau": self.tau, "slow_lr": self.slow_lr, "slow_momentum": self.slow_momentum,
                        "buffers": self.buffers, "local_steps": self.local_steps, "periods": self.periods,
                        "anchor": {self._names[p]: t.detach().clone() for p, t in self._anchor.items()},
                        "momentum": {self._names[p]: t.detach().clone() for p, t in self._momentum.items()}}
        return sd

    def gather_state_dict(self, root_rank: int = 0):
        """Collective where the inner optimizer's is (every worker's codec state); the state dict on
        ``root_rank``, None elsewhere. Call after ``flush()``: SlowMo's own state is then replicated."""
        if hasattr(self.optimizer, "gather_state_dict"):
            sd = self.optimizer.gather_state_dict(root_rank)
            if sd is not None:
                sd["slowmo"] = self.state_dict()["slowmo"]
            return sd
        return self.state_dict() if self.process_set.rank() == root_rank else None

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        mine = state_dict.pop("slowmo", None)
        self.optimizer.load_state_dict(state_dict)
        if mine is None:
            raise ValueError("this optimizer state has no 'slowmo' entry: it was not written by hx.SlowMo")
        by_name = {n: p for p, n in self._names.items()}
        unknown = sorted(set(mine["anchor"]) - set(by_name))
        if unknown:
            raise ValueError(f"SlowMo state holds parameters this model does not have: {unknown[:5]}")
        self.local_steps, self.periods = int(mine["local_steps"]), int(mine["periods"])
        self._anchor = {by_name[n]: t.to(by_name[n].device).clone() for n, t in mine["anchor"].items()}
        self._momentum = {by_name[n]: t.to(by_name[n].device).clone() for n, t in mine["momentum"].items()}

    @classmethod
    def from_spec(cls, optimizer, named_parameters, spec: str, process_set=hvd.global_process_set, **inner_kwargs):
        """Build from a spec string (see :func:`parse_spec`)."""
        return cls(optimizer, named_parameters, process_set=process_set, **parse_spec(spec), **inner_kwargs)

    def __repr__(self) -> str:
        return (f"SlowMo(tau={self.tau}, slow_lr={self.slow_lr}, slow_momentum={self.slow_momentum}, "
                f"inner={self.inner or 'local'}, buffers={self.buffers!r}, base={type(self.optimizer).__name__})")
