"""Log-free mel features of the recipe: 40 mel bands, 25 ms Hann window (400 samples in a 512-point FFT), 10 ms
hop, power spectrum through a (possibly VTLP-warped) filterbank, then power-law compression.

Kim et al. (ASRU 2019) use power-law compression x**(1/15) instead of log: it is bounded at silence (0 -> 0, no
floor constant to tune) and close to log over the speech range. ``"log"`` (log(x + 1e-6)) is there for comparison.
The same function serves training (asr.augment) and evaluation features, so both see identical framing.
"""
from __future__ import annotations

import functools

import torch
import torchaudio.functional as AF

SAMPLE_RATE = 16000
N_FFT = 512
WIN_LENGTH = 400    # 25 ms
HOP_LENGTH = 160    # 10 ms
N_MELS = 40
POWER_EXPONENT = 1.0 / 15.0
LOG_FLOOR = 1e-6
COMPRESSIONS = ("power", "log")


@functools.lru_cache(maxsize=4)
def _window(win_length: int) -> torch.Tensor:
    return torch.hann_window(win_length)


def power_spectrogram(wave: torch.Tensor) -> torch.Tensor:
    """|STFT|^2 as [frames, n_fft // 2 + 1] (torchaudio.transforms.Spectrogram framing: centred, reflect-padded)."""
    spec = AF.spectrogram(wave, pad=0, window=_window(WIN_LENGTH), n_fft=N_FFT, hop_length=HOP_LENGTH,
                          win_length=WIN_LENGTH, power=2.0, normalized=False)
    return spec.transpose(-1, -2)


def compress(mel: torch.Tensor, compression: str = "power") -> torch.Tensor:
    """Apply the feature compression ("power": x**(1/15), "log": log(x + 1e-6))."""
    if compression == "power":
        return mel.clamp_min(0.0).pow(POWER_EXPONENT)
    if compression == "log":
        return torch.log(mel + LOG_FLOOR)
    raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")


def mel_features(wave: torch.Tensor, fb: torch.Tensor, compression: str = "power") -> torch.Tensor:
    """Features [frames, n_mels] float32 of a 16 kHz waveform [samples] with filterbank fb [n_fft//2+1, n_mels]."""
    if wave.dim() != 1:
        raise ValueError(f"wave must be 1-D [samples], got shape {tuple(wave.shape)}")
    if fb.shape[0] != N_FFT // 2 + 1:
        raise ValueError(f"fb must have {N_FFT // 2 + 1} rows (n_fft={N_FFT}), got shape {tuple(fb.shape)}")
    wave = wave.to(torch.float32)
    mel = torch.matmul(power_spectrogram(wave), fb)
    return compress(mel, compression)
