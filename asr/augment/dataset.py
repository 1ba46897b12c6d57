"""A Dataset that returns augmented features, so a DataLoader's CPU workers do all augmentation.

The epoch is an :class:`asr.shared_epoch.SharedEpoch`, so ``set_epoch`` reaches persistent DataLoader workers.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.data import Dataset

from ..frontend import load_wave
from ..frontend.cache import FeatureCache, open_feature_cache
from ..shared_epoch import SharedEpoch
from .noise import TalkerPool
from .pipeline import Augmenter


class AugmentedDataset(Dataset):
    """items: sequence of (utt_id, waveform tensor or audio path[, label]); returns (features, info), with the
    label, if given, in info["label"]. ``babble_from_items=True`` gives the augmenter this dataset's utterances
    as its babble source. ``feature_cache`` (an asr.frontend.cache.FeatureCache or a folder): items given as
    paths take their clean spectrogram from it unless simulated (same features, no decoding)."""

    def __init__(self, items: Sequence[tuple], augmenter: Augmenter, epoch: int = 0,
                 babble_from_items: bool = False, feature_cache=None):
        for i, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise ValueError(f"AugmentedDataset item {i}: expected (utt_id, wave_or_path[, label]), got {item!r}")
        self.items = list(items)
        self.augmenter = augmenter
        if feature_cache is not None and not isinstance(feature_cache, FeatureCache):
            feature_cache = FeatureCache(feature_cache, augmenter.config.features)
        self.feature_cache = open_feature_cache(feature_cache, "AugmentConfig.features", augmenter.config.features,
                                                where="AugmentedDataset")
        self._epoch = SharedEpoch(epoch)
        if babble_from_items:
            augmenter.babble = self.babble_source()

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.set(epoch)

    def __len__(self) -> int:
        return len(self.items)

    def wave(self, index: int) -> torch.Tensor:
        src = self.items[index][1]
        return src if isinstance(src, torch.Tensor) else load_wave(src, self.augmenter.config.features.sample_rate)

    def babble_source(self):
        """A callable(rng) -> waveform drawing random utterances of this dataset (for Augmenter(babble=...))."""
        return TalkerPool([item[1] for item in self.items], self.augmenter.config.features.sample_rate)

    def __getitem__(self, index: int):
        utt_id, src = self.items[index][:2]
        if self.feature_cache is None or isinstance(src, torch.Tensor):
            features, info = self.augmenter(self.wave(index), utt_id, self.epoch)
        else:
            features, info = self.augmenter(lambda: self.wave(index), utt_id, self.epoch,
                                            power=lambda: self.feature_cache.power(src))
        if len(self.items[index]) == 3:
            info["label"] = self.items[index][2]
        return features, info
