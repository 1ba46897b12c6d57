"""Weight prediction for pipelined steps (SpecTrain, Chen et al. 2018; PipeMare's discrepancy correction).

Pipelined (Pipe-SGD, width 2), the gradient of round r is applied one round later, to parameters that
have moved by one update since it was computed. With weight prediction, forward and backward run at
the parameters the optimizer expects when that gradient is applied: after each update U the
parameters are set to ``true + U`` (the next update is predicted to repeat the last one; under
momentum or Adam consecutive updates are close), and before the next update the exact true values
are put back. The true weights therefore follow Pipe-SGD with every gradient taken at a predicted
point instead of a stale one; nothing else changes (same collectives, same codec, same optimizer).

The parameters a caller sees between steps are the prediction. ``flush()`` leaves the true weights
(the trainer flushes before evaluating and checkpointing), and ``true_parameters()`` shows them for a
moment (an elastic commit mid-epoch). A parameter changed from outside between steps (a model loaded,
an elastic restore) is taken as the new truth: its version counter moved.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


class WeightPrediction:
    """The true weights behind predicted parameters, and the last update (the prediction's offset)."""

    def __init__(self, params):
        self.params = list(params)
        self.true: list[torch.Tensor] | None = None    # the true weights (buffers reused step to step)
        self.delta: list[torch.Tensor] | None = None   # the last update: parameters hold true + delta
        self.versions: list[int] | None = None         # the parameters' version counters after predicting

    @property
    def active(self) -> bool:
        """Whether the parameters now hold a prediction."""
        return self.versions is not None

    @torch.no_grad()
    def restore(self) -> None:
        """Put the true weights back into the parameters and keep a copy of them (the base the next
        update's offset is measured from). A parameter modified since the prediction keeps its value."""
        if self.true is None:
            self.true = [p.detach().clone() for p in self.params]
        elif not self.active:
            torch._foreach_copy_(self.true, [p.detach() for p in self.params])
        else:
            for p, t, v in zip(self.params, self.true, self.versions):
                if p._version == v:
                    p.copy_(t)
                else:                    # loaded from outside since: that value is the truth now
                    t.copy_(p)
        self.versions = None

    @torch.no_grad()
    def predict(self) -> None:
        """After an update from the weights :meth:`restore` kept: remember the update, set the
        parameters to true + update."""
        if self.delta is None:
            self.delta = [torch.empty_like(t) for t in self.true]
        for p, t, d in zip(self.params, self.true, self.delta):     # no allocation per step
            p = p.detach()
            torch.sub(p, t, out=d)
            t.copy_(p)
            p.add_(d)
        self.versions = [p._version for p in self.params]

    def drop(self) -> None:
        """Forget the prediction without touching the parameters (their values are the truth now:
        a checkpoint or an elastic commit was loaded into them)."""
        self.versions = None

    @contextmanager
    def true_parameters(self):
        """The true weights in the parameters for the duration (e.g. to save them), the prediction
        after it, to the bit."""
        if not self.active:
            yield
            return
        self.restore()
        kept = [p._version for p in self.params]
        try:
            yield
        finally:
            if [p._version for p in self.params] != kept:    # changed inside (a restore): that is the truth
                self.drop()
            else:
                with torch.no_grad():
                    params = [p.detach() for p in self.params]
                    torch._foreach_copy_(params, self.true)
                    torch._foreach_add_(params, self.delta)
                self.versions = [p._version for p in self.params]
