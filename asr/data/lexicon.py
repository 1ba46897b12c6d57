"""The pronunciation lexicon (``asr-prep lexicon``): every word of the LM text (and of the training transcripts)
spelt in phones by espeak-ng's letter-to-sound rules, and the phone inventory the model's phone CTC head emits.

Why phones: word pieces are learned per spelling, so a word no training utterance speaks gets posteriors the model
never learned to give, and no language model brings it back (RESULTS.md, 2026-12-04: a word lexicon over word
pieces moved the open-domain WER by half a point). Phones are shared by every word: a phone CTC head trained on
2,000 utterances still hears the phones of an unseen word, and the lexicon plus a word n-gram LM turn them into
words (``asr-eval --method lexicon``).

espeak-ng is called once per batch of words, one word per line (``-q -x --sep=_ -v en-us``): its phoneme mnemonics
(Kirshenbaum-like ASCII) with the stress marks (``'`` and ``,``) and the variant mark ``#`` dropped.

Files: ``OUT/lexicon.txt`` (``word p1 p2 ...``, sorted by word: flashlight's lexicon format) and ``OUT/phones.txt`` (the inventory, one phone
per line, sorted; a model's phone ``i`` is line ``i``, its CTC blank is ``len(phones)``).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..atomic import atomic_write_text
from .manifest import read_manifest

ESPEAK_VOICE = "en-us"
_DROP = re.compile(r"['#,]")


class LexiconError(ValueError):
    pass


def phones_of(mnemonics: str) -> list[str]:
    """espeak-ng's ``-x --sep=_`` output for one word -> its phones (stress and variant marks dropped)."""
    return [p for p in (_DROP.sub("", t) for t in re.split(r"[_\s]+", mnemonics.strip())) if p]


def espeak_phones(words: list[str], voice: str = ESPEAK_VOICE, batch: int = 2000) -> dict[str, list[str]]:
    """Each word's phones from espeak-ng's rules (one subprocess per ``batch`` words)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise LexiconError("espeak-ng was not found on PATH (make setup installs it: apt-get install espeak-ng)")
    out: dict[str, list[str]] = {}
    for i in range(0, len(words), batch):
        chunk = words[i:i + batch]
        res = subprocess.run([exe, "-q", "-x", "--sep=_", "-v", voice], input="\n".join(chunk) + "\n",
                             capture_output=True, text=True, check=False)
        lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
        if res.returncode != 0 or len(lines) != len(chunk):
            raise LexiconError(f"espeak-ng -v {voice} gave {len(lines)} pronunciations for {len(chunk)} words "
                               f"(exit {res.returncode}): {res.stderr.strip()[:200]}")
        for w, ln in zip(chunk, lines):
            out[w] = phones_of(ln)
    return out


def build_lexicon(text, manifests, out_dir, voice: str = ESPEAK_VOICE) -> dict:
    """Write OUT/lexicon.txt and OUT/phones.txt for every word of ``text`` (one sentence per line) and of the
    manifests' transcripts; returns a summary."""
    from .tokenizer import read_text_lines
    words: set[str] = set()
    for line in read_text_lines(text):
        words.update(line.split())
    for m in manifests:
        for e in read_manifest(m, required=("text",)):
            words.update(e["text"].split())
    if not words:
        raise LexiconError(f"{text}: no words to spell")
    lex = espeak_phones(sorted(words), voice)
    empty = sorted(w for w, p in lex.items() if not p)
    lex = {w: p for w, p in lex.items() if p}
    phones = sorted({p for ps in lex.values() for p in ps})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "phones.txt", "".join(p + "\n" for p in phones))
    atomic_write_text(out / "lexicon.txt", "".join(f"{w} {' '.join(lex[w])}\n" for w in sorted(lex)))
    summary = {"words": len(lex), "phones": len(phones), "unspelt": empty[:20], "voice": voice,
               "text": str(text), "manifests": [str(m) for m in manifests]}
    atomic_write_text(out / "lexicon.json", json.dumps(summary, indent=1) + "\n")
    return summary


class Lexicon:
    """A lexicon folder (``asr-prep lexicon``): ``phones`` (the inventory) and ``words`` (word -> phones).
    ``encode(text)`` gives the phone ids of a transcript, for the phone CTC head's targets."""

    def __init__(self, folder):
        self.folder = Path(folder)
        lex_path, phones_path = self.folder / "lexicon.txt", self.folder / "phones.txt"
        for p in (lex_path, phones_path):
            if not p.exists():
                raise LexiconError(f"{p}: not found (build it with asr-prep lexicon --out {self.folder})")
        self.phones = [ln.strip() for ln in phones_path.read_text().splitlines() if ln.strip()]
        self.index = {p: i for i, p in enumerate(self.phones)}
        self.words: dict[str, list[str]] = {}
        for n, ln in enumerate(lex_path.read_text().splitlines(), 1):
            if not ln.strip():
                continue
            word, *ps = ln.split()
            bad = [p for p in ps if p not in self.index]
            if not ps or bad:
                raise LexiconError(f"{lex_path}:{n}: expected 'word phone ...' over the phones of {phones_path}, "
                                   f"got {ln!r}")
            self.words[word] = ps

    def __len__(self) -> int:
        return len(self.phones)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[p] for w in text.split() for p in self.words[w]]
        except KeyError as e:
            raise LexiconError(f"{self.folder / 'lexicon.txt'}: no pronunciation of the word {e.args[0]!r} "
                               f"(transcript {text!r}); rebuild it with asr-prep lexicon over this corpus") from None


def print_summary(summary: dict, out_dir) -> None:
    print(f"asr-prep lexicon: {summary['words']} words over {summary['phones']} phones -> {out_dir}"
          + (f"; espeak-ng gave no phones for {len(summary['unspelt'])} (left out)" if summary["unspelt"] else ""),
          file=sys.stderr)
