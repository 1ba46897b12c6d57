"""The far-field test set: the clean test set passed once through the acoustic simulator, fixed seed.

Every utterance is convolved with a room impulse response from a seeded pool and mixed with noise
at a random SNR (asr.augment, the same simulator training uses, with its default ranges), so the
far-field WER measures robustness on unseen voices in unseen rooms. VTLP is not applied (it is a
training-time feature warp). Deterministic for a given seed; resumable like synth.
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
        if not dest.exists():
            res = aug.augment(load_wave(audio_path(e, manifest)), e["id"], epoch=0, simulate=True, warp=1.0)
            wave = res.wave.clamp(-1.0, 1.0).numpy()
            with atomic_path(dest, suffix=".flac") as tmp:
                sf.write(tmp, wave, SAMPLE_RATE, subtype="PCM_16")
        info = sf.info(dest)
        rows.append(dict(e, audio_filepath=str(dest.relative_to(out)), duration=round(info.frames / SAMPLE_RATE, 4),
                         md5=_md5(dest)))
    path = out / f"{name}.jsonl"
    write_jsonl(path, rows)
    print(f"asr-prep far: {len(rows)} utterances -> {path}", file=sys.stderr)
    return path
