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
"""
from __future__ import annotations

import contextlib
import hashlib
import time
from typing import NamedTuple

import numpy as np
import torch
import torchaudio.functional as AF
from scipy.fft import next_fast_len

from ..frontend import mel_features, mel_filterbank
from .config import AugmentConfig
from .noise import BabbleSource, make_noise, mix_at_snr
from .rooms import RIRPool, RoomEntry
from .specaugment import spec_augment
from .vtlp import sample_warp


class Augmented(NamedTuple):
    features: torch.Tensor   # [frames, n_mels] float32
    info: dict               # what was drawn (JSON-serializable)
    wave: torch.Tensor       # the waveform the features were computed from (reverberant-noisy or clean)


def utterance_seed(seed: int, epoch: int, utt_id: str) -> int:
    """Stable 63-bit seed of (seed, epoch, utt_id): the same in every process and Python run."""
    digest = hashlib.blake2b(f"{seed}\x1f{epoch}\x1f{utt_id}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@contextlib.contextmanager
def single_thread():
    """torch intra-op threads = 1 for the block (a no-op inside DataLoader workers, which already use 1)."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class Augmenter:
    """Callable ``(wave [samples] at features.sample_rate, utt_id, epoch) -> (features [frames, n_mels] float32,
    info)``.

    ``babble``: optional list of waveforms or callable(rng) -> waveform for babble noise (must draw only from the
    rng it is given). The RIR pool is created lazily in the process that first needs it (one per DataLoader
    worker); ``profile=True`` adds per-stage seconds to info["timings_s"].
    """

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

    def filterbank(self, warp: float) -> torch.Tensor:
        return mel_filterbank(self.config.features, warp, self.config.vtlp_boundary_hz)

    def __call__(self, wave: torch.Tensor, utt_id: str, epoch: int) -> tuple[torch.Tensor, dict]:
        out = self.augment(wave, utt_id, epoch)
        return out.features, out.info

    def augment(self, wave, utt_id: str, epoch: int, *, simulate: bool | None = None,
                warp: float | None = None) -> Augmented:
        """Full pipeline; ``simulate``/``warp`` override the random choices (demo, tests)."""
        with single_thread():
            return self._augment(wave, utt_id, epoch, simulate, warp)

    def _augment(self, wave, utt_id, epoch, simulate, warp) -> Augmented:
        wave = torch.as_tensor(wave, dtype=torch.float32)
        if wave.dim() != 1 or wave.numel() == 0:
            raise ValueError(f"utterance {utt_id!r}: wave must be a non-empty 1-D tensor [samples], got shape "
                             f"{tuple(wave.shape)}")
        c = self.config
        rng = np.random.default_rng(utterance_seed(self.seed, epoch, utt_id))
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(stage):
            nonlocal clock
            now = time.perf_counter()
            timings[stage] = timings.get(stage, 0.0) + now - clock
            clock = now

        drawn_warp = sample_warp(rng, *c.vtlp_range) if c.vtlp else 1.0
        do_sim = bool(rng.random() < c.sim_prob)
        torch_seed = int(rng.integers(0, 2**63 - 1))
        if warp is None:
            warp = round(round(drawn_warp / c.vtlp_grid) * c.vtlp_grid, 6) if c.vtlp else 1.0
        if simulate is not None:
            do_sim = simulate
        info = {"utt_id": utt_id, "epoch": int(epoch), "warp": float(warp), "simulated": do_sim}
        fb = self.filterbank(float(warp))
        lap("vtlp")
        if do_sim:
            wave = self._simulate(wave, rng, epoch, info, lap)
        features = mel_features(wave, fb, c.features)
        lap("features")
        info["specaugment"] = c.specaugment
        if c.specaugment:
            features = spec_augment(features, torch.Generator().manual_seed(torch_seed), c.specaugment_options)
            lap("specaugment")
        if self.profile:
            info["timings_s"] = timings
        return Augmented(features, info, wave)

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
