"""Clean power spectrograms computed once and kept on disk, shared by every loader process and every run.

Why: a loader worker spent ~1.0 ms decoding an utterance's FLAC and ~0.65 ms on its STFT, every epoch, while
reading the same spectrogram back from a file costs ~0.03-0.08 ms (3.1 s utterances of the small corpus, one
thread). An utterance the augmenter does not simulate then costs one cached read, one matmul with the (VTLP-warped)
mel filterbank and the compression; evaluation features the same without the warp. Simulated utterances still
decode the audio (the room acts on the waveform); their clean spectrogram is stored while the audio is decoded.

Layout: ``ROOT/<settings digest>/<utterance key>.pspec`` plus ``ROOT/<settings digest>/settings.json`` (what the
digest stands for, for people; never read back). With ``"auto"`` ROOT is ``feature_cache/`` next to the manifest.

Invalidation: the settings digest covers :data:`FORMAT_VERSION`, the stored dtype, the spectrum's definition and
every :class:`~asr.frontend.settings.FeatureSettings` field (the mel ones too, so a folder belongs to exactly one
statistics file's settings): change any of them and the features come from another folder, the old one is never
read. The utterance key is the manifest's ``md5`` of the audio (plus the file size) when the entry has one, else
the resolved path, size and modification time, so a replaced audio file gets a new key.

Files are float32 by default: the features are then bitwise those computed without the cache, and a run with the
cache trains exactly as one without. bfloat16 (``dtype="bfloat16"``) halves the disk and page-cache footprint
(316 instead of 633 MB for the 1.7 h training set) at features within ~1e-3 of a global standard deviation;
float16 is not offered: power below 6e-8 flushes to zero and the power-law features then move by up to 1.6
standard deviations.

Concurrency and damage: each writer writes its own temporary file and renames it over the entry (``os.replace``),
so readers see a whole file or none, and two processes filling one entry both write the same bytes. No fsync: the
cache is disposable, and a file a crash left short or empty fails the header, size or CRC32 check, is logged,
recomputed and replaced. A folder that cannot be written leaves the features computed without the cache.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import struct
import zlib
from pathlib import Path

import torch

from .settings import FeatureSettings

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SPECTRUM = "|STFT|^2 [frames, n_fft//2+1]; periodic Hann window of win_length, centred, reflect-padded"
DTYPES = {"float32": (1, torch.float32, torch.float32), "bfloat16": (2, torch.bfloat16, torch.int16)}
_MAGIC = b"ASRPSPEC"
# magic, format version, dtype code, frames, bins, CRC32 of the payload, utterance key (16 bytes): 40 bytes
_HEADER = struct.Struct("<8sHHIII16s")
SUFFIX = ".pspec"


class CacheEntryError(ValueError):
    """A cache file that cannot be used (short, damaged, another format or another utterance's)."""


@contextlib.contextmanager
def single_thread():
    """torch intra-op threads = 1 for the block: whoever fills an entry computes the same floats (1-D FFTs differ
    slightly between thread counts), and DataLoader workers already use 1."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def settings_digest(settings: FeatureSettings, dtype: str = "float32", dereverb: str = "off") -> str:
    """20 hex digits naming the cache folder of (format, dtype, spectrum definition, every feature setting, and
    the dereverberation with its settings when there is one)."""
    return hashlib.blake2b(json.dumps(_description(settings, dtype, dereverb), sort_keys=True).encode(),
                           digest_size=10).hexdigest()


def _description(settings: FeatureSettings, dtype: str, dereverb: str = "off") -> dict:
    out = {"format_version": FORMAT_VERSION, "dtype": dtype, "spectrum": SPECTRUM, "settings": settings.to_dict()}
    if dereverb != "off":       # absent for "off": the folders of earlier caches keep their names
        from .dereverb import describe
        out["dereverb"] = describe(dereverb)
    return out


def utterance_key(audio_path, md5: str | None = None) -> str:
    """32 hex digits naming an audio file's entry: of (md5, size) when the manifest gives the md5, else of
    (resolved path, size, mtime in ns). OSError (e.g. FileNotFoundError) if the file cannot be stat'ed."""
    path = Path(audio_path)
    st = path.stat()
    ident = f"md5\x1f{md5}\x1f{st.st_size}" if md5 else f"file\x1f{path.resolve()}\x1f{st.st_size}\x1f{st.st_mtime_ns}"
    return hashlib.blake2b(ident.encode("utf-8"), digest_size=16).hexdigest()


class FeatureCache:
    """The clean power spectrograms of one set of feature settings under ``root`` (see the module doc).

    :meth:`power` returns an utterance's spectrogram, computing and storing it on a miss; :meth:`features` its
    clean features; :meth:`offer` stores the spectrogram of a waveform already decoded. Counters (per process):
    ``hits``, ``misses`` (spectrograms computed), ``rejected`` (damaged files recomputed), ``write_errors``.
    Pickles cheaply (paths and settings), so each DataLoader worker gets its own.

    ``dereverb`` (asr.frontend.dereverb, evaluation only): the spectrograms of the dereverberated audio, in a folder
    of their own; :meth:`offer` is then refused (the augmenter's simulated audio is not what such a cache holds)."""

    def __init__(self, root, settings: FeatureSettings, dtype: str = "float32", dereverb: str = "off"):
        from .dereverb import check
        if dtype not in DTYPES:
            raise ValueError(f"FeatureCache: dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
        self.dereverb = check(dereverb, "FeatureCache: dereverb")
        if not isinstance(settings, FeatureSettings):
            raise ValueError(f"FeatureCache: settings must be FeatureSettings, got {settings!r}")
        self.root = Path(root)
        self.settings = settings
        self.dtype = dtype
        self.digest = settings_digest(settings, dtype, dereverb)
        self.dir = self.root / self.digest
        self.bins = settings.n_fft // 2 + 1
        self.hits = self.misses = self.rejected = self.write_errors = 0
        self._writable = True
        self._described = False

    def __repr__(self) -> str:
        return f"FeatureCache({str(self.dir)!r}, dtype={self.dtype!r}, dereverb={self.dereverb!r})"

    def path_of(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    # ------------------------------------------------------------------ the API
    def power(self, audio_path, md5: str | None = None) -> torch.Tensor:
        """[frames, bins] float32 clean power spectrogram of ``audio_path``: read from the cache, or computed (audio
        errors propagate: AudioError names the file) and stored."""
        try:
            key = utterance_key(audio_path, md5)
        except OSError:
            from .audio import load_wave
            load_wave(audio_path, self.settings.sample_rate)    # the AudioError naming the file and the reason
            raise
        power = self.load(key)
        if power is not None:
            self.hits += 1
            return power
        self.misses += 1
        return self._compute_and_store(key, audio_path, None)

    def features(self, audio_path, md5: str | None = None, warp: float = 1.0, boundary_hz: float | None = None
                 ) -> torch.Tensor:
        """[frames, n_mels] features from the cached spectrogram; bitwise compute_features(load_wave(path)) with
        float32 files (the same ops on the same spectrogram)."""
        from .mel import compress_mel, mel_filterbank
        from .settings import VTLP_BOUNDARY_HZ
        boundary = VTLP_BOUNDARY_HZ if boundary_hz is None else boundary_hz
        fb = mel_filterbank(self.settings, float(warp), float(boundary))
        return compress_mel(torch.matmul(self.power(audio_path, md5), fb), self.settings.mel_compression)

    def offer(self, audio_path, md5: str | None, wave: torch.Tensor) -> None:
        """Store the clean spectrogram of an utterance whose audio was decoded anyway (a simulated one) unless the
        entry exists, so the next epoch that does not simulate it reads the cache."""
        if self.dereverb != "off":
            raise ValueError(f"{self}: a dereverberated cache is for evaluation; training offers clean audio")
        if not self._writable:
            return
        key = utterance_key(audio_path, md5)
        if not self.path_of(key).is_file():
            self.misses += 1
            self._compute_and_store(key, audio_path, wave)

    # ------------------------------------------------------------------ files
    def load(self, key: str) -> torch.Tensor | None:
        """The entry's spectrogram (float32), or None if it is missing or damaged (logged, and counted)."""
        path = self.path_of(key)
        try:
            return self._read(path, key)
        except FileNotFoundError:
            return None
        except (CacheEntryError, OSError) as e:
            self.rejected += 1
            log.warning("feature cache: %s: %s; recomputing it", path, e)
            return None

    def _read(self, path: Path, key: str) -> torch.Tensor:
        code, dtype, storage = DTYPES[self.dtype]
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
            if len(head) < _HEADER.size:
                raise CacheEntryError(f"truncated header ({len(head)} of {_HEADER.size} bytes)")
            magic, version, got_code, frames, bins, crc, got_key = _HEADER.unpack(head)
            if magic != _MAGIC or version != FORMAT_VERSION or got_code != code:
                raise CacheEntryError(f"not a version-{FORMAT_VERSION} {self.dtype} spectrogram file")
            if bins != self.bins or got_key != bytes.fromhex(key):
                raise CacheEntryError(f"holds another utterance or framing (bins {bins}, expected {self.bins})")
            size = frames * bins * storage.itemsize
            actual = os.fstat(f.fileno()).st_size - _HEADER.size
            if actual != size:
                raise CacheEntryError(f"payload is {actual} bytes, the header says {size} (truncated or damaged)")
            raw = torch.empty(frames, bins, dtype=storage)
            view = memoryview(raw.numpy()).cast("B")
            if f.readinto(view) != size:
                raise CacheEntryError("payload shorter than its header says")
        if zlib.crc32(view) != crc:
            raise CacheEntryError("checksum mismatch (damaged)")
        return raw if storage == dtype else raw.view(dtype).float()

    def _compute_and_store(self, key: str, audio_path, wave: torch.Tensor | None) -> torch.Tensor:
        from .audio import load_wave
        from .mel import power_spectrogram
        if wave is None:
            wave = load_wave(audio_path, self.settings.sample_rate)
        if self.dereverb != "off":
            from .dereverb import dereverberate
            wave = dereverberate(wave, self.dereverb)
        with single_thread():
            power = power_spectrogram(wave.to(torch.float32), self.settings).contiguous()
        _, dtype, storage = DTYPES[self.dtype]
        if dtype != torch.float32:      # what the file holds, so a hit and a miss give the same features
            power = power.to(dtype).float()
        if self._writable:
            self._store(key, power)
        return power

    def _store(self, key: str, power: torch.Tensor) -> None:
        code, dtype, storage = DTYPES[self.dtype]
        payload = power if dtype == torch.float32 else power.to(dtype).view(storage)
        view = memoryview(payload.contiguous().numpy()).cast("B")
        head = _HEADER.pack(_MAGIC, FORMAT_VERSION, code, power.shape[0], power.shape[1], zlib.crc32(view),
                            bytes.fromhex(key))
        path = self.path_of(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            self._describe()
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(view)
            os.replace(tmp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.write_errors += 1
            self._writable = False
            log.warning("feature cache: cannot write %s (%s); this process computes features without storing them",
                        self.dir, e)

    def _describe(self) -> None:
        """Create the folder and its settings.json (once per process; atomically, like the entries)."""
        if self._described:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        target = self.dir / "settings.json"
        if not target.is_file():
            tmp = target.with_name(f".settings.json.{os.getpid()}.{secrets.token_hex(4)}.tmp")
            tmp.write_text(json.dumps(_description(self.settings, self.dtype, self.dereverb), indent=2) + "\n")
            os.replace(tmp, target)
        self._described = True


def open_feature_cache(spec, manifest, settings: FeatureSettings, where: str = "data.feature_cache",
                       dereverb: str = "off") -> FeatureCache | None:
    """The cache a setting asks for: ``"auto"`` (``feature_cache/`` next to ``manifest``), ``"off"`` / ``""`` /
    None (none), a folder, or a FeatureCache (returned as it is, if it holds ``settings``' spectrograms). Anything
    else is a ValueError naming ``where``."""
    if spec is None:
        return None
    if isinstance(spec, FeatureCache):
        if spec.dereverb != dereverb:
            raise ValueError(f"{where}: the feature cache {spec.dir} holds features with dereverb={spec.dereverb!r}, "
                             f"asked for {dereverb!r} ({manifest})")
        if spec.settings != settings:
            raise ValueError(f"{where}: the feature cache {spec.dir} holds other feature settings than the "
                             f"features asked for ({manifest})")
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise ValueError(f"{where}: expected 'auto', 'off' or a folder, got {spec!r}")
    text = os.fspath(spec).strip()
    if text.lower() in ("", "off", "none", "false"):
        return None
    root = Path(manifest).resolve().parent / "feature_cache" if text.lower() == "auto" else Path(text)
    if root.exists() and not root.is_dir():
        raise ValueError(f"{where}: {root} exists and is not a folder")
    return FeatureCache(root, settings, dereverb=dereverb)
