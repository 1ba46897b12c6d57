"""On-the-fly augmentation for CPU DataLoader workers: VTLP (warped mel filterbank), an acoustic simulator (random
shoebox rooms from a deterministic RIR pool, 0-3 noise sources at an exact SNR), optional SpecAugment, and the
recipe's 40-dim power-law mel features. Reproducible per (seed, epoch, utterance) whatever the worker layout."""
from .dataset import AugmentedDataset
from .features import mel_features
from .pipeline import AugmentConfig, Augmenter, utterance_seed
from .vtlp import sample_warp, warped_mel_filterbank

__all__ = ["AugmentConfig", "Augmenter", "AugmentedDataset", "mel_features", "sample_warp", "utterance_seed",
           "warped_mel_filterbank"]
