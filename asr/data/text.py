"""Sentences for the synthetic corpus: voice-assistant commands from templates, open-domain text from Debian packages.

The inputs are versioned files under ``data/text/`` (templates.yaml, slots/*.txt, sources.yaml); every choice is
drawn from a ``random.Random`` seeded by the caller, and sources are read in a fixed order, so the same seed and the
same files give the same sentences on every machine. All returned sentences are normalized (see normalize.py).
"""
from __future__ import annotations

import hashlib
import math
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import DATA_DIR
from .normalize import normalize

MIN_WORDS, MAX_WORDS = 3, 20      # commands
OPEN_MAX_WORDS = 15               # open-domain sentences: spoken-length sentences, as an assistant hears them
_SLOT = re.compile(r"\{([a-z_]+)\}")
# Raw characters an open-domain sentence may contain; anything else (code, ASCII art, markup) drops the sentence.
_RAW_OK = re.compile(r"^[A-Za-z0-9 .,;:!?'\"()\-$%&\u2018\u2019\u201c\u201d]+$")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]\u2019\u201d]*\s+")
_CLAUSE_END = re.compile(r"(?<=[;:])\s+")
_ATTRIBUTION = re.compile(r"^\s*(--|\u2014)")
RESERVED_SOURCES = ("wordnet",)


class TextSourceError(RuntimeError):
    """A text input (template, slot list, open-domain source) is missing or malformed; the message says which."""


def _read_list(path: Path) -> list[str]:
    items = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            items.append(line)
    if not items:
        raise TextSourceError(f"{path}: slot list is empty")
    return items


