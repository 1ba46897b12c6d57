"""Import existing corpora (``asr-prep import``) into the manifest format that synth writes.

Formats: ``librispeech`` (SRC/<speaker>/<chapter>/<id>.flac with <speaker>-<chapter>.trans.txt lines "ID TEXT"),
``jsonl`` (a manifest-like file: audio_filepath relative to the file or absolute, text, optional id and speaker)
and ``tsv`` (a header row naming the columns path and text, optional id and speaker; Common Voice names such as
sentence and client_id are accepted). Every audio file is decoded once: unusable items are rejected with the file
and reason (DIR/rejected.jsonl) and the rest is imported. Audio already at 16 kHz mono is used in place (absolute
path); anything else is converted to 16 kHz mono FLAC under DIR/audio/<split>/ (path relative to DIR).
"""
from __future__ import annotations

import csv
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..frontend import SAMPLE_RATE, AudioError, read_audio
from .audio import md5_file, to_mono_16k, write_flac
from .manifest import write_jsonl
from .normalize import normalize
from .pool import parallel_map
from .rejects import Rejection, RejectLog

FORMATS = ("librispeech", "jsonl", "tsv")
AUDIO_EXTS = (".flac", ".wav")
_TSV_COLUMNS = {"path": ("path", "audio_filepath", "audio", "file"), "text": ("text", "sentence", "transcript"),
                "id": ("id", "utt_id"), "speaker": ("speaker", "client_id", "speaker_id")}
MAX_NOTES = 10


class ImportFailed(RuntimeError):
    """The source as a whole cannot be imported (missing folder, unusable TSV header); exit code 2."""


@dataclass
class Candidate:
    id: str
    audio: Path
    text: str        # normalized
    speaker: str
    where: str       # transcript location, for messages


def _decode_line(raw: bytes, where: str, rejects: RejectLog, split: str, guess_id: str | None) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        rejects.add(Rejection(guess_id, where, "not_utf8", f"transcript is not UTF-8 (byte 0x{raw[e.start]:02x} at "
                              f"column {e.start + 1})", split))
        return None


def _text_or_reject(raw_text: str, uid: str, where: str, rejects: RejectLog, split: str) -> str | None:
    text = normalize(raw_text)
    if not text:
        rejects.add(Rejection(uid, where, "empty_transcript",
                              "transcript is empty" if not raw_text.strip()
                              else f"transcript {raw_text.strip()[:40]!r} is empty after normalization", split))
        return None
    return text


def _librispeech(src: Path, rejects: RejectLog, split: str) -> list[Candidate]:
    out, described = [], set()
    trans_files = sorted(src.rglob("*.trans.txt"))
    if not trans_files:
        raise ImportFailed(f"{src}: no *.trans.txt files (expected SRC/<speaker>/<chapter>/<speaker>-<chapter>"
                           ".trans.txt)")
    for tf in trans_files:
        folder = tf.parent
        rel = folder.relative_to(src).parts
        speaker = rel[0] if rel else tf.name.split("-")[0]
        for lineno, raw in enumerate(tf.read_bytes().splitlines(), 1):
            if not raw.strip():
                continue
            where = f"{tf}:{lineno}"
            guess_id = raw.split(None, 1)[0].decode("ascii", errors="replace")
            line = _decode_line(raw, where, rejects, split, guess_id)
            described.update(folder / (guess_id + ext) for ext in AUDIO_EXTS)
            if line is None:
                continue
            parts = line.strip().split(None, 1)
            uid = parts[0]
            text = _text_or_reject(parts[1] if len(parts) > 1 else "", uid, where, rejects, split)
            if text is None:
                continue
            audio = next((folder / (uid + ext) for ext in AUDIO_EXTS if (folder / (uid + ext)).exists()),
                         folder / (uid + ".flac"))
            out.append(Candidate(uid, audio, text, speaker, where))
    for f in sorted(p for ext in AUDIO_EXTS for p in src.rglob("*" + ext)):
        if f not in described:
            rejects.add(Rejection(f.stem, str(f), "no_transcript", "audio file has no line in a .trans.txt file",
                                  split))
    return out


def _text_lines(src: Path, raw_lines, first: int, rejects: RejectLog, split: str):
    """(where, decoded line) for each non-empty line; lines that are not UTF-8 are rejected by _decode_line."""
    for lineno, raw in enumerate(raw_lines, first):
        if not raw.strip():
            continue
        where = f"{src}:{lineno}"
        line = _decode_line(raw, where, rejects, split, None)
        if line is not None:
            yield where, line


def _jsonl(src: Path, rejects: RejectLog, split: str) -> list[Candidate]:
    out = []
    for where, line in _text_lines(src, src.read_bytes().splitlines(), 1, rejects, split):
        try:
            obj = json.loads(line)
            path = obj["audio_filepath"]
            raw_text = obj.get("text", "")
            if not isinstance(path, str) or not isinstance(raw_text, str):
                raise TypeError("audio_filepath and text must be strings")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            rejects.add(Rejection(None, where, "bad_entry", f"not a JSON object with audio_filepath and text "
                                  f"({type(e).__name__}: {e})", split))
            continue
        audio = (src.parent / path)
        uid = str(obj.get("id") or audio.stem)
        text = _text_or_reject(raw_text, uid, where, rejects, split)
        if text is not None:
            out.append(Candidate(uid, audio, text, str(obj.get("speaker", "unknown")), where))
    return out


