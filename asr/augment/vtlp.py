"""Vocal tract length perturbation (Jaitly & Hinton, 2013) as a warped mel filterbank.

VTLP is a feature-domain augmentation: instead of resampling audio, the centre and edge frequencies of the mel
filters are moved by a piecewise-linear warp, so one utterance looks like it was spoken by a speaker with a
slightly longer or shorter vocal tract. The filterbank is built exactly like
``torchaudio.functional.melscale_fbanks(..., norm=None, mel_scale="htk")`` (triangles over the linear frequency
axis whose corner frequencies are the HTK mel points converted to Hz); only the corner frequencies are warped.
With ``warp == 1.0`` the warp step is skipped, so the result is bit-identical to torchaudio's.

The warp (Jaitly & Hinton eq. 1), with ``S/2`` the Nyquist frequency and ``F_hi`` = ``boundary_hz``::

    f' = f * alpha                                   if f <= F_hi * min(alpha, 1) / alpha
    f' = S/2 - (S/2 - F_hi * min(alpha, 1)) / (S/2 - F_hi * min(alpha, 1) / alpha) * (S/2 - f)   otherwise

so the top of the band always maps to Nyquist. It equals Kaldi's VTLN warp
(``torchaudio.compliance.kaldi.vtln_warp_freq``) with warp factor ``1 / alpha``, ``vtln_high = F_hi``,
``high_freq = S/2`` and ``low_freq = 0`` (Kaldi's lower segment then runs through the origin with the same slope);
tests/test_augment_vtlp.py asserts this numerically.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch


def warp_frequencies(freqs: torch.Tensor, warp: float, sample_rate: int = 16000,
                     boundary_hz: float = 4800.0) -> torch.Tensor:
    """Jaitly & Hinton's piecewise-linear warp of frequencies in Hz (monotone, 0 -> 0, Nyquist -> Nyquist)."""
    nyquist = sample_rate / 2
    if not warp > 0:
        raise ValueError(f"warp must be > 0, got {warp}")
    if not 0 < boundary_hz < nyquist:
        raise ValueError(f"boundary_hz must lie in (0, {nyquist}) for sample_rate {sample_rate}, got {boundary_hz}")
    knee = boundary_hz * min(warp, 1.0) / warp          # input frequency where the upper segment starts
    slope_hi = (nyquist - boundary_hz * min(warp, 1.0)) / (nyquist - knee)
    return torch.where(freqs <= knee, freqs * warp, nyquist - slope_hi * (nyquist - freqs))


def mel_points_hz(n_mels: int = 40, sample_rate: int = 16000, f_min: float = 20.0, f_max: float = 8000.0,
                  warp: float = 1.0, boundary_hz: float = 4800.0) -> torch.Tensor:
    """The n_mels + 2 corner frequencies (Hz) of the filters: HTK mel points as torchaudio computes them, then
    warped. Filter i rises from point i to its centre, point i + 1, and falls to point i + 2."""
    if not 0 <= f_min < f_max <= sample_rate / 2:
        raise ValueError(f"need 0 <= f_min < f_max <= sample_rate/2, got f_min={f_min}, f_max={f_max}, "
                         f"sample_rate={sample_rate}")
    m_min = 2595.0 * math.log10(1.0 + (f_min / 700.0))   # torchaudio's _hz_to_mel (htk)
    m_max = 2595.0 * math.log10(1.0 + (f_max / 700.0))
    m_pts = torch.linspace(m_min, m_max, n_mels + 2)
    f_pts = 700.0 * (10.0 ** (m_pts / 2595.0) - 1.0)     # torchaudio's _mel_to_hz (htk)
    if warp != 1.0:
        f_pts = warp_frequencies(f_pts, warp, sample_rate, boundary_hz)
    return f_pts


def warped_mel_filterbank(n_fft: int = 512, n_mels: int = 40, sample_rate: int = 16000, f_min: float = 20.0,
                          f_max: float = 8000.0, warp: float = 1.0, boundary_hz: float = 4800.0) -> torch.Tensor:
    """Mel filterbank [n_fft // 2 + 1, n_mels] (features = power_spec @ fb) with VTLP-warped corner frequencies.

    Same computation as torchaudio.functional.melscale_fbanks(htk, norm=None); ``warp == 1.0`` skips the warp, so
    the result is then torch.equal to torchaudio's.
    """
    all_freqs = torch.linspace(0, sample_rate // 2, n_fft // 2 + 1)
    f_pts = mel_points_hz(n_mels, sample_rate, f_min, f_max, warp, boundary_hz)
    # torchaudio's _create_triangular_filterbank (adopted from librosa): triangles over linear frequency
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    zero = torch.zeros(1)
    down_slopes = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up_slopes = slopes[:, 2:] / f_diff[1:]
    return torch.max(zero, torch.min(down_slopes, up_slopes))


@functools.lru_cache(maxsize=1024)
def cached_filterbank(warp: float, n_fft: int = 512, n_mels: int = 40, sample_rate: int = 16000,
                      f_min: float = 20.0, f_max: float = 8000.0, boundary_hz: float = 4800.0) -> torch.Tensor:
    """warped_mel_filterbank memoized per warp: callers quantize the warp to a grid so the cache stays small."""
    return warped_mel_filterbank(n_fft, n_mels, sample_rate, f_min, f_max, warp, boundary_hz)


def sample_warp(rng: np.random.Generator, low: float = 0.9, high: float = 1.1) -> float:
    """Warp factor alpha ~ U[low, high] drawn from the caller's generator (per-utterance reproducibility)."""
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high for the VTLP range, got low={low}, high={high}")
    return float(rng.uniform(low, high))
