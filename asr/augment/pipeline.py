"""The per-utterance augmentation pipeline run by CPU DataLoader workers: VTLP, acoustic simulation, features,
optional SpecAugment (Kim et al., ASRU 2019: the trainer receives features and labels only).

Reproducibility: every random choice for an utterance comes from one numpy Generator seeded by a stable hash
(blake2b) of (seed, epoch, utt_id), never from process-global RNGs or Python's salted hash(). The RIR pool is
indexed by (slot drawn from that generator, epoch) and its content is a pure function of (pool seed, slot,
version(epoch)) (see asr.augment.rooms), so an utterance's features are identical whatever the number of
DataLoader workers and whichever worker gets it. A new epoch gives new draws (and refreshed rooms).

Bitwise equality also needs a fixed thread count: torch's 1-D FFTs and large reductions give slightly different
floats with 1 and 2 intra-op threads. DataLoader workers run with 1 thread, so the pipeline computes with 1 thread
everywhere (temporarily in the main process, num_workers=0); one utterance is too small to gain from more.

Cached spectrograms (asr.frontend.cache): the random draws come first, so a caller can hand over the waveform
lazily (a callable) together with ``power``, a callable giving the clean power spectrogram from the feature cache.
An utterance that is not simulated is then one cached read, one matmul with its VTLP-warped filterbank and the
compression, with no audio decoded; a simulated one decodes the audio and runs as before. The features are the
same either way (bitwise with float32 cache files): the matmul acts on the same spectrogram.
"""
from __future__ import annotations

import hashlib
import time
from typing import Callable, NamedTuple, Union

import numpy as np
import torch
import torchaudio.functional as AF
from scipy.fft import next_fast_len

from ..frontend import compress_mel, mel_filterbank, power_spectrogram, stretch_frames
from ..frontend.cache import single_thread
from .config import AugmentConfig
from .noise import BabbleSource, make_noise, mix_at_snr
from .rooms import RIRPool, RoomEntry
from .specaugment import spec_augment
from .vtlp import sample_warp


class Augmented(NamedTuple):
    features: torch.Tensor   # [frames, n_mels] float32
    info: dict               # what was drawn (JSON-serializable)
    wave: torch.Tensor | None   # the waveform the features were computed from (reverberant-noisy or clean);
    #                             None when they came from a cached spectrogram and the audio was never decoded


Wave = Union[torch.Tensor, np.ndarray, Callable[[], torch.Tensor]]


