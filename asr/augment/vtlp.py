"""Vocal tract length perturbation (Jaitly & Hinton, 2013): the random warp factor of each utterance.

The warped mel filterbank itself is part of the feature definition (asr.frontend.mel.mel_filterbank, with
``warp``); the augmenter draws a factor here, rounds it to a grid and asks the front end for that filterbank.
"""
from __future__ import annotations

import numpy as np


def sample_warp(rng: np.random.Generator, low: float = 0.9, high: float = 1.1) -> float:
    """Warp factor alpha ~ U[low, high] drawn from the caller's generator (per-utterance reproducibility)."""
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high for the VTLP range, got low={low}, high={high}")
    return float(rng.uniform(low, high))
