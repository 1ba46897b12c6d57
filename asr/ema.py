"""An exponential moving average (EMA) of the trained weights, the weights a run decodes with (``train.ema_decay``).

Why: the optimizer's weights jitter from step to step at the learning rates a time budget needs, and a small model's
decodes follow the jitter (the demo's per-epoch WER rose at some epochs). The average over the last few hundred
steps is a smoother, usually better model (Polyak averaging; fairseq's and NeMo's EMA), at one copy of the weights
and one lerp per step. It is torch's :class:`~torch.optim.swa_utils.AveragedModel` with an EMA update whose decay
warms up as TensorFlow's ``ExponentialMovingAverage(num_updates=...)`` does, ``min(decay, (1 + n) / (10 + n))``
after ``n`` updates, so the first epochs are not pinned to the first steps' weights.

The optimizer keeps stepping the raw weights; the EMA only reads them. Checkpoints hold both (``model`` is the EMA,
``train_model`` the raw weights that ``--resume`` continues from), and Horovod's elastic state syncs the EMA with
the model (it is an ``nn.Module``).
"""
from __future__ import annotations

import torch
from torch.optim.swa_utils import AveragedModel


def ema_weight(n: torch.Tensor, decay: float) -> torch.Tensor:
    """The new weights' share in update ``n + 1`` (``n`` updates averaged so far): 1 - min(decay, (1+n)/(10+n))."""
    n = n.to(torch.float32)
    return 1.0 - torch.clamp((1.0 + n) / (10.0 + n), max=decay)


def make_ema(model: torch.nn.Module, decay: float) -> AveragedModel:
    """An EMA of ``model``'s parameters on the model's device; call ``.update_parameters(model)`` after each step."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"EMA decay must be in (0, 1), got {decay}")

    def update(averaged: list, current: list, n: torch.Tensor) -> None:
        w = ema_weight(n, decay)
        for a, c in zip(averaged, current):
            a.lerp_(c, w.to(a.dtype))

    return AveragedModel(model, multi_avg_fn=update, use_buffers=False)


def ema_state(ema: AveragedModel) -> tuple[dict, int]:
    """(the averaged model's state dict, with the model's own keys; the number of updates averaged)."""
    return {k: v.detach().clone() for k, v in ema.module.state_dict().items()}, int(ema.n_averaged)


def load_ema_state(ema: AveragedModel, weights: dict, updates: int) -> None:
    """Restore what :func:`ema_state` returned (``--resume``)."""
    ema.module.load_state_dict(weights)
    ema.n_averaged.fill_(int(updates))
