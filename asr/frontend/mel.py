"""The feature definition: power spectrogram -> (possibly VTLP-warped) mel filterbank -> power-law or log.

One definition for everything: the statistics (asr-prep stats), clean evaluation features and the augmented
training features all go through :func:`mel_features` with a :class:`~asr.frontend.settings.FeatureSettings`
(centred, reflect-padded STFT as torchaudio.transforms.Spectrogram; HTK mel filterbank without filter
normalization, exactly ``torchaudio.functional.melscale_fbanks(..., norm=None, mel_scale="htk")``).

VTLP (Jaitly & Hinton, 2013) is a feature-domain augmentation: instead of resampling audio, the corner frequencies
of the mel filters are moved by a piecewise-linear warp, so one utterance looks like it was spoken by a speaker with
a slightly longer or shorter vocal tract. Only the corner frequencies are warped; ``warp == 1.0`` skips the warp,
so the filterbank is then bit-identical to torchaudio's (the random draw of the warp lives in asr.augment.vtlp).

The warp (Jaitly & Hinton eq. 1), with ``S/2`` the Nyquist frequency and ``F_hi`` = ``boundary_hz``::

    f' = f * alpha                                   if f <= F_hi * min(alpha, 1) / alpha
    f' = S/2 - (S/2 - F_hi * min(alpha, 1)) / (S/2 - F_hi * min(alpha, 1) / alpha) * (S/2 - f)   otherwise

so the top of the band always maps to Nyquist. It equals Kaldi's VTLN warp
(``torchaudio.compliance.kaldi.vtln_warp_freq``) with warp factor ``1 / alpha``, ``vtln_high = F_hi``,
``high_freq = S/2`` and ``low_freq = 0`` (Kaldi's lower segment then runs through the origin with the same slope);
tests/test_augment_vtlp.py asserts this numerically.

Kim et al. (ASRU 2019) use power-law compression (x ** (1/15)) of mel energies instead of a log; it is bounded
near zero, so silence needs no floor constant. ``"log"`` (log(x + 1e-6)) is there for comparison.
"""
from __future__ import annotations

import functools
import math

import torch
import torchaudio.functional as AF

from .settings import DEFAULT_FEATURES, LOG_FLOOR, MEL_COMPRESSIONS, POWER_EXPONENT, VTLP_BOUNDARY_HZ, FeatureSettings


def warp_frequencies(freqs: torch.Tensor, warp: float, sample_rate: int = DEFAULT_FEATURES.sample_rate,
                     boundary_hz: float = VTLP_BOUNDARY_HZ) -> torch.Tensor:
    """Jaitly & Hinton's piecewise-linear warp of frequencies in Hz (monotone, 0 -> 0, Nyquist -> Nyquist)."""
    nyquist = sample_rate / 2
    if not warp > 0:
        raise ValueError(f"warp must be > 0, got {warp}")
    if not 0 < boundary_hz < nyquist:
        raise ValueError(f"boundary_hz must lie in (0, {nyquist}) for sample_rate {sample_rate}, got {boundary_hz}")
    knee = boundary_hz * min(warp, 1.0) / warp          # input frequency where the upper segment starts
    slope_hi = (nyquist - boundary_hz * min(warp, 1.0)) / (nyquist - knee)
    return torch.where(freqs <= knee, freqs * warp, nyquist - slope_hi * (nyquist - freqs))


def mel_points_hz(settings: FeatureSettings = DEFAULT_FEATURES, warp: float = 1.0,
                  boundary_hz: float = VTLP_BOUNDARY_HZ) -> torch.Tensor:
    """The n_mels + 2 corner frequencies (Hz) of the filters: HTK mel points as torchaudio computes them, then
    warped. Filter i rises from point i to its centre, point i + 1, and falls to point i + 2."""
    m_min = 2595.0 * math.log10(1.0 + (settings.f_min / 700.0))   # torchaudio's _hz_to_mel (htk)
    m_max = 2595.0 * math.log10(1.0 + (settings.f_max / 700.0))
    m_pts = torch.linspace(m_min, m_max, settings.n_mels + 2)
    f_pts = 700.0 * (10.0 ** (m_pts / 2595.0) - 1.0)               # torchaudio's _mel_to_hz (htk)
    if warp != 1.0:
        f_pts = warp_frequencies(f_pts, warp, settings.sample_rate, boundary_hz)
    return f_pts


