"""On-the-fly augmentation for CPU DataLoader workers: VTLP (a warp factor per utterance for the front end's warped
mel filterbank), an acoustic simulator (random shoebox rooms from a deterministic RIR pool, 0-3 noise sources at an
exact SNR) and optional SpecAugment, around the front end's features (asr.frontend). Reproducible per (seed, epoch,
utterance) whatever the worker layout."""
from .dataset import AugmentedDataset
from .pipeline import AugmentConfig, Augmenter, utterance_seed
from .vtlp import sample_warp

__all__ = ["AugmentConfig", "Augmenter", "AugmentedDataset", "sample_warp", "utterance_seed"]