def file_digest(*paths: Path) -> str:
    """sha256 over files (recorded in corpus.json so a corpus names the exact inputs it was built from)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).name.encode() + b"\0" + Path(p).read_bytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- commands

@dataclass
class CommandGrammar:
    """Templates per intent plus slot lists; :meth:`sample` draws one raw (un-normalized) command."""
    intents: dict[str, list[str]]
    slots: dict[str, list[str]]
    digest: str = ""

    @classmethod
    def load(cls, data_dir: Path = DATA_DIR) -> "CommandGrammar":
        tpath = Path(data_dir) / "text" / "templates.yaml"
        try:
            doc = yaml.safe_load(tpath.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise TextSourceError(f"{tpath}: cannot read templates: {e}") from e
        intents = (doc or {}).get("intents")
        if not isinstance(intents, dict) or not intents:
            raise TextSourceError(f"{tpath}: expected a mapping 'intents: {{name: [template, ...]}}'")
        slot_dir = Path(data_dir) / "text" / "slots"
        slot_files = sorted(slot_dir.glob("*.txt"))
        slots = {p.stem: _read_list(p) for p in slot_files}
        for intent, templates in intents.items():
            if not isinstance(templates, list) or not templates:
                raise TextSourceError(f"{tpath}: intent {intent!r} has no templates")
            for t in templates:
                for name in _SLOT.findall(t):
                    if name not in slots and name not in GENERATED_SLOTS:
                        raise TextSourceError(f"{tpath}: intent {intent!r}, template {t!r}: unknown slot {{{name}}}"
                                              f" (no {slot_dir / (name + '.txt')} and not a generated slot)")
        return cls(intents, slots, file_digest(tpath, *slot_files))

    def sample(self, rng: random.Random) -> str:
        intent = rng.choice(sorted(self.intents))
        template = rng.choice(self.intents[intent])
        return _SLOT.sub(lambda m: self._fill(m[1], rng), template)

    def _fill(self, name: str, rng: random.Random) -> str:
        if name in self.slots:
            return rng.choice(self.slots[name])
        return GENERATED_SLOTS[name](rng)


def _gen_time(rng: random.Random) -> str:
    h = rng.randint(1, 12)
    m = rng.choice([0, 0, 15, 30, 45, 5, 10, 20, 25, 35, 40, 50, 55]) if rng.random() < 0.8 else rng.randint(0, 59)
    return f"{h}:{m:02d}" + rng.choice(["", "", " am", " pm"])


def _gen_duration(rng: random.Random) -> str:
    unit, lo, hi = rng.choice([("minute", 1, 90), ("minute", 1, 30), ("hour", 1, 6), ("second", 10, 90)])
    n = rng.randint(lo, hi)
    return f"{n} {unit}" + ("" if n == 1 else "s")


def _gen_number(rng: random.Random) -> str:
    return str(int(math.exp(rng.uniform(math.log(10), math.log(999_999)))))


GENERATED_SLOTS = {
    "time": _gen_time,
    "hour": lambda rng: str(rng.randint(1, 12)),
    "count": lambda rng: str(rng.randint(1, 60)),
    "number": _gen_number,
    "temperature": lambda rng: str(rng.randint(40, 95)),
    "percent": lambda rng: f"{rng.randrange(5, 101, 5)}%",
    "duration": _gen_duration,
}


def generate_commands(n: int, rng: random.Random, grammar: CommandGrammar, exclude: set[str] = frozenset()
                      ) -> list[str]:
    """``n`` distinct normalized commands of MIN_WORDS..MAX_WORDS words, none of them in ``exclude``."""
    out: list[str] = []
    seen = set(exclude)
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise TextSourceError(f"templates give only {len(out)} distinct commands of the {n} requested: "
                                  "add templates or slot entries under data/text/")
        s = normalize(grammar.sample(rng))
        if s in seen or not MIN_WORDS <= len(s.split()) <= MAX_WORDS:
            continue
        seen.add(s)
        out.append(s)
    return out


# ------------------------------------------------------------------------------------------ open domain

@dataclass
class SourceText:
    name: str
    sentences: list[str]            # normalized, distinct, in source order
    digest: str                     # sha256 of the sentences (records the exact text the package provided)
    weight: float = 1.0
    packages: list[str] = field(default_factory=list)


def split_passage(passage: str) -> list[str]:
    """Raw sentences of a passage: split at . ! ?, and at ; : where a sentence is longer than OPEN_MAX_WORDS."""
    out = []
    for sent in _SENTENCE_END.split(passage.strip()):
        if len(sent.split()) > OPEN_MAX_WORDS:
            out.extend(_CLAUSE_END.split(sent))
        else:
            out.append(sent)
    return [s.strip() for s in out if s.strip()]


def clean_sentence(raw: str) -> str | None:
    """Normalized sentence, or None when the raw text is not plain prose of MIN_WORDS..OPEN_MAX_WORDS words."""
    raw = raw.strip().strip("\"'()\u201c\u201d\u2018\u2019").strip()
    if not raw or not _RAW_OK.match(raw) or not raw[0].isalpha():
        return None
    s = normalize(raw)
    words = s.split()
    if not MIN_WORDS <= len(words) <= OPEN_MAX_WORDS:
        return None
    if any(len(w) > 20 or (len(w) == 1 and w not in ("a", "i", "o")) for w in words):
        return None  # abbreviations split into letters, or a run-together token
    return s


def _fortune_passages(path: Path, skip: set[str]) -> list[str]:
    passages = []
    for f in sorted(os.listdir(path)):
        p = path / f
        if f in skip or "." in f or not p.is_file() or p.is_symlink():
            continue
        text = p.read_bytes().decode("utf-8", errors="replace")
        for entry in re.split(r"^%\s*$", text, flags=re.M):
            lines = [ln for ln in entry.splitlines() if ln.strip() and not _ATTRIBUTION.match(ln)]
            passages.append(" ".join(ln.strip() for ln in lines))
    return passages


def _command_passages(cfg: dict, where: str) -> list[str]:
    cmd = cfg["command"]
    if shutil.which(cmd[0]) is None:
        raise TextSourceError(f"{where}: program {cmd[0]!r} not found; install Debian package(s) "
                              f"{' '.join(cfg.get('debian_packages', []))} (apt-get install -y ...)")
    res = subprocess.run(cmd, capture_output=True, check=False)
    if res.returncode != 0 or not res.stdout.strip():
        raise TextSourceError(f"{where}: {' '.join(cmd)} failed (exit {res.returncode}): "
                              f"{res.stderr.decode(errors='replace').strip()[:300]}")
    strip = re.compile(cfg.get("strip_regex", "^"))
    return [strip.sub("", ln) for ln in res.stdout.decode("utf-8", errors="replace").splitlines() if ln.strip()]


def load_sources(data_dir: Path = DATA_DIR) -> list[SourceText]:
    """Read every open-domain source listed in data/text/sources.yaml (clear error if its package is missing)."""
    spath = Path(data_dir) / "text" / "sources.yaml"
    doc = yaml.safe_load(spath.read_text(encoding="utf-8")) or {}
    out = []
    for i, cfg in enumerate(doc.get("sources") or []):
        name = cfg.get("name", f"#{i}")
        where = f"{spath}: source {name!r}"
        if any(r in str(cfg).lower() for r in RESERVED_SOURCES):
            raise TextSourceError(f"{where}: WordNet text is reserved for an outside evaluation and never used")
        kind = cfg.get("kind")
        pkgs = list(cfg.get("debian_packages", []))
        if kind == "fortune_dir":
            path = Path(cfg["path"])
            if not path.is_dir():
                raise TextSourceError(f"{where}: {path} not found; install Debian package(s) {' '.join(pkgs)} "
                                      "(apt-get install -y ...)")
            passages = _fortune_passages(path, set(cfg.get("skip_files", [])))
        elif kind == "command":
            passages = _command_passages(cfg, where)
        else:
            raise TextSourceError(f"{where}: unknown kind {kind!r} (fortune_dir or command)")
        seen, sentences = set(), []
        for passage in passages:
            for raw in split_passage(passage):
                s = clean_sentence(raw)
                if s and s not in seen:
                    seen.add(s)
                    sentences.append(s)
        if not sentences:
            raise TextSourceError(f"{where}: produced no usable sentences")
        digest = hashlib.sha256("\n".join(sentences).encode()).hexdigest()[:16]
        out.append(SourceText(name, sentences, digest, float(cfg.get("weight", 1.0)), pkgs))
    if not out:
        raise TextSourceError(f"{spath}: no sources listed")
    return out


def open_domain_pool(sources: list[SourceText], rng: random.Random, exclude: set[str] = frozenset()) -> list[str]:
    """All distinct sentences of all sources, each source shuffled, interleaved by weight (deterministic)."""
    queues = []
    for src in sources:
        s = list(src.sentences)
        rng.shuffle(s)
        queues.append([src.weight, 0.0, s, 0])  # weight, credit, sentences, position
    out, seen = [], set(exclude)
    while True:
        live = [q for q in queues if q[3] < len(q[2])]
        if not live:
            return out
        for q in live:
            q[1] += q[0]
        q = max(live, key=lambda q: q[1])  # smooth weighted round-robin; ties go to the earlier source
        q[1] -= sum(x[0] for x in live)
        s = q[2][q[3]]
        q[3] += 1
        if s not in seen:
            seen.add(s)
            out.append(s)
