"""The one audio reader: every waveform that reaches features, augmentation or a manifest is decoded here.

:func:`read_audio` turns the ways a file can be unusable (missing, 0 bytes, not audio, 0 samples, cut short,
damaged, NaN samples) into an :class:`AudioError`, a ``ValueError`` with a short reason code and a message that
names the file. ``strict=True`` (asr-prep, before a file enters a manifest) adds the checks that need the file's
header as evidence: a FLAC whose STREAMINFO promises more samples than decode, a WAV whose header sizes exceed the
file. Without it (loaders), whatever libsndfile decodes without an error is used, as before.

:func:`load_wave` is what the loader, the augmenter and the babble sources use: a mono float32 tensor at the
feature sample rate.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from .settings import SAMPLE_RATE

_BLOCK = 1 << 16
AUDIO_ERROR_CODES = ("missing_audio", "empty_file", "empty_audio", "corrupt_audio", "truncated_audio",
                     "wrong_sample_rate")


class AudioError(ValueError):
    """An unusable audio file. ``code`` is one of :data:`AUDIO_ERROR_CODES`; ``str(err)`` names the file and the
    reason."""

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


def read_audio(path, strict: bool = False) -> tuple[np.ndarray, int]:
    """Decode a whole file: (samples [frames, channels] float32, sample rate), or raise AudioError naming it."""
    path = Path(os.fspath(path))
    if not path.is_file():
        raise AudioError("missing_audio", path, "audio file not found")
    if path.stat().st_size == 0:
        raise AudioError("empty_file", path, "audio file is empty (0 bytes)")
    try:
        f = sf.SoundFile(str(path))
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        total = flac_total_samples(path)
        if total == 0:
            raise AudioError("empty_audio", path, "audio has no samples (FLAC header says 0)") from e
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
                raise AudioError("empty_audio", path, "audio has no samples (FLAC header says 0)") from e
            of = f" of {declared}" if 0 < declared < 1 << 40 else ""  # libsndfile reports 2**63-1 when unknown
            raise AudioError("truncated_audio", path, f"decoding stopped after {got}{of} samples "
                             f"(truncated or damaged): {e}") from e
    data = np.concatenate(chunks) if chunks else np.zeros((0, f.channels), np.float32)
    if strict:
        if "should be" in header_note:  # libsndfile's note when a WAV header's sizes exceed the file
            raise AudioError("truncated_audio", path, "WAV header sizes exceed the file (truncated): "
                             + " ".join(ln.strip() for ln in header_note.splitlines() if "should be" in ln))
        total = flac_total_samples(path)
        if total and len(data) != total:
            raise AudioError("truncated_audio", path, f"decoded {len(data)} of {total} samples (truncated)")
    if len(data) == 0:
        raise AudioError("empty_audio", path, "audio has no samples")
    if not np.isfinite(data).all():
        raise AudioError("corrupt_audio", path, "audio contains NaN or infinite samples")
    return data, sr


def load_wave(path, sample_rate: int = SAMPLE_RATE, strict: bool = False) -> torch.Tensor:
    """Mono float32 waveform [samples] (channels averaged) of a file at ``sample_rate``; AudioError names the file."""
    data, rate = read_audio(path, strict)
    if rate != sample_rate:
        raise AudioError("wrong_sample_rate", path, f"sample rate {rate} Hz, expected {sample_rate} Hz "
                         f"(resample it in asr-prep)")
    return torch.from_numpy(np.ascontiguousarray(data.mean(axis=1)))