def utterance_seed(seed: int, epoch: int, utt_id: str) -> int:
    """Stable 63-bit seed of (seed, epoch, utt_id): the same in every process and Python run."""
    digest = hashlib.blake2b(f"{seed}\x1f{epoch}\x1f{utt_id}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Augmenter:
    """Callable ``(wave [samples] at features.sample_rate, utt_id, epoch[, power=...]) -> (features [frames, n_mels]
    float32, info)``.

    ``wave`` may be a callable returning the waveform: it is called only if the utterance is simulated or no
    ``power`` is given. ``power``: optional callable returning the clean power spectrogram [frames, n_fft // 2 + 1]
    of that waveform (asr.frontend.cache.FeatureCache.power), used when the utterance is not simulated.

    ``babble``: optional list of waveforms or callable(rng) -> waveform for babble noise (must draw only from the
    rng it is given). The RIR pool is created lazily in the process that first needs it (one per DataLoader
    worker); ``profile=True`` adds per-stage seconds to info["timings_s"].
    """
    takes_cached_power = True   # asr.loader.SpeechDataset hands it a lazy wave and the cached spectrogram

    def __init__(self, config: AugmentConfig | None = None, seed: int = 0, babble: BabbleSource | None = None,
                 profile: bool = False):
        self.config = config if config is not None else AugmentConfig()
        self.seed = int(seed)
        self.babble = babble
        self.profile = profile
        self._pool: RIRPool | None = None

    def noise_kinds(self) -> list[str]:
        """The configured noise kinds this Augmenter can make ("babble" only with a babble source)."""
        kinds = [k for k in self.config.noise_kinds if k != "babble" or self.babble is not None]
        if not kinds:
            raise ValueError("AugmentConfig.noise_kinds is ('babble',) but the Augmenter has no babble source")
        return kinds

    @property
    def pool(self) -> RIRPool:
        if self._pool is None:
            c = self.config
            self._pool = RIRPool(size=c.pool_size, seed=self.seed if c.pool_seed is None else c.pool_seed,
                                 refresh_every=c.pool_refresh_every, refresh_fraction=c.pool_refresh_fraction,
                                 spec=c.room_spec(), cache_dir=c.rir_cache)
        return self._pool

    def filterbank(self, warp: float, speed: float = 1.0) -> torch.Tensor:
        return mel_filterbank(self.config.features, warp, self.config.vtlp_boundary_hz, speed)

    def strength(self, epoch: int) -> float:
        """How much augmentation an epoch gets, 0..1: none before ``start_epoch`` (a model still on the CTC
        plateau learns the clean signal first), then rising linearly over ``ramp_epochs`` epochs. It scales the
        simulation probability, the VTLP range around 1 and the chance of a speed factor other than 1."""
        c = self.config
        if epoch < c.start_epoch:
            return 0.0
        return min(1.0, (epoch - c.start_epoch + 1) / (c.ramp_epochs + 1))

    def __call__(self, wave: Wave, utt_id: str, epoch: int, *, power: Callable[[], torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, dict]:
        out = self.augment(wave, utt_id, epoch, power=power)
        return out.features, out.info

    def augment(self, wave: Wave, utt_id: str, epoch: int, *, simulate: bool | None = None,
                warp: float | None = None, power: Callable[[], torch.Tensor] | None = None) -> Augmented:
        """Full pipeline; ``simulate``/``warp`` override the random choices (demo, tests)."""
        with single_thread():
            return self._augment(wave, utt_id, epoch, simulate, warp, power)

    def _augment(self, wave, utt_id, epoch, simulate, warp, power) -> Augmented:
        c = self.config
        rng = np.random.default_rng(utterance_seed(self.seed, epoch, utt_id))
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(stage):
            nonlocal clock
            now = time.perf_counter()
            timings[stage] = timings.get(stage, 0.0) + now - clock
            clock = now

        s = self.strength(epoch)
        lo, hi = (1.0 + s * (x - 1.0) for x in c.vtlp_range)
        drawn_warp = sample_warp(rng, lo, hi) if c.vtlp else 1.0
        do_sim = bool(rng.random() < c.sim_prob * s)
        torch_seed = int(rng.integers(0, 2**63 - 1))
        speed = 1.0
        if c.speed_factors:   # drawn last, so the draws above are the same with or without it
            pick, factor = rng.random(), c.speed_factors[int(rng.integers(len(c.speed_factors)))]
            speed = factor if pick < s else 1.0
        if warp is None:
            warp = round(round(drawn_warp / c.vtlp_grid) * c.vtlp_grid, 6) if c.vtlp else 1.0
        if simulate is not None:
            do_sim = simulate
        info = {"utt_id": utt_id, "epoch": int(epoch), "warp": float(warp), "simulated": do_sim}
        if c.speed_factors:
            info["speed"] = speed
        if s < 1.0:
            info["strength"] = s
        fb = self.filterbank(float(warp), speed)
        lap("vtlp")
        if power is not None and not do_sim:
            spec, wave = self._cached_power(power(), utt_id), None
            lap("cached_read")
        else:
            wave = self._wave(wave() if callable(wave) else wave, utt_id)
            lap("read")
            if do_sim:
                wave = self._simulate(wave, rng, epoch, info, lap)
            spec = power_spectrogram(wave, c.features)
            lap("stft")
        features = compress_mel(stretch_frames(torch.matmul(spec, fb), speed), c.features.mel_compression)
        lap("features")
        info["specaugment"] = c.specaugment and s > 0
        if info["specaugment"]:
            features = spec_augment(features, torch.Generator().manual_seed(torch_seed), c.specaugment_options)
            lap("specaugment")
        if self.profile:
            info["timings_s"] = timings
        return Augmented(features, info, wave)

    @staticmethod
    def _wave(wave, utt_id: str) -> torch.Tensor:
        wave = torch.as_tensor(wave, dtype=torch.float32)
        if wave.dim() != 1 or wave.numel() == 0:
            raise ValueError(f"utterance {utt_id!r}: wave must be a non-empty 1-D tensor [samples], got shape "
                             f"{tuple(wave.shape)}")
        return wave

    def _cached_power(self, spec, utt_id: str) -> torch.Tensor:
        bins = self.config.features.n_fft // 2 + 1
        if not isinstance(spec, torch.Tensor) or spec.dim() != 2 or spec.shape[1] != bins or spec.shape[0] == 0:
            raise ValueError(f"utterance {utt_id!r}: power must be a [frames, {bins}] spectrogram (n_fft="
                             f"{self.config.features.n_fft}), got {getattr(spec, 'shape', type(spec).__name__)}")
        return spec.to(torch.float32)

    def _simulate(self, speech: torch.Tensor, rng: np.random.Generator, epoch: int, info: dict, lap) -> torch.Tensor:
        c = self.config
        slot = int(rng.integers(self.pool.size))
        entry: RoomEntry = self.pool.get(slot, epoch)
        lap("pool")
        lo, hi = c.noise_sources
        n_noise = int(rng.integers(lo, min(hi, len(entry.noise_rirs)) + 1))
        available = self.noise_kinds()
        kinds = [available[int(rng.integers(len(available)))] for _ in range(n_noise)]
        gains_db = [float(rng.uniform(*c.noise_gain_db)) for _ in range(n_noise)]
        snr = float(rng.uniform(*c.snr_db))
        rirs = [entry.speech_rir] + entry.noise_rirs[:n_noise]
        n, r_max = speech.numel(), max(h.numel() for h in rirs)
        # Noise is generated r_max - 1 samples longer and the steady-state part kept, so it does not fade in.
        noises = [make_noise(k, n + r_max - 1, rng, c.features.sample_rate, self.babble) for k in kinds]
        lap("noise")
        rev = self._convolve(speech, noises, rirs, r_max)
        lap("convolve")
        speech_rev = rev[0]
        p_clean, p_rev = speech.double().pow(2).mean(), speech_rev.double().pow(2).mean()
        if p_rev > 0:   # keep the clean utterance's level: the RIR's gain is not an augmentation
            speech_rev = speech_rev * torch.sqrt(p_clean / p_rev).float()
        out = speech_rev
        if n_noise:
            noise = sum(10 ** (g / 20) * rev[1 + k] for k, g in enumerate(gains_db))
            out, _ = mix_at_snr(speech_rev, noise, snr)
        lap("mix")
        info["room"] = {"slot": slot, "version": self.pool.version(slot, epoch), "dims": list(entry.dims),
                        "t60": entry.t60, "t60_measured": entry.t60_measured}
        info["noise"] = [{"kind": k, "gain_db": g} for k, g in zip(kinds, gains_db)]
        info["snr_db"] = snr if n_noise else None
        return out

    @staticmethod
    def _convolve(speech: torch.Tensor, noises: list[torch.Tensor], rirs: list[torch.Tensor], r_max: int
                  ) -> torch.Tensor:
        """One batched FFT convolution of [speech, noise...] with [speech RIR, noise RIRs...]; returns [1 + k, n]:
        speech aligned on its direct path (the RIRs start there), noise in steady state."""
        n = speech.numel()
        width = n + r_max - 1
        width = next_fast_len(width + r_max - 1, real=True) - r_max + 1   # fast FFT size for the full output
        x = torch.zeros(len(rirs), width)
        x[0, :n] = speech
        for k, z in enumerate(noises):
            x[1 + k, :z.numel()] = z
        h = torch.zeros(len(rirs), r_max)
        for k, rir in enumerate(rirs):
            h[k, :rir.numel()] = rir
        y = AF.fftconvolve(x, h)
        out = torch.empty(len(rirs), n)
        out[0] = y[0, :n]
        if noises:
            out[1:] = y[1:, r_max - 1:r_max - 1 + n]
        return out
