"""The far-field test set: the clean test set passed once through the acoustic simulator, fixed seed.

Every utterance is convolved with a room impulse response from a seeded pool and mixed with noise
at a random SNR (asr.augment, the same simulator training uses, with its default ranges), so the
far-field WER measures robustness on unseen voices in unseen rooms. VTLP is not applied (it is a
training-time feature warp). Deterministic for a given seed; resumable like synth.

Each row also records its condition (``t60``: the room's requested T60 in s, ``snr_db``: None without noise) and
the bands ``t60_band`` / ``snr_band``, so that asr-eval can break the far-field WER down by reverberation and noise.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import soundfile as sf
from tqdm import tqdm

from ..atomic import atomic_path
from .manifest import audio_path, read_manifest, write_jsonl

FAR_SEED_OFFSET = 7919          # keeps the far-field rooms apart from the training pool of the same seed


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


T60_BANDS = (0.3, 0.5, 0.7)      # s: "<0.3 s", "0.3-0.5 s", "0.5-0.7 s", ">=0.7 s"
SNR_BANDS = (10.0, 20.0)         # dB: "<10", "10-20", ">=20", and "no noise"


def band(value: float | None, edges, unit: str) -> str:
    """The band label of ``value`` between ``edges`` ("no noise" for None)."""
    if value is None:
        return "no noise"
    if value < edges[0]:
        return f"<{edges[0]:g} {unit}"
    for lo, hi in zip(edges, edges[1:]):
        if value < hi:
            return f"{lo:g}-{hi:g} {unit}"
    return f">={edges[-1]:g} {unit}"


def condition(info: dict) -> dict:
    """The manifest fields of one simulated utterance's condition, from the augmenter's info."""
    t60 = float(info["room"]["t60"])
    snr = info.get("snr_db")
    return {"t60": round(t60, 3), "snr_db": None if snr is None else round(float(snr), 2),
            "t60_band": band(t60, T60_BANDS, "s"), "snr_band": band(snr, SNR_BANDS, "dB")}


def make_far(manifest, out_dir, seed: int = 0, pool_size: int = 32, name: str = "test_far") -> Path:
    from ..augment.pipeline import AugmentConfig, Augmenter
    from ..frontend import SAMPLE_RATE, load_wave
    manifest, out = Path(manifest), Path(out_dir)
    entries = read_manifest(manifest)
    aug = Augmenter(AugmentConfig(vtlp=False, sim_prob=1.0, pool_size=pool_size, noise_kinds=("white", "pink", "brown", "tone")),
                    seed=seed + FAR_SEED_OFFSET)
    folder = out / "audio" / name
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for e in tqdm(entries, desc=f"asr-prep far ({name})", file=sys.stderr, dynamic_ncols=True):
        dest = folder / f"{e['id']}.flac"
        # Run again for a finished file too: the simulation is deterministic, and its info names the condition.
        res = aug.augment(load_wave(audio_path(e, manifest)), e["id"], epoch=0, simulate=True, warp=1.0)
        if not dest.exists():
            wave = res.wave.clamp(-1.0, 1.0).numpy()
            with atomic_path(dest, suffix=".flac") as tmp:
                sf.write(tmp, wave, SAMPLE_RATE, subtype="PCM_16")
        info = sf.info(dest)
        rows.append(dict(e, audio_filepath=str(dest.relative_to(out)), duration=round(info.frames / SAMPLE_RATE, 4),
                         md5=_md5(dest), **condition(res.info)))
    path = out / f"{name}.jsonl"
    write_jsonl(path, rows)
    print(f"asr-prep far: {len(rows)} utterances -> {path}", file=sys.stderr)
    return path