@functools.lru_cache(maxsize=1024)
def mel_filterbank(settings: FeatureSettings = DEFAULT_FEATURES, warp: float = 1.0,
                   boundary_hz: float = VTLP_BOUNDARY_HZ, speed: float = 1.0) -> torch.Tensor:
    """Mel filterbank [n_fft // 2 + 1, n_mels] (mel = power_spec @ fb), VTLP-warped by ``warp``; memoized (callers
    quantize the warp to a grid so the cache stays small; do not modify the result in place).

    ``speed``: the filterbank that reads, from the spectrum of an utterance, the mel energies of that utterance
    played ``speed`` times faster (every frequency times ``speed``): the corner frequencies divided by ``speed``.
    With :func:`stretch_frames` this is speed perturbation (Ko et al., 2015) on a spectrogram (see there).

    Same computation as torchaudio.functional.melscale_fbanks(htk, norm=None); ``warp == 1.0`` is torch.equal to it.
    """
    if not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    all_freqs = torch.linspace(0, settings.sample_rate // 2, settings.n_fft // 2 + 1)
    f_pts = mel_points_hz(settings, warp, boundary_hz)
    if speed != 1.0:
        f_pts = f_pts / speed
    # torchaudio's _create_triangular_filterbank (adopted from librosa): triangles over linear frequency
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    zero = torch.zeros(1)
    down_slopes = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up_slopes = slopes[:, 2:] / f_diff[1:]
    return torch.max(zero, torch.min(down_slopes, up_slopes))


@functools.lru_cache(maxsize=4)
def _window(win_length: int) -> torch.Tensor:
    return torch.hann_window(win_length)


def power_spectrogram(wave: torch.Tensor, settings: FeatureSettings = DEFAULT_FEATURES) -> torch.Tensor:
    """|STFT|^2 as [frames, n_fft // 2 + 1] (torchaudio.transforms.Spectrogram framing: centred, reflect-padded)."""
    spec = AF.spectrogram(wave, pad=0, window=_window(settings.win_length), n_fft=settings.n_fft,
                          hop_length=settings.hop_length, win_length=settings.win_length, power=2.0,
                          normalized=False)
    return spec.transpose(-1, -2)


def stretch_frames(mel: torch.Tensor, speed: float) -> torch.Tensor:
    """Frames [T, n] of an utterance played ``speed`` times faster: T / speed frames, linearly interpolated.

    Speed perturbation resamples the audio, which scales every frequency by the factor and the duration by its
    inverse. On a spectrogram the first is the filterbank of :func:`mel_filterbank` with ``speed`` and the second
    is this, applied to the mel energies before compression. It differs from the STFT of resampled audio only
    in the analysis window, which covers ``speed`` times more of the original signal (10% at 0.9 or 1.1)."""
    if speed == 1.0 or mel.shape[0] < 2:
        return mel
    n_out = max(1, int(round(mel.shape[0] / speed)))
    pos = torch.arange(n_out, dtype=torch.float64) * speed
    pos = pos.clamp(max=mel.shape[0] - 1)
    lo = pos.floor().long()
    hi = (lo + 1).clamp(max=mel.shape[0] - 1)
    frac = (pos - lo).to(mel.dtype).unsqueeze(1)
    return mel[lo] * (1 - frac) + mel[hi] * frac


def compress_mel(mel: torch.Tensor, mel_compression: str = DEFAULT_FEATURES.mel_compression) -> torch.Tensor:
    """"power": x ** (1/15); "log": log(x + 1e-6)."""
    if mel_compression == "power":
        return mel.clamp_min(0.0).pow(POWER_EXPONENT)
    if mel_compression == "log":
        return torch.log(mel + LOG_FLOOR)
    raise ValueError(f"mel_compression must be one of {MEL_COMPRESSIONS}, got {mel_compression!r}")


def mel_features(wave: torch.Tensor, fb: torch.Tensor, settings: FeatureSettings = DEFAULT_FEATURES) -> torch.Tensor:
    """Features [frames, n_mels] float32 of a waveform [samples] at settings.sample_rate through filterbank ``fb``
    [n_fft // 2 + 1, n_mels] (:func:`mel_filterbank`, possibly warped)."""
    if wave.dim() != 1:
        raise ValueError(f"wave must be 1-D [samples], got shape {tuple(wave.shape)}")
    bins = settings.n_fft // 2 + 1
    if fb.shape != (bins, settings.n_mels):
        raise ValueError(f"fb must have shape ({bins}, {settings.n_mels}) (n_fft={settings.n_fft}, "
                         f"n_mels={settings.n_mels}), got {tuple(fb.shape)}")
    mel = torch.matmul(power_spectrogram(wave.to(torch.float32), settings), fb)
    return compress_mel(mel, settings.mel_compression)


def compute_features(wave: torch.Tensor, settings: FeatureSettings = DEFAULT_FEATURES, *, warp: float = 1.0,
                     boundary_hz: float = VTLP_BOUNDARY_HZ, sample_rate: int | None = None) -> torch.Tensor:
    """[frames, n_mels] features of a mono waveform ([samples] or [1, samples], float in [-1, 1]).

    ``sample_rate``, if given, is checked against the settings'; ``warp`` is a VTLP factor (1.0: clean)."""
    if sample_rate is not None and sample_rate != settings.sample_rate:
        raise ValueError(f"features are defined at {settings.sample_rate} Hz, got {sample_rate} Hz "
                         f"(resample in asr-prep)")
    if wave.dim() == 2:
        if wave.shape[0] != 1:
            raise ValueError(f"expected mono audio, got shape {tuple(wave.shape)}")
        wave = wave[0]
    if wave.dim() != 1:
        raise ValueError(f"expected a 1-D waveform, got shape {tuple(wave.shape)}")
    return mel_features(wave.float(), mel_filterbank(settings, float(warp), float(boundary_hz)), settings)
