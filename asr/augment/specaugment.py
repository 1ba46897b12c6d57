"""SpecAugment (Park et al., 2019) frequency and time masks on [frames, n_mels] features; off by default.

torchaudio's FrequencyMasking/TimeMasking draw from torch's global RNG, which differs per DataLoader worker.
To keep an utterance's masks a function of its own generator, the transforms run inside
``torch.random.fork_rng`` with the global CPU generator seeded from the per-utterance generator; the caller's
global RNG state is restored afterwards.
"""
from __future__ import annotations


import torch
import torchaudio.transforms as T

from .config import SpecAugmentConfig


def spec_augment(features: torch.Tensor, generator: torch.Generator, cfg: SpecAugmentConfig = SpecAugmentConfig()
                 ) -> torch.Tensor:
    """Masked copy of features [frames, n_mels]; deterministic given the generator's state."""
    if features.dim() != 2:
        raise ValueError(f"features must be [frames, n_mels], got shape {tuple(features.shape)}")
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    x = features.t().unsqueeze(0)            # torchaudio masks take (..., freq, time)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        fmask = T.FrequencyMasking(cfg.freq_width)
        tmask = T.TimeMasking(cfg.time_width, p=cfg.time_max_fraction)
        for _ in range(cfg.freq_masks):
            x = fmask(x, cfg.mask_value)
        for _ in range(cfg.time_masks):
            x = tmask(x, cfg.mask_value)
    return x.squeeze(0).t().contiguous()
