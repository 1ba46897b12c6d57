"""Throughput of the augmentation pipeline on one CPU worker (one process, torch.set_num_threads(1)).

Measures VTLP + acoustic simulator + features (SpecAugment off, as by default) over synthetic speech-like audio
with the RIR pool already built, in x real time (audio seconds per wall second; the target is >= 100, one hour of
audio in <= 36 s per worker), plus the pool's build time per room and per RIR and a per-stage breakdown.
Every utterance is simulated by default (--sim-prob 1.0, the worst case; the training default is 0.5).

    python -m asr.augment.bench --json out/augment_bench.json --seconds-of-audio 600
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torchaudio.functional as AF

from ..frontend import SAMPLE_RATE
from .pipeline import AugmentConfig, Augmenter


def speech_like(seconds: float, rng: np.random.Generator, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Deterministic speech-like signal: a harmonic source with a wandering pitch through three formant
    resonances, gated into 4-6 Hz syllables, with noisy 'fricative' bursts and pauses. Good enough to exercise
    the DSP at realistic lengths and levels; not intelligible."""
    n = int(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    f0 = rng.uniform(90, 220) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(0.2, 0.8) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    source = sum(np.sin(k * phase) / k for k in range(1, 30))
    voiced = torch.from_numpy(source.astype(np.float32))
    for formant, q in ((rng.uniform(300, 800), 5.0), (rng.uniform(900, 2200), 8.0), (rng.uniform(2300, 3200), 10.0)):
        voiced = voiced + 3.0 * AF.bandpass_biquad(voiced, sample_rate, float(formant), q)
    syll = rng.uniform(4, 6)
    env = np.clip(np.sin(2 * np.pi * syll * t + rng.uniform(0, 6.3)), 0, None) ** 2
    fric = (np.sin(2 * np.pi * syll / 3 * t + rng.uniform(0, 6.3)) > 0.85).astype(np.float32)
    pause = (np.sin(2 * np.pi * 0.3 * t + rng.uniform(0, 6.3)) > -0.8).astype(np.float32)
    noise = AF.highpass_biquad(torch.from_numpy(rng.standard_normal(n).astype(np.float32)), sample_rate, 3000.0)
    wave = (voiced * torch.from_numpy(env.astype(np.float32)) + 0.3 * noise * torch.from_numpy(fric)) \
        * torch.from_numpy(pause)
    return (0.1 * wave / wave.abs().max().clamp_min(1e-9)).to(torch.float32)


def run(seconds_of_audio: float, pool_size: int, sim_prob: float, seed: int,
        utt_seconds: tuple[float, float] = (2.0, 8.0)) -> dict:
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    babble = [speech_like(rng.uniform(2, 5), rng) for _ in range(8)]
    utts, total = [], 0.0
    while total < seconds_of_audio:
        sec = float(rng.uniform(*utt_seconds))
        utts.append(speech_like(sec, rng))
        total += utts[-1].numel() / SAMPLE_RATE
    config = AugmentConfig(sim_prob=sim_prob, pool_size=pool_size)
    aug = Augmenter(config, seed=seed, babble=babble, profile=True)

    build_s = aug.pool.warm(epoch=0)
    entries = [aug.pool.get(s, 0) for s in range(pool_size)]
    n_rirs = sum(1 + len(e.noise_rirs) for e in entries)
    aug.augment(utts[0][:SAMPLE_RATE], "warm-up", 0)     # first-call overheads (allocator, FFT plans)

    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    for i, wave in enumerate(utts):
        out = aug.augment(wave, f"bench-{i}", 0)
        for k, v in out.info["timings_s"].items():
            stages[k] = stages.get(k, 0.0) + v
    wall = time.perf_counter() - t0
    return {
        "x_realtime_per_worker": total / wall,
        "audio_s": total,
        "utterances": len(utts),
        "wall_s": wall,
        "seconds_per_audio_hour": 3600.0 * wall / total,
        "target_x_realtime": 100.0,
        "stages_s": stages,
        "stages_x_realtime": {k: total / v for k, v in stages.items() if v > 0},
        "pool_build_s": {"total": build_s, "entries": pool_size, "rirs": n_rirs, "per_entry": build_s / pool_size,
                         "per_rir": build_s / n_rirs,
                         "t60_requested": [round(e.t60, 3) for e in entries],
                         "t60_measured": [round(e.t60_measured, 3) for e in entries],
                         "speech_rir_samples": [int(e.speech_rir.numel()) for e in entries]},
        "sim_prob": sim_prob,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m asr.augment.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True, metavar="OUT.json", help="where to write the results")
    p.add_argument("--seconds-of-audio", type=float, default=600.0, help="audio to augment (default 600 s)")
    p.add_argument("--pool-size", type=int, default=16, help="rooms in the RIR pool (default 16)")
    p.add_argument("--sim-prob", type=float, default=1.0, help="fraction of utterances simulated (default 1.0)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.seconds_of_audio <= 0 or a.pool_size < 1:
        p.error("--seconds-of-audio must be > 0 and --pool-size >= 1")
    res = run(a.seconds_of_audio, a.pool_size, a.sim_prob, a.seed)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    pb = res["pool_build_s"]
    print(f"x_realtime_per_worker {res['x_realtime_per_worker']:.0f} (target >= 100): {res['audio_s']:.0f} s of "
          f"audio in {res['wall_s']:.1f} s; pool {pb['entries']} rooms / {pb['rirs']} RIRs built in "
          f"{pb['total']:.1f} s ({pb['per_rir']:.2f} s per RIR); stages (s): "
          + ", ".join(f"{k} {v:.2f}" for k, v in res["stages_s"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
