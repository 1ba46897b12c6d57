"""Audio written by asr-prep: conversion to the front end's rate, atomic FLAC writing, checksums.

Reading (with the checks that decide whether a file may enter a manifest) is the front end's:
``asr.frontend.read_audio(path, strict=True)``.
"""
from __future__ import annotations

import hashlib

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

from ..atomic import atomic_path
from ..frontend import SAMPLE_RATE


def to_mono_16k(data: np.ndarray, sr: int) -> np.ndarray:
    """Average channels and resample to 16 kHz (torchaudio's windowed-sinc resampler; deterministic on CPU)."""
    mono = data.mean(axis=1) if data.ndim == 2 else data
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if sr != SAMPLE_RATE:
        mono = AF.resample(torch.from_numpy(mono), sr, SAMPLE_RATE).numpy()
    return mono


def write_flac(path, samples: np.ndarray) -> None:
    """Write 16-bit 16 kHz mono FLAC atomically (asr.atomic); samples are clipped to [-1, 1]."""
    with atomic_path(path) as tmp:
        sf.write(str(tmp), np.clip(samples, -1.0, 1.0), SAMPLE_RATE, format="FLAC", subtype="PCM_16")


def md5_file(path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
