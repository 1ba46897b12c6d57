"""A real baseline on the same files (``asr-prep baseline``): pocketsphinx's bundled en-us model, scored with
asr.metrics (jiwer), as asr-eval scores the BFA model.

Hypotheses go through the same normalization as references (numbers as words, no punctuation), and pocketsphinx's
alternate-pronunciation marks ("read(2)") and fillers ("<sil>", "[noise]") are removed first.
"""
from __future__ import annotations

import re
import sys
import time
from collections import defaultdict

import numpy as np

from ..frontend import SAMPLE_RATE, AudioError, read_audio
from ..metrics import ErrorCounts, utterance_errors
from .manifest import audio_path, read_manifest, write_json
from .normalize import normalize
from .pool import parallel_map

_DECODER = None
_MARKUP = re.compile(r"\(\d+\)|<[^>]*>|\[[^\]]*\]")


def _decoder():
    """One decoder per process, its feature state (cepstral mean) reset before every utterance: pocketsphinx
    carries it over from earlier utterances, which would make a hypothesis depend on worker scheduling."""
    global _DECODER
    if _DECODER is None:
        from pocketsphinx import Config, Decoder
        config = Config(samprate=SAMPLE_RATE, loglevel="FATAL")  # bundled en-us acoustic model, LM and dictionary
        _DECODER = Decoder(config)
    _DECODER.reinit_feat()
    return _DECODER


def clean_hypothesis(hyp: str) -> str:
    return normalize(_MARKUP.sub(" ", hyp))


def _decode(path: str) -> str | None:
    try:
        data, sr = read_audio(path, strict=True)
    except AudioError as e:
        print(f"asr-prep baseline: {e}", file=sys.stderr)
        return None
    if sr != SAMPLE_RATE or data.shape[1] != 1:
        print(f"asr-prep baseline: {path}: expected 16 kHz mono, got {sr} Hz", file=sys.stderr)
        return None
    pcm = (np.clip(data[:, 0], -1, 1) * 32767).astype("<i2").tobytes()
    d = _decoder()
    d.start_utt()
    d.process_raw(pcm, no_search=False, full_utt=True)
    d.end_utt()
    hyp = d.hyp()
    return clean_hypothesis(hyp.hypstr if hyp is not None else "")


def _rates(c: ErrorCounts) -> dict:
    return {"utterances": c.sentences, "words": c.ref_words, "wer": round(c.wer * 100, 2),
            "ser": round(c.ser * 100, 2), "substitutions": c.substitutions, "deletions": c.deletions,
            "insertions": c.insertions}


def run_baseline(manifest, json_out=None, jobs: int | None = None, limit: int | None = None) -> dict:
    """Decode every utterance of a manifest; print and return WER / SER (overall and per speaker)."""
    from importlib.metadata import version
    entries = read_manifest(manifest)[:limit]
    t0 = time.time()
    hyps = parallel_map(_decode, [str(audio_path(e, manifest)) for e in entries], jobs, desc="pocketsphinx",
                        unit="utt")
    pairs = [(e, h) for e, h in zip(entries, hyps) if h is not None]
    if not pairs:
        raise RuntimeError(f"{manifest}: no utterance could be decoded")
    refs = [e["text"] for e, _ in pairs]
    hyp_texts = [h for _, h in pairs]
    counts = utterance_errors(refs, hyp_texts)
    result = {"manifest": str(manifest), "decoder": f"pocketsphinx {version('pocketsphinx')} (bundled en-us)",
              "failed": len(entries) - len(pairs), **_rates(sum(counts, ErrorCounts()))}
    by_spk = defaultdict(ErrorCounts)
    for (e, _), c in zip(pairs, counts):
        by_spk[e.get("speaker", "unknown")] += c
    result["per_speaker"] = {s: _rates(c) for s, c in sorted(by_spk.items())}
    result["decode_seconds"] = round(time.time() - t0, 1)
    result["audio_seconds"] = round(sum(e["duration"] for e, _ in pairs), 1)
    result["hypotheses"] = [{"id": e["id"], "ref": e["text"], "hyp": h} for e, h in pairs]
    print(f"asr-prep baseline: {manifest}: WER {result['wer']:.2f}%  SER {result['ser']:.2f}%  "
          f"({result['utterances']} utterances, {result['words']} words, {result['failed']} failed)")
    for s, r in result["per_speaker"].items():
        print(f"  {s:40s} WER {r['wer']:6.2f}%  SER {r['ser']:6.2f}%  ({r['utterances']} utt)")
    if json_out:
        write_json(json_out, result)
    return result
