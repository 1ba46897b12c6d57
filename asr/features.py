"""Acoustic features for the BFA recipe: 40 mel bands, 25 ms windows every 10 ms, power-law compressed.

Framing: 400-sample Hann window in a 512-point FFT, 160-sample hop, centred (reflect padding), power spectrum
through an HTK mel filterbank from 20 Hz to Nyquist (no filter normalization). Normalization statistics
(asr-prep stats) are computed with this function, so training features must use the same framing.

Kim et al. (ASRU 2019) use power-law compression (x ** (1/15)) of mel energies instead of a log; it is bounded
near zero, so silence needs no floor constant. ``warp`` is the VTLP warp factor; it is accepted now so that callers
and configs do not change when VTLP lands, and 1.0 (no warp) is the only value implemented.
"""
from __future__ import annotations

import torch
import torchaudio

N_MELS = 40
N_FFT = 512
F_MIN = 20.0
WIN_S, HOP_S = 0.025, 0.010
POWER_EXPONENT = 1.0 / 15.0
LOG_FLOOR = 1e-6
_MEL: dict[int, torchaudio.transforms.MelSpectrogram] = {}


def _mel(sample_rate: int) -> torchaudio.transforms.MelSpectrogram:
    if sample_rate not in _MEL:
        win, hop = round(WIN_S * sample_rate), round(HOP_S * sample_rate)
        _MEL[sample_rate] = torchaudio.transforms.MelSpectrogram(
            sample_rate=sample_rate, n_fft=max(N_FFT, win), win_length=win, hop_length=hop, n_mels=N_MELS,
            f_min=F_MIN, power=2.0, center=True, pad_mode="reflect", norm=None, mel_scale="htk")
    return _MEL[sample_rate]


def compute_features(wave: torch.Tensor, sample_rate: int = 16000, compression: str = "power",
                     warp: float = 1.0) -> torch.Tensor:
    """[frames, 40] features of a mono waveform ([samples] or [1, samples], float in [-1, 1]).

    compression: "power" (x ** (1/15), the default) or "log" (log(x + 1e-6)).
    """
    if warp != 1.0:
        raise NotImplementedError("VTLP warp is not implemented yet; pass warp=1.0")
    if wave.dim() == 2:
        if wave.shape[0] != 1:
            raise ValueError(f"expected mono audio, got shape {tuple(wave.shape)}")
        wave = wave[0]
    if wave.dim() != 1:
        raise ValueError(f"expected a 1-D waveform, got shape {tuple(wave.shape)}")
    mel = _mel(sample_rate)(wave.float())  # [n_mels, frames]
    if compression == "power":
        feats = mel.clamp_min(0).pow(POWER_EXPONENT)
    elif compression == "log":
        feats = torch.log(mel + LOG_FLOOR)
    else:
        raise ValueError(f"compression must be 'power' or 'log', got {compression!r}")
    return feats.transpose(0, 1).contiguous()
