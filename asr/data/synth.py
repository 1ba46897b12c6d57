"""Build the offline synthetic corpus (``asr-prep synth``): plan, synthesize in parallel, verify, write manifests.

The plan (which sentence, voice and prosody each utterance gets) is a pure function of the seed, the size and the
files under data/, so two runs with the same seed produce byte-identical FLAC files. Splits are disjoint by voice
(data/voices.yaml) and by sentence (every text is spoken once in the whole corpus). A run is resumable: each
finished utterance leaves a record in DIR/.done/<id>.json (its spec hash and FLAC md5); a re-run skips an
utterance whose FLAC still has that md5 and regenerates anything missing, changed or damaged.

The far-field test set (DIR/test_far.jsonl: the test split once through seeded simulated rooms) is a separate
step, ``asr-prep far`` (asr/data/far.py), so a corpus can be rebuilt or extended without re-simulating it.
"""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import DATA_DIR
from ..atomic import atomic_write_text
from ..frontend import SAMPLE_RATE, AudioError, read_audio
from .audio import md5_file, to_mono_16k, write_flac
from .manifest import write_json, write_jsonl
from .pool import parallel_map
from .rejects import Rejection, RejectLog
from .text import CommandGrammar, generate_commands, load_sources, open_domain_pool
from .voices import SPLITS, Voice, load_voices, tool_versions

SIZES = {"tiny": 300, "small": 5000, "full": 30000}
SPLIT_FRACTION = {"dev": 0.1, "test": 0.1}      # train gets the rest
COMMAND_FRACTION = 0.5                           # the rest is open-domain text
MIN_DURATION_S = 0.3
MIN_PEAK = 1e-3
PLAN_VERSION = 1                                 # bump when the planning rules change (invalidates .done records)


