"""Dereverberation before the features at decoding time: single-channel WPE (nara_wpe).

Why: the far-field test set's errors follow the room, not the noise. On the demo model (lexicon decoder, settings
chosen on dev) far-field WER rose from 54% in rooms with T60 < 0.3 s to 82% at T60 >= 0.7 s, while it moved only
between 70 and 79% across the SNR bands (recipes/bfa/RESULTS.md, 2026-12-05 eighth session). Weighted prediction
error (Nakatani et al. 2010; Yoshioka & Nakatani 2012) removes late reverberation by a linear prediction of each
STFT bin from its past frames, skipping the first ``delay`` (the direct sound and early reflections, which help);
it leaves additive noise alone. We call the reference implementation (nara_wpe, Paderborn) rather than our own.

Settings (:data:`WPE_TAPS`, ...), from the demo model's far-field set (250 utterances, one decode each): 40 taps
(320 ms at a 128-sample shift, against T60 up to 0.9 s) with delay 2 took WER from 74.4 to 69.6%; 10 taps 73.0,
20 taps 70.9, 60 taps 70.8, one iteration instead of three 70.3%. Clean speech is left as it was (43.1 against
42.9%). Iterations, on the ninth session's demo model (lexicon decoder, same 250 utterances): none 70.4%, one
64.96, two 63.95, three 64.29%; so two, at two thirds of the cost of three.

Not kept: a gate that uses WPE's output only where it removed at least 0.5 dB of energy. WPE removes little from
dry speech (clean dev: median 0.16 dB, 95th percentile 0.42) and more from reverberant speech (far-field test: 5th
percentile 0.57 dB, median 1.50; ``scripts/wpe_gate_probe.py``), but on the tenth session's 60-minute model the
gate moved the combined decode by -0.34 points clean and +0.07 far-field at fixed weights, and by +0.02 / +0.75 with
the weights tuned on dev again (recipes/bfa/RESULTS.md, 2026-12-05 tenth session).

Cost: nara_wpe's ``wpe_v8`` (its loop over frequency bins, the same result as the batched ``wpe`` to 2e-8) took
0.167 s for a 3-second utterance on one AVX-512 core against 0.214 s, with three iterations. The evaluation feature
cache keeps the result (asr.frontend.cache: the settings below are part of its folder's digest). numpy's BLAS runs
one thread in :func:`dereverberate`: two processes on two cores with numpy's default of two threads each took 9x
longer.
"""
from __future__ import annotations

import numpy as np
import torch

METHODS = ("off", "wpe")
WPE_TAPS = 40
WPE_DELAY = 2
WPE_ITERATIONS = 2
WPE_FFT = 512
WPE_SHIFT = 128


def check(method: str, where: str = "dereverb") -> str:
    """``method`` if it is one of :data:`METHODS`, else a ValueError naming ``where``."""
    if method not in METHODS:
        raise ValueError(f"{where}: expected one of {', '.join(METHODS)}, got {method!r}")
    return method


def describe(method: str) -> dict | None:
    """What a dereverberated feature depends on (for cache digests and results); None for "off"."""
    if check(method) == "off":
        return None
    from importlib.metadata import PackageNotFoundError, version
    try:
        installed = version("nara_wpe")
    except PackageNotFoundError:
        raise ValueError("dereverb 'wpe' needs the nara_wpe package (setup.cfg's asr extra; make setup installs it)"
                         ) from None
    return {"method": "wpe", "function": "wpe_v8", "taps": WPE_TAPS, "delay": WPE_DELAY,
            "iterations": WPE_ITERATIONS, "fft": WPE_FFT, "shift": WPE_SHIFT, "nara_wpe": installed}


def wpe(wave: torch.Tensor) -> tuple[torch.Tensor, float]:
    """WPE's output for ``wave`` [samples] (float32, rescaled to the input's RMS, on its device, with its length) and
    the energy it removed in dB (10 log10 of input over output power: about how much late reverberation there was).
    Input shorter than one STFT frame comes back as it was, with 0 dB."""
    if wave.numel() < WPE_FFT:
        return wave, 0.0
    from nara_wpe.utils import istft, stft
    from nara_wpe.wpe import wpe_v8
    from threadpoolctl import threadpool_limits
    y = wave.detach().to("cpu", torch.float64).numpy()
    with threadpool_limits(limits=1):
        Y = stft(y[None], size=WPE_FFT, shift=WPE_SHIFT).transpose(2, 0, 1)        # (bins, channels = 1, frames)
        Z = wpe_v8(Y, taps=WPE_TAPS, delay=WPE_DELAY, iterations=WPE_ITERATIONS, statistics_mode="full")
        z = istft(Z.transpose(1, 2, 0), size=WPE_FFT, shift=WPE_SHIFT)[0][:y.size]
    z = np.pad(z, (0, y.size - z.size))
    power_in, power_out = float(np.mean(y ** 2)), float(np.mean(z ** 2))
    removed_db = 10.0 * np.log10(power_in / power_out) if power_out > 0 and power_in > 0 else 0.0
    if power_out > 0:
        z = z * np.sqrt(power_in / power_out)
    return torch.from_numpy(z).to(wave.device, wave.dtype), float(removed_db)


def dereverberate(wave: torch.Tensor, method: str = "wpe") -> torch.Tensor:
    """``wave`` [samples] float32 with late reverberation removed, at the input's level (RMS), on its device and
    with its length. ``method="off"`` returns it unchanged."""
    return wave if check(method) == "off" else wpe(wave)[0]
