"""Acoustic simulator, noise half: noise sources and mixing at an exact SNR.

Sources (each returned at unit power, float32, drawn only from the caller's numpy Generator so an utterance's noise
is reproducible): colored noise (white, pink 1/f, brown 1/f^2 by spectral shaping of white Gaussian noise), babble
(a sum of other utterances from a list or a callable the pipeline is given), and tones (a few sinusoids with slow
amplitude modulation: hum, beeps, appliance whine). ``mix_at_snr`` scales the summed (reverberant) noise so that
10 log10(P_speech / P_noise) is exactly the requested SNR, with powers measured on the signals actually mixed.
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

import numpy as np
import torch
from scipy.fft import next_fast_len

from ..frontend import SAMPLE_RATE

COLORS = {"white": 0.0, "pink": 1.0, "brown": 2.0}   # spectral slope: power ~ 1 / f**beta
from .config import NOISE_KINDS

BabbleSource = Union[Sequence[torch.Tensor], Callable[[np.random.Generator], torch.Tensor]]


def _unit_power(x: torch.Tensor) -> torch.Tensor:
    p = x.pow(2).mean()
    return x / p.sqrt() if p > 0 else x


def colored_noise(n: int, color: str, rng: np.random.Generator) -> torch.Tensor:
    """Gaussian noise of length n with power spectrum ~ 1/f**beta (white 0, pink 1, brown 2), unit power."""
    if color not in COLORS:
        raise ValueError(f"noise color must be one of {tuple(COLORS)}, got {color!r}")
    beta = COLORS[color]
    if beta == 0.0:
        return _unit_power(torch.from_numpy(rng.standard_normal(n, dtype=np.float32)))
    m = next_fast_len(n, real=True)             # shape a slightly longer block: odd lengths make slow FFTs
    spec = torch.fft.rfft(torch.from_numpy(rng.standard_normal(m, dtype=np.float32)))
    f = torch.arange(spec.shape[-1], dtype=torch.float32)
    f[0] = 1.0                                  # keep DC finite; it is removed below
    spec = spec * f.pow(-beta / 2.0)
    spec[0] = 0
    return _unit_power(torch.fft.irfft(spec, n=m)[:n])


def tones(n: int, rng: np.random.Generator, sample_rate: int = SAMPLE_RATE, max_tones: int = 3) -> torch.Tensor:
    """1..max_tones sinusoids at log-uniform 50-4000 Hz with random phases, levels and slow AM, unit power."""
    t = torch.arange(n, dtype=torch.float64) / sample_rate
    out = torch.zeros(n, dtype=torch.float64)
    for _ in range(int(rng.integers(1, max_tones + 1))):
        freq = float(np.exp(rng.uniform(np.log(50.0), np.log(4000.0))))
        phase, level = float(rng.uniform(0, 2 * np.pi)), float(10 ** (rng.uniform(-10, 0) / 20))
        am_rate, am_depth = float(rng.uniform(0.1, 4.0)), float(rng.uniform(0.0, 0.9))
        envelope = 1.0 - am_depth * 0.5 * (1.0 + torch.sin(2 * np.pi * am_rate * t + float(rng.uniform(0, 6.3))))
        out += level * envelope * torch.sin(2 * np.pi * freq * t + phase)
    return _unit_power(out.to(torch.float32))


class TalkerPool:
    """Babble talkers from recorded utterances (waveforms or audio paths): each draw picks one with the
    given rng; a path is decoded on first use and kept (so a pool costs no decoding after warm-up); an
    unreadable file is passed over for the next one. A class, not a lambda, so it pickles into spawned
    DataLoader workers."""

    def __init__(self, sources, sample_rate: int):
        if not sources:
            raise ValueError("TalkerPool: no talkers given")
        self.sources, self.sample_rate = list(sources), sample_rate
        self._cache: dict[int, torch.Tensor | None] = {}

    def __call__(self, rng: np.random.Generator) -> torch.Tensor:
        from ..frontend import load_wave
        n = len(self.sources)
        i = int(rng.integers(n))
        for j in [i] + [k for k in range(n) if k != i]:
            src = self.sources[j]
            if isinstance(src, torch.Tensor):
                return src
            if j not in self._cache:
                try:
                    self._cache[j] = load_wave(src, self.sample_rate)
                except ValueError:          # unreadable (AudioError names the file): the next talker
                    self._cache[j] = None
            if self._cache[j] is not None:
                return self._cache[j]
        raise ValueError(f"no readable babble talker among {n} files")


def _draw_talker(source: BabbleSource, rng: np.random.Generator) -> torch.Tensor:
    if callable(source):
        wave = source(rng)
    else:
        if len(source) == 0:
            raise ValueError("babble source list is empty")
        wave = source[int(rng.integers(len(source)))]
    wave = torch.as_tensor(wave, dtype=torch.float32)
    if wave.dim() != 1 or wave.numel() == 0:
        raise ValueError(f"babble source returned a waveform of shape {tuple(wave.shape)}; expected [samples] > 0")
    return wave


def babble(n: int, rng: np.random.Generator, source: BabbleSource, talkers: tuple[int, int] = (3, 7)) -> torch.Tensor:
    """Sum of talkers[0]..talkers[1] utterances from ``source`` (each at unit power, random start, looped to n
    samples), unit power. ``source`` is a list of waveforms or a callable(rng) -> waveform that must draw only
    from the rng it is given (reproducibility)."""
    out = torch.zeros(n)
    for _ in range(int(rng.integers(talkers[0], talkers[1] + 1))):
        wave = _unit_power(_draw_talker(source, rng))
        reps = -(-(n + wave.numel()) // wave.numel())
        start = int(rng.integers(wave.numel()))
        out += wave.repeat(reps)[start:start + n]
    return _unit_power(out)


def make_noise(kind: str, n: int, rng: np.random.Generator, sample_rate: int = SAMPLE_RATE,
               babble_source: BabbleSource | None = None) -> torch.Tensor:
    """One dry noise source of ``kind`` (one of NOISE_KINDS), n samples, unit power."""
    if kind in COLORS:
        return colored_noise(n, kind, rng)
    if kind == "tone":
        return tones(n, rng, sample_rate)
    if kind == "babble":
        if babble_source is None:
            raise ValueError("noise kind 'babble' needs a babble source (a list of waveforms or a callable)")
        return babble(n, rng, babble_source)
    raise ValueError(f"noise kind must be one of {NOISE_KINDS}, got {kind!r}")


def snr_db(speech: torch.Tensor, noise: torch.Tensor) -> float:
    """10 log10(P_speech / P_noise) with P the mean square (computed in float64)."""
    ps, pn = speech.double().pow(2).mean(), noise.double().pow(2).mean()
    return float(10.0 * torch.log10(ps / pn))


def mix_at_snr(speech: torch.Tensor, noise: torch.Tensor, snr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale ``noise`` (same length as ``speech``) so that snr_db(speech, scaled) == snr; returns
    (speech + scaled noise, scaled noise). Silent noise is returned unscaled (the mixture is then clean)."""
    if noise.shape != speech.shape:
        raise ValueError(f"speech and noise must have the same shape, got {tuple(speech.shape)} and "
                         f"{tuple(noise.shape)}")
    ps, pn = speech.double().pow(2).mean(), noise.double().pow(2).mean()
    if pn == 0 or ps == 0:
        return speech + noise, noise
    gain = torch.sqrt(ps / (pn * 10.0 ** (snr / 10.0))).to(noise.dtype)
    scaled = noise * gain
    return speech + scaled, scaled
