"""Acoustic features of the recipe: 40 mel bands, 25 ms windows every 10 ms, power-law compressed.

One definition for everything: statistics (asr-prep stats), clean evaluation features and the
augmented training features all go through :func:`asr.augment.features.mel_features` (400-sample Hann
window in a 512-point FFT, 160-sample hop, centred, HTK mel filterbank 20 Hz to Nyquist, no filter
normalization). ``warp`` is the VTLP factor (piecewise-linear warp of the filterbank, boundary
4800 Hz); 1.0 gives exactly torchaudio's filterbank.

Kim et al. (ASRU 2019) use power-law compression (x ** (1/15)) of mel energies instead of a log; it is
bounded near zero, so silence needs no floor constant.
"""
from __future__ import annotations

import torch

from .augment.features import HOP_LENGTH, N_MELS, SAMPLE_RATE, WIN_LENGTH, mel_features
from .augment.vtlp import cached_filterbank

WIN_S, HOP_S = WIN_LENGTH / SAMPLE_RATE, HOP_LENGTH / SAMPLE_RATE
__all__ = ["compute_features", "N_MELS", "WIN_S", "HOP_S"]


def compute_features(wave: torch.Tensor, sample_rate: int = SAMPLE_RATE, compression: str = "power",
                     warp: float = 1.0) -> torch.Tensor:
    """[frames, 40] features of a mono 16 kHz waveform ([samples] or [1, samples], float in [-1, 1]).

    compression: "power" (x ** (1/15), the default) or "log" (log(x + 1e-6))."""
    if sample_rate != SAMPLE_RATE:
        raise ValueError(f"features are defined at {SAMPLE_RATE} Hz, got {sample_rate} Hz (resample in asr-prep)")
    if wave.dim() == 2:
        if wave.shape[0] != 1:
            raise ValueError(f"expected mono audio, got shape {tuple(wave.shape)}")
        wave = wave[0]
    if wave.dim() != 1:
        raise ValueError(f"expected a 1-D waveform, got shape {tuple(wave.shape)}")
    return mel_features(wave.float(), cached_filterbank(float(warp)), compression)
