"""Benchmark models: a BFA-sized BiLSTM encoder (about 22M parameters) and a small MLP.

horovod_ext never imports asr, so the BFA-sized model is a stand-in with the same shape of
gradient traffic as the recipe's encoder: stacked bidirectional LSTMs (most of the parameters, a
few large matrices) and a projection to a word-piece vocabulary.
"""
from __future__ import annotations

import torch
from torch import nn


class BFAEncoderLike(nn.Module):
    def __init__(self, feat_dim: int = 40, hidden: int = 512, layers: int = 4, vocab: int = 1000):
        super().__init__()
        self.lstm = nn.LSTM(feat_dim, hidden, num_layers=layers, bidirectional=True, batch_first=True)
        self.out = nn.Linear(2 * hidden, vocab)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.out(h)


class SmallMLP(nn.Module):
    def __init__(self, dim: int = 256, hidden: int = 1024, classes: int = 100):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def build(name: str, batch: int, frames: int, seed: int = 0):
    """Return (model, make_batch, loss_fn) for ``bfa`` or ``small``."""
    torch.manual_seed(seed)
    if name == "bfa":
        model = BFAEncoderLike()
        def make_batch(g):
            return torch.randn(batch, frames, 40, generator=g), torch.randint(0, 1000, (batch, frames), generator=g)
        def loss_fn(out, y):
            return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    elif name == "small":
        model = SmallMLP()
        def make_batch(g):
            return torch.randn(batch, 256, generator=g), torch.randint(0, 100, (batch,), generator=g)
        def loss_fn(out, y):
            return nn.functional.cross_entropy(out, y)
    else:
        raise ValueError(f"unknown model {name!r}; expected bfa or small")
    return model, make_batch, loss_fn


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
