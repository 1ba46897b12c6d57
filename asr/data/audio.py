"""Audio I/O with checks: every file that enters a manifest is decoded in full once, here.

``load_checked`` turns the ways a file can be unusable (missing, 0 bytes, not audio, 0 samples, cut short, damaged)
into an :class:`AudioError` with a short reason code and a sentence naming the file, so importers and the
synthesizer can reject one item and carry on with the rest.
"""
from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

SAMPLE_RATE = 16000
_BLOCK = 1 << 16


class AudioError(Exception):
    """An unusable audio file. ``code`` is one of missing_audio, empty_file, empty_audio, corrupt_audio,
    truncated_audio; ``str(err)`` names the file and the reason."""

    def __init__(self, code: str, path, detail: str):
        super().__init__(f"{path}: {detail}")
        self.code, self.path, self.detail = code, str(path), detail


def flac_total_samples(path) -> int | None:
    """Total samples from a FLAC STREAMINFO block (0 means empty or unknown), or None if not a FLAC header."""
    with open(path, "rb") as f:
        head = f.read(4 + 4 + 34)
    if len(head) < 42 or head[:4] != b"fLaC" or (head[4] & 0x7F) != 0:
        return None
    # STREAMINFO: ... 20 bits sample rate, 3 bits channels-1, 5 bits bps-1, 36 bits total samples (bytes 10..17)
    (word,) = struct.unpack(">Q", head[8 + 10:8 + 18])
    return word & ((1 << 36) - 1)


def load_checked(path) -> tuple[np.ndarray, int]:
    """Decode a whole file; return (samples [frames, channels] float32, sample rate) or raise AudioError."""
    path = Path(path)
    if not path.is_file():
        raise AudioError("missing_audio", path, "audio file not found")
    if path.stat().st_size == 0:
        raise AudioError("empty_file", path, "audio file is empty (0 bytes)")
    try:
        f = sf.SoundFile(str(path))
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        total = flac_total_samples(path)
        if total == 0:
            raise AudioError("empty_audio", path, "audio has 0 samples (FLAC header says so)") from e
        if total is not None:
            raise AudioError("truncated_audio", path, f"FLAC header promises {total} samples but the file cannot be "
                             f"opened (truncated or damaged): {e}") from e
        raise AudioError("corrupt_audio", path, f"not a readable audio file: {e}") from e
    with f:
        sr, declared = f.samplerate, f.frames
        header_note = f.extra_info if f.format == "WAV" else ""
        chunks = []
        try:
            while True:
                block = f.read(_BLOCK, dtype="float32", always_2d=True)
                if not len(block):
                    break
                chunks.append(block)
        except (sf.LibsndfileError, RuntimeError) as e:
            got = sum(len(c) for c in chunks)
            if got == 0 and flac_total_samples(path) == 0:
                raise AudioError("empty_audio", path, "audio has 0 samples (FLAC header says so)") from e
            of = f" of {declared}" if 0 < declared < 1 << 40 else ""  # libsndfile reports 2**63-1 when unknown
            raise AudioError("truncated_audio", path, f"decoding stopped after {got}{of} samples "
                             f"(truncated or damaged): {e}") from e
    data = np.concatenate(chunks) if chunks else np.zeros((0, f.channels), np.float32)
    if "should be" in header_note:  # libsndfile's note when a WAV header's sizes exceed the file
        raise AudioError("truncated_audio", path, "WAV header sizes exceed the file (truncated): "
                         + " ".join(ln.strip() for ln in header_note.splitlines() if "should be" in ln))
    total = flac_total_samples(path)
    if total and len(data) != total:
        raise AudioError("truncated_audio", path, f"decoded {len(data)} of {total} samples (truncated)")
    if len(data) == 0:
        raise AudioError("empty_audio", path, "audio has 0 samples")
    if not np.isfinite(data).all():
        raise AudioError("corrupt_audio", path, "audio contains NaN or infinite samples")
    return data, sr


def to_mono_16k(data: np.ndarray, sr: int) -> np.ndarray:
    """Average channels and resample to 16 kHz (torchaudio's windowed-sinc resampler; deterministic on CPU)."""
    mono = data.mean(axis=1) if data.ndim == 2 else data
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if sr != SAMPLE_RATE:
        mono = AF.resample(torch.from_numpy(mono), sr, SAMPLE_RATE).numpy()
    return mono


def write_flac(path, samples: np.ndarray) -> None:
    """Write 16-bit 16 kHz mono FLAC atomically (tmp file, then os.replace); samples are clipped to [-1, 1]."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    sf.write(str(tmp), np.clip(samples, -1.0, 1.0), SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    os.replace(tmp, path)


def md5_file(path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
