"""On-the-fly augmentation for CPU DataLoader workers: VTLP (a warp factor per utterance for the front end's warped
mel filterbank), an acoustic simulator (random shoebox rooms from a deterministic RIR pool, 0-3 noise sources at an
exact SNR) and optional SpecAugment, around the front end's features (asr.frontend). Reproducible per (seed, epoch,
utterance) whatever the worker layout."""
import importlib

# Loaded on first use, so that ``asr.augment.config`` (settings only, read by every recipe config) does not pull
# in the audio stack (pyroomacoustics, scipy, torchaudio).
_WHERE = {"AugmentConfig": "config", "Augmenter": "pipeline", "utterance_seed": "pipeline",
          "AugmentedDataset": "dataset", "sample_warp": "vtlp"}
__all__ = list(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
