"""JSON-lines manifests (NeMo/lhotse style): one utterance per line.

Fields written by asr-prep: ``id``, ``audio_filepath``, ``duration`` (seconds), ``text`` (normalized), ``speaker``,
``md5`` (of the audio file). ``audio_filepath`` is relative to the manifest's folder for files asr-prep wrote
(synthesized or converted audio) and absolute for imported files used in place; :func:`audio_path` resolves both.
Writes are atomic (a tmp file then ``os.replace``) so an interrupted run never leaves half a manifest.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

from ..atomic import atomic_write_text

REQUIRED = ("id", "audio_filepath", "duration", "text")
_TYPES = {"id": str, "audio_filepath": str, "duration": (int, float), "text": str, "speaker": str, "md5": str}


class ManifestError(ValueError):
    """A malformed manifest line; the message names the file and the 1-based line number."""


def iter_manifest(path, required: Iterable[str] = REQUIRED) -> Iterator[dict]:
    path = Path(path)
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise ManifestError(f"{path}: cannot open manifest: {e.strerror}") from e
    with fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ManifestError(f"{path}:{lineno}: not UTF-8 ({e.reason} at byte {e.start})") from e
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ManifestError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from e
            if not isinstance(obj, dict):
                raise ManifestError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            for key in required:
                if key not in obj:
                    raise ManifestError(f"{path}:{lineno}: missing field {key!r}")
            for key, typ in _TYPES.items():
                if key in obj and (not isinstance(obj[key], typ) or isinstance(obj[key], bool)):
                    raise ManifestError(f"{path}:{lineno}: field {key!r} has type {type(obj[key]).__name__}")
            yield obj


def read_manifest(path, required: Iterable[str] = REQUIRED) -> list[dict]:
    """All entries of a manifest; raises ManifestError naming file and line for the first malformed line."""
    return list(iter_manifest(path, required))


def audio_path(entry: dict, manifest_path) -> Path:
    """Absolute path of an entry's audio (relative paths are relative to the manifest's folder)."""
    return Path(manifest_path).resolve().parent / entry["audio_filepath"]


def write_jsonl(path, entries: Iterable[dict]) -> None:
    """Write objects one per line, atomically."""
    atomic_write_text(path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries))


write_manifest = write_jsonl


def write_json(path, obj) -> None:
    """Write one JSON document (indented, keys in insertion order), atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