def _tsv(src: Path, rejects: RejectLog, split: str) -> list[Candidate]:
    raw_lines = src.read_bytes().splitlines()
    if not raw_lines:
        raise ImportFailed(f"{src}: empty TSV file")
    try:
        header = raw_lines[0].decode("utf-8").split("\t")
    except UnicodeDecodeError as e:
        raise ImportFailed(f"{src}:1: TSV header is not UTF-8") from e
    cols = {}
    for key, names in _TSV_COLUMNS.items():
        cols[key] = next((header.index(n) for n in names if n in header), None)
    if cols["path"] is None or cols["text"] is None:
        raise ImportFailed(f"{src}:1: TSV header must name a path column ({'/'.join(_TSV_COLUMNS['path'])}) and a "
                           f"text column ({'/'.join(_TSV_COLUMNS['text'])}); got {header}")
    out = []
    for where, line in _text_lines(src, raw_lines[1:], 2, rejects, split):
        row = next(csv.reader(io.StringIO(line), delimiter="\t", quoting=csv.QUOTE_NONE))
        if len(row) <= max(cols["path"], cols["text"]):
            rejects.add(Rejection(None, where, "bad_entry", f"{len(row)} columns, header has {len(header)}", split))
            continue
        audio = src.parent / row[cols["path"]]
        uid = row[cols["id"]] if cols["id"] is not None and len(row) > cols["id"] and row[cols["id"]] else audio.stem
        speaker = row[cols["speaker"]] if cols["speaker"] is not None and len(row) > cols["speaker"] else "unknown"
        text = _text_or_reject(row[cols["text"]], uid, where, rejects, split)
        if text is not None:
            out.append(Candidate(uid, audio, text, speaker or "unknown", where))
    return out


_READERS = {"librispeech": _librispeech, "jsonl": _jsonl, "tsv": _tsv}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "item"


def _check_one(job: tuple[Candidate, str, str]) -> dict:
    """Decode one file; convert to 16 kHz mono FLAC under out/audio/<split>/ when needed (runs in a worker)."""
    cand, out_dir, split = job
    try:
        data, sr = read_audio(cand.audio, strict=True)
    except AudioError as e:
        return {"ok": False, "code": e.code, "detail": e.detail}

    def entry(path: str, frames: int, md5: str, **extra) -> dict:
        return {"id": cand.id, "audio_filepath": path, "duration": round(frames / SAMPLE_RATE, 4), "text": cand.text,
                "speaker": cand.speaker, "md5": md5, **extra}

    if sr == SAMPLE_RATE and data.shape[1] == 1:
        return {"ok": True, "entry": entry(str(cand.audio.resolve()), len(data), md5_file(cand.audio)), "note": None}
    rel = f"audio/{split}/{_safe(cand.id)}.flac"
    samples = to_mono_16k(data, sr)
    write_flac(Path(out_dir) / rel, samples)
    return {"ok": True,
            "entry": entry(rel, len(samples), md5_file(Path(out_dir) / rel), source_audio=str(cand.audio.resolve())),
            "note": f"{cand.audio}: {sr} Hz, {data.shape[1]} channel(s) -> converted to 16 kHz mono {rel}"}


def import_corpus(fmt: str, src, out_dir, split: str | None = None, strict: bool = False,
                  jobs: int | None = None) -> int:
    """Import ``src`` as manifest DIR/<split>.jsonl; returns the exit code (see rejects.RejectLog.exit_code)."""
    if fmt not in FORMATS:
        raise ImportFailed(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    src, out = Path(src), Path(out_dir)
    if fmt == "librispeech" and not src.is_dir():
        raise ImportFailed(f"{src}: not a folder (librispeech format expects SRC/<speaker>/<chapter>/)")
    if fmt != "librispeech" and not src.is_file():
        raise ImportFailed(f"{src}: not a file ({fmt} format expects a .{fmt} file)")
    split = _safe(split or (src.name if src.is_dir() else src.stem))
    out.mkdir(parents=True, exist_ok=True)
    rejects = RejectLog("asr-prep import")
    cands = _READERS[fmt](src, rejects, split)

    first_seen: dict[str, str] = {}
    unique = []
    for c in cands:
        if c.id in first_seen:
            rejects.add(Rejection(c.id, c.where, "duplicate_id", f"id {c.id} already used at {first_seen[c.id]}",
                                  split))
            continue
        first_seen[c.id] = c.where
        unique.append(c)

    results = parallel_map(_check_one, [(c, str(out), split) for c in unique], jobs, desc=f"import {split}",
                           unit="file")
    entries, notes = [], 0
    for c, res in zip(unique, results):
        if not res["ok"]:
            rejects.add(Rejection(c.id, str(c.audio), res["code"], res["detail"], split))
            continue
        entries.append(res["entry"])
        if res["note"]:
            notes += 1
            if notes <= MAX_NOTES:
                print(f"asr-prep import: note: {res['note']}", file=sys.stderr)
    if notes > MAX_NOTES:
        print(f"asr-prep import: note: {notes} files in all were converted to 16 kHz mono", file=sys.stderr)
    write_jsonl(out / f"{split}.jsonl", entries)
    rejects.write(out, split=split)
    hours = sum(e["duration"] for e in entries) / 3600
    print(f"asr-prep import: {len(entries)} utterances ({hours:.2f} h) -> {out / (split + '.jsonl')}, "
          f"{len(rejects.items)} rejected ({out / 'rejected.jsonl'})", file=sys.stderr)
    return rejects.exit_code(len(entries), strict)
