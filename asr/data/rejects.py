"""Rejected items: one place that reports them, writes DIR/rejected.jsonl and decides the exit code.

A bad file should cost one utterance, not the run: each rejection is printed (file and reason) as it happens, the
run finishes the rest, and the exit code is non-zero only when nothing usable remains or, with --strict, when
anything was rejected.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .manifest import ManifestError, iter_manifest, write_jsonl

REASONS = {
    "missing_audio": "audio file not found",
    "empty_file": "audio file is 0 bytes",
    "empty_audio": "audio has 0 samples",
    "corrupt_audio": "audio cannot be decoded",
    "truncated_audio": "audio is cut short",
    "not_utf8": "transcript is not UTF-8",
    "empty_transcript": "transcript is empty after normalization",
    "duplicate_id": "id already used by an earlier item",
    "no_transcript": "audio file has no transcript line",
    "bad_entry": "source line is malformed",
    "synth_failed": "synthesizer failed or produced unusable audio",
}


@dataclass
class Rejection:
    id: str | None
    path: str
    reason: str      # a key of REASONS
    detail: str      # a sentence for people
    split: str | None = None

    def __post_init__(self):
        assert self.reason in REASONS, self.reason


class RejectLog:
    def __init__(self, command: str):
        self.command = command
        self.items: list[Rejection] = []

    def add(self, rej: Rejection) -> None:
        self.items.append(rej)
        ident = f" (id {rej.id})" if rej.id else ""
        print(f"{self.command}: rejected {rej.path}{ident}: {rej.reason}: {rej.detail}", file=sys.stderr)

    def write(self, out_dir, split: str | None = None) -> Path:
        """Write DIR/rejected.jsonl. With ``split``, earlier records of other splits are kept (several imports
        into one folder), and this split's earlier records are replaced."""
        path = Path(out_dir) / "rejected.jsonl"
        kept = []
        if split is not None and path.is_file():
            try:
                kept = [r for r in iter_manifest(path, required=()) if r.get("split") != split]
            except ManifestError:
                kept = []  # unreadable old log: start afresh
        write_jsonl(path, kept + [asdict(r) for r in self.items])
        return path

    def exit_code(self, n_usable: int, strict: bool) -> int:
        if n_usable == 0:
            print(f"{self.command}: nothing usable remains ({len(self.items)} rejected)", file=sys.stderr)
            return 1
        if strict and self.items:
            print(f"{self.command}: --strict and {len(self.items)} item(s) rejected (see rejected.jsonl)",
                  file=sys.stderr)
            return 1
        return 0