@dataclass
class UttSpec:
    id: str
    split: str
    text: str
    domain: str        # "command" or "open"
    engine: str
    voice: str
    params: dict

    @property
    def speaker(self) -> str:
        return f"{self.engine}:{self.voice}"

    @property
    def rel_audio(self) -> str:
        return f"audio/{self.split}/{self.id}.flac"

    def digest(self) -> str:
        blob = json.dumps([PLAN_VERSION, asdict(self)], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def split_counts(total: int) -> dict[str, int]:
    dev = max(1, round(total * SPLIT_FRACTION["dev"]))
    test = max(1, round(total * SPLIT_FRACTION["test"]))
    train = total - dev - test
    if train < 1:
        raise ValueError(f"corpus of {total} utterances is too small for three splits (need at least 3)")
    return {"train": train, "dev": dev, "test": test}


def voice_schedule(voices: list[Voice], n: int) -> list[Voice]:
    """``n`` voices in smooth weighted round-robin order: each voice's share follows its weight, spread evenly
    over the split (with equal weights this is plain rotation through the list)."""
    credit = [0.0] * len(voices)
    total = sum(v.weight for v in voices)
    out = []
    for _ in range(n):
        for k, v in enumerate(voices):
            credit[k] += v.weight
        k = max(range(len(voices)), key=lambda j: credit[j])   # ties: the earlier voice
        credit[k] -= total
        out.append(voices[k])
    return out


def plan_corpus(size: str, seed: int, limit: int | None = None, data_dir: Path = DATA_DIR,
                train: int | None = None):
    """Utterance specs for a corpus, plus what corpus.json should say about the inputs.

    ``train`` sets the number of training utterances and leaves dev and test as ``size`` (and ``limit``) make
    them: held-out sentences are drawn first, so the dev and test sets stay byte-identical and a larger training
    set can be compared with a smaller one on the same test set."""
    total = SIZES[size] if limit is None else min(limit, SIZES[size])
    counts = split_counts(total)
    if train is not None:
        if train < 1:
            raise ValueError(f"--train must be at least 1 utterance, got {train}")
        counts["train"] = train
    voices = load_voices(data_dir)
    for vs in voices.values():
        for v in vs:
            v.check_installed()
    grammar = CommandGrammar.load(data_dir)
    sources = load_sources(data_dir)

    n_cmd = {s: round(n * COMMAND_FRACTION) for s, n in counts.items()}
    n_open = {s: counts[s] - n_cmd[s] for s in SPLITS}
    pool = open_domain_pool(sources, random.Random(f"{seed}:open"))
    need_open = sum(n_open.values())
    if need_open > len(pool):
        raise ValueError(f"open-domain sources give {len(pool)} sentences, {need_open} needed")
    opens = pool[:need_open]
    cmds = generate_commands(sum(n_cmd.values()), random.Random(f"{seed}:commands"), grammar, exclude=set(pool))

    specs: list[UttSpec] = []
    ci = oi = 0
    for split in ("test", "dev", "train"):  # held-out splits first: their sentences do not depend on train's size
        texts = [(t, "command") for t in cmds[ci:ci + n_cmd[split]]] + \
                [(t, "open") for t in opens[oi:oi + n_open[split]]]
        ci += n_cmd[split]
        oi += n_open[split]
        rng = random.Random(f"{seed}:{split}")
        rng.shuffle(texts)
        vs = voices[split]
        offset = rng.randrange(len(vs))
        order = voice_schedule(vs[offset:] + vs[:offset], len(texts))
        for i, (text, domain) in enumerate(texts):
            v = order[i]
            specs.append(UttSpec(f"{split}-{i:06d}", split, text, domain, v.engine, v.name, v.draw_params(rng)))
    specs.sort(key=lambda s: (SPLITS.index(s.split), s.id))

    by_split = {s: {x.text for x in specs if x.split == s} for s in SPLITS}
    assert not (by_split["train"] & by_split["dev"] or by_split["train"] & by_split["test"]
                or by_split["dev"] & by_split["test"]), "a sentence appears in two splits"
    assert len({x.text for x in specs}) == len(specs), "a sentence appears twice"
    info = {"templates_digest": grammar.digest,
            "sources": [{"name": s.name, "debian_packages": s.packages, "sentences": len(s.sentences),
                         "digest": s.digest} for s in sources]}
    return specs, voices, info


# ------------------------------------------------------------------------------------------ one utterance

def _synth_one(job: tuple[dict, str]) -> dict:
    """Synthesize, convert, write and verify one utterance (runs in a worker). Returns a record or a rejection."""
    spec_d, out_dir = job
    spec = UttSpec(**spec_d)
    out = Path(out_dir)
    flac = out / spec.rel_audio
    done = out / ".done" / f"{spec.id}.json"
    digest = spec.digest()
    if flac.is_file() and done.is_file():
        try:
            rec = json.loads(done.read_text())
            if rec.get("spec") == digest and md5_file(flac) == rec.get("md5"):
                return {"ok": True, "skipped": True, **rec}
        except (OSError, ValueError):
            pass  # unreadable record: regenerate
    voice = Voice(spec.engine, spec.voice, spec.split)
    tmp = Path(tempfile.mkdtemp(prefix="asr-synth-"))
    try:
        wav = tmp / "out.wav"
        try:
            voice.synthesize(spec.text, spec.params, wav)
            data, sr = read_audio(wav, strict=True)
        except (RuntimeError, AudioError) as e:
            return {"ok": False, "id": spec.id, "path": str(flac), "detail": f"synthesizer output unusable: {e}"}
        samples = to_mono_16k(data, sr)
        peak = float(np.abs(samples).max())
        if peak > 0.999:  # resampling can overshoot a full-scale input: scale rather than clip
            samples = samples * (0.999 / peak)
        write_flac(flac, samples)
        try:  # verify what is on disk, as an importer would
            check, sr2 = read_audio(flac, strict=True)
        except AudioError as e:
            return {"ok": False, "id": spec.id, "path": str(flac), "detail": f"written FLAC unreadable: {e}"}
        dur = len(check) / sr2
        if sr2 != SAMPLE_RATE or check.shape[1] != 1 or dur < MIN_DURATION_S or peak < MIN_PEAK:
            return {"ok": False, "id": spec.id, "path": str(flac),
                    "detail": f"implausible output: {sr2} Hz, {check.shape[1]} channel(s), {dur:.2f} s, "
                              f"peak {peak:.4f}"}
        rec = {"spec": digest, "md5": md5_file(flac), "duration": round(dur, 4)}
        atomic_write_text(done, json.dumps(rec))
        return {"ok": True, "skipped": False, **rec}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- corpus

def build_corpus(out_dir, size: str = "tiny", seed: int = 0, jobs: int | None = None, limit: int | None = None,
                 strict: bool = False, data_dir: Path = DATA_DIR, train: int | None = None) -> int:
    """Build (or resume) a corpus in out_dir; returns the process exit code."""
    t0 = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs, voices, info = plan_corpus(size, seed, limit, data_dir, train)
    print(f"asr-prep synth: {len(specs)} utterances ({size}, seed {seed}) -> {out}", file=sys.stderr)
    results = parallel_map(_synth_one, [(asdict(s), str(out)) for s in specs], jobs, desc="synth", unit="utt")

    rejects = RejectLog("asr-prep synth")
    manifests: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for spec, res in zip(specs, results):
        if not res["ok"]:
            rejects.add(Rejection(spec.id, res["path"], "synth_failed", res["detail"]))
            continue
        manifests[spec.split].append({"id": spec.id, "audio_filepath": spec.rel_audio, "duration": res["duration"],
                                      "text": spec.text, "speaker": spec.speaker, "md5": res["md5"],
                                      "domain": spec.domain})
    for split, entries in manifests.items():
        write_jsonl(out / f"{split}.jsonl", entries)
    rejects.write(out)

    skipped = sum(1 for r in results if r["ok"] and r["skipped"])
    hours = {s: round(sum(e["duration"] for e in es) / 3600, 4) for s, es in manifests.items()}
    vocab = {s: len({w for e in es for w in e["text"].split()}) for s, es in manifests.items()}
    corpus = {
        "seed": seed, "size": size, "limit": limit, "train": train, "sample_rate": SAMPLE_RATE,
        "audio_filepath": "relative to this folder",
        "counts": {s: len(es) for s, es in manifests.items()},
        "rejected": len(rejects.items),
        "voices": {s: [v.id for v in vs] for s, vs in voices.items()},
        "speakers_used": {s: dict(sorted(Counter(e["speaker"] for e in es).items())) for s, es in manifests.items()},
        "domains": {s: dict(Counter(e["domain"] for e in es)) for s, es in manifests.items()},
        "hours": {**hours, "total": round(sum(hours.values()), 4)},
        "vocab_size": len({w for es in manifests.values() for e in es for w in e["text"].split()}),
        "vocab_size_per_split": vocab,
        "text": info,
        "tools": tool_versions(),
        "test_far": "made by a separate step: asr-prep far --manifest DIR/test.jsonl (asr/data/far.py)",
    }
    write_json(out / "corpus.json", corpus)
    n_ok = sum(len(es) for es in manifests.values())
    print(f"asr-prep synth: {n_ok} utterances ({skipped} already done, skipped), {len(rejects.items)} rejected, "
          f"{corpus['hours']['total']:.2f} h, vocabulary {corpus['vocab_size']} words, "
          f"{time.time() - t0:.1f} s", file=sys.stderr)
    return rejects.exit_code(n_ok, strict)
