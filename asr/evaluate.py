"""asr-eval: word and sentence error rates of BFA checkpoints.

    asr-eval --checkpoint exp/run/checkpoints/last.pt --manifest exp/corpus/test.jsonl --json test.json
    asr-eval --run-dir exp/run --manifest exp/corpus/test.jsonl --manifest exp/corpus/test_far.jsonl
    asr-eval --run-dir exp/run --manifest exp/corpus/test.jsonl --watch    # while training runs

With --checkpoint it decodes one checkpoint and prints WER and SER, overall, per speaker and per text domain
(and writes every hypothesis with --json). With --run-dir it evaluates each epoch's checkpoint
(``checkpoints/epochNNN.pt``) on every manifest, caching results in RUN/eval/, and writes RUN/wer_per_epoch.json
and RUN/wer_per_epoch.png; with --watch it keeps going as new checkpoints appear until training writes RUN/DONE.

Without --method it decodes with the checkpoint's decode.method (asr.config.DecodeConfig: joint CTC/attention
beam search, the best measured; attention for a model without a CTC head); --run-dir then also runs the two
cheap greedy decoders (attention, CTC best path) as reference curves.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from .decode import METHODS


def _methods_arg(text: str) -> list[str]:
    """--method: one method, or a comma list of distinct ones (--run-dir)."""
    methods = [m.strip() for m in text.split(",")]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown method {bad[0]!r} (choose from {', '.join(METHODS)})")
    if len(set(methods)) != len(methods):
        raise argparse.ArgumentTypeError(f"{text!r} names a method twice")
    return methods


def _offsets_arg(text: str) -> list[float]:
    """--combine-blank-offsets: comma-separated numbers ("" for none)."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, e.g. 1.5 or 1,2") from None


def _warps_arg(text: str) -> list[float]:
    from .config import TEST_WARP_RANGE
    try:
        warps = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated warp factors, e.g. 0.9,1,1.1, got {text!r}")
    lo, hi = TEST_WARP_RANGE
    if not all(lo <= w <= hi for w in warps):
        raise argparse.ArgumentTypeError(f"warp factors must lie in [{lo}, {hi}], got {text!r}")
    return warps


def _weights_arg(text: str) -> dict:
    """--combine-weights: a JSON object of feature -> weight."""
    from .combine import full_weights
    try:
        weights = json.loads(text)
        if not isinstance(weights, dict):
            raise ValueError("expected a JSON object")
        full_weights(weights)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e} (e.g. '{{\"attention\": 0.3}}')") from None
    return weights


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="asr-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="one checkpoint (.pt) written by asr.train")
    src.add_argument("--run-dir", help="a training run folder: evaluate every epoch's checkpoint")
    p.add_argument("--manifest", action="append", required=True, help="JSONL manifest (repeatable)")
    p.add_argument("--json", action="append",
                   help="--checkpoint: write WER, SER and every hypothesis here; once per --manifest (in their order), "
                        "or once for all (a list)")
    p.add_argument("--method", type=_methods_arg, default=None, metavar="METHOD[,METHOD...]",
                   help="joint: joint CTC/attention beam search with CTC prefix scores inside the search (--ctc-weight; "
                        "optional LM fusion, --lm); attention: the decoder alone (greedy or beam, optional CTC "
                        "rescoring); ctc: best path of the CTC head (no decoder); ctc_beam: CTC prefix beam search with "
                        "optional LM fusion (--lm), the n-best rescored by the attention decoder (--att-weight); "
                        "lexicon: the phone CTC head's posteriors searched over the words of a pronunciation lexicon "
                        "with a word n-gram LM (--ngram; a model trained with model.phone_ctc_weight > 0); "
                        "combine: the lexicon decoder's n-best and the joint search's (with --lm) pooled, each "
                        "candidate scored by every model (phone CTC, word-piece CTC and attention, --lm, --ngram) "
                        "and the best picked with --combine-weights (chosen on dev with --tune-on). "
                        "Default: the checkpoint's decode.method (joint; attention without a CTC head). Per-epoch "
                        "results of each method are kept apart (NAME, NAME.ctc, NAME.joint, NAME.joint_lm, ...). "
                        "--run-dir takes a list, e.g. lexicon,ctc: every method reads one encoding per utterance "
                        "and epoch (the first leads the summary and the plot)")
    # Every decoding default is the checkpoint's config decode section (asr.config.DecodeConfig).
    p.add_argument("--beam", type=int, help="beam size (default: decode.beam, 1 = greedy; ctc_beam: decode.prefix_beam; "
                                            "joint: decode.joint_beam)")
    p.add_argument("--ctc-weight", type=float,
                   help="attention: CTC rescoring weight (default: decode.ctc_weight); joint: CTC's weight in the search, "
                        "0 = attention only, 1 = CTC only (default: decode.joint_ctc_weight, with --lm "
                        "decode.joint_ctc_weight_lm)")
    p.add_argument("--lm", help="ctc_beam, joint: language model from asr-lm (OUT/lm.pt) for shallow fusion")
    p.add_argument("--lm-weight", type=float, help="LM weight (default: decode.lm_weight; joint: decode.joint_lm_weight; "
                                                   "lexicon: the n-gram's weight, decode.lexicon_lm_weight)")
    p.add_argument("--ngram", help="lexicon: word n-gram LM from asr-prep ngram (default: decode.ngram; none: the "
                                   "lexicon alone)")
    p.add_argument("--lexicon", help="lexicon: the asr-prep lexicon folder (default: the model's data.lexicon)")
    p.add_argument("--word-score", type=float, help="lexicon: score added per word (default: decode.word_score)")
    p.add_argument("--blank-penalty", type=float, help="lexicon: taken off the blank's log-probability in every "
                                                       "frame, against deleted words (default: "
                                                       "decode.lexicon_blank_penalty)")
    p.add_argument("--combine-weights", type=_weights_arg, metavar="JSON",
                   help="combine: the features' weights, e.g. '{\"attention\": 0.3, \"words\": 1}' (the rest: "
                        "asr.combine.START, the lexicon decoder's own trade-off; default: decode.combine_weights)")
    p.add_argument("--dereverb", choices=("off", "wpe"), default=None,
                   help="wpe: late reverberation removed from every utterance before its features (single-channel "
                        "WPE, nara_wpe; about 0.4 s per utterance, kept in the feature cache next to each manifest). "
                        "Default: decode.dereverb (cpu-small: wpe)")
    p.add_argument("--warps", type=_warps_arg, metavar="W[,W...]",
                   help="test-time VTLP warps, e.g. 0.9,0.95,1,1.05,1.1: each utterance encoded at each warp and the "
                        "encoder outputs averaged before every head and the attention decoder ('' for none; "
                        "default: decode.warps)")
    p.add_argument("--combine-blank-offsets", type=_offsets_arg, metavar="X[,Y]",
                   help="combine: the lexicon decoder searches again at its blank penalty + each of these, and "
                        "their n-best join the candidates ('' for none; default: decode.combine_blank_offsets)")
    p.add_argument("--length-bonus", type=float,
                   help="score added per piece, against the LM's pull towards short hypotheses (default with --lm: "
                        "decode.length_bonus, joint: decode.joint_length_bonus; 0 without)")
    p.add_argument("--att-weight", type=float,
                   help="ctc_beam: attention weight when rescoring the n-best (0: CTC and LM only; default: "
                        "decode.att_weight)")
    p.add_argument("--max-ratio", type=float,
                   help="joint: at most this many pieces per encoder frame (default: decode.max_ratio, 1.0)")
    p.add_argument("--limit", type=int, default=0, help="decode only the first N utterances of each manifest")
    p.add_argument("--watch", action="store_true", help="--run-dir: wait for new checkpoints until RUN/DONE")
    p.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1), help="torch threads")
    p.add_argument("--jobs", type=int, default=1,
                   help="decode this many at once, each in its own process with one thread (a beam search is a chain "
                        "of small steps: processes use the cores, threads do not): --run-dir's epoch checkpoints, "
                        "--tune-on's settings, and the manifests")
    p.add_argument("--tune-on", metavar="DEV.jsonl",
                   help="--checkpoint, --method joint: first choose the CTC weight and (with --lm) the LM weight and "
                        "length bonus by WER on this manifest (a dev set, never a test set), then decode with them; "
                        "--method lexicon: the n-gram's weight and the word score, then the blank penalty, then the "
                        "n-best rescoring weight; --method combine: the joint search's settings, then the weights "
                        "of the pooled candidates' features (coordinate descent on dev's word errors; "
                        "--tune-limit 500 recommended). A flag given explicitly (--ctc-weight, --lm-weight, --length-bonus, "
                        "--word-score, --blank-penalty, --att-weight) "
                        "is kept, not tuned; the grid is the checkpoint's decode.tune_* (see asr.config.DecodeConfig)")
    p.add_argument("--tune-limit", type=int, default=100, help="--tune-on: its first N utterances (default 100)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.jobs > 1 and args.watch:
        p.error("--jobs decodes the checkpoints that exist; --watch waits for new ones: use one or the other")
    if args.json and len(args.json) not in (1, len(args.manifest)):
        p.error(f"--json: give it once, or once per --manifest ({len(args.manifest)}), not {len(args.json)} times")
    if args.tune_on and not args.checkpoint:
        p.error("--tune-on tunes the decoding of one --checkpoint")
    args.methods = args.method
    if args.methods and len(args.methods) > 1 and not args.run_dir:
        p.error(f"--method {','.join(args.methods)}: more than one method is for --run-dir (a checkpoint's result "
                "files hold one method each)")
    args.method = args.methods[0] if args.methods else None
    return args




def load_checkpoint(path):
    """(model, tokenizer, normalizer, TrainingCheckpoint) of a checkpoint written by asr.train; errors name the file."""
    from .checkpoint import CheckpointError, TrainingCheckpoint
    from .loader import Normalizer, Tokenizer
    from .models.bfa import BFA, BFAConfig
    from .train_lm import tokenizer_digest
    try:
        ckpt = TrainingCheckpoint.load(path)
    except CheckpointError as e:
        raise SystemExit(f"asr-eval: {e}")
    model = BFA(BFAConfig(**ckpt.model_config))
    model.load_state_dict(ckpt.model)
    model.eval()
    if ckpt.tokenizer_digest and Path(ckpt.tokenizer).exists() and tokenizer_digest(ckpt.tokenizer) != ckpt.tokenizer_digest:
        raise SystemExit(f"asr-eval: {path}: the tokenizer {ckpt.tokenizer} changed since this model was trained "
                         f"(digest {tokenizer_digest(ckpt.tokenizer)}, trained with {ckpt.tokenizer_digest})")
    cmvn = ckpt.config.get("data", {}).get("cmvn", "global")   # older checkpoints: global
    try:   # the features the run asked for (older checkpoints: none) must be the statistics file's
        norm = Normalizer(ckpt.stats, cmvn, expect=ckpt.config.get("features"))
    except ValueError as e:
        raise SystemExit(f"asr-eval: {path}: {e}")
    return model, Tokenizer(ckpt.tokenizer), norm, ckpt


def evaluate(model, tok, norm, manifest, beam: int = 1, ctc_weight: float = 0.0, limit: int = 0,
             batch_seconds: float = 120.0, desc: str = "", method: str = "attention", lm=None,
             lm_weight: float = 0.0, length_bonus: float = 0.0, att_weight: float = 0.0, max_ratio: float = 1.0,
             lexicon=None, ngram=None, word_score: float = 0.0, lexicon_nbest: int = 10,
             blank_penalty: float = 0.0, combine: dict | None = None, shard: tuple[int, int] = (0, 1),
             dereverb: str = "off", warps=()) -> dict:
    """Decode a manifest; return WER, SER (overall, ``per_speaker`` and, when the manifest's entries carry a
    ``domain``, ``per_domain``; a far-field set's ``per_t60_band`` and ``per_snr_band``), the decoding time and every
    (id, ref, hyp).

    An utterance whose audio cannot be read (see asr.loader.SkippedItem) is counted as an error: its row has an
    empty hypothesis and a ``skipped`` reason, so WER and SER keep the manifest's full denominator; the result
    also lists them under ``skipped`` and counts them in ``skipped_utterances``.

    ``method="lexicon"``: the phone head through a :class:`asr.decode.LexiconDecoder` over the ``lexicon`` folder and
    the ``ngram`` LM (``lm_weight``, ``word_score``, ``blank_penalty``; ``beam`` is its beam), its ``lexicon_nbest``
    best rescored by the word-piece heads at ``att_weight`` (0: the best alone).

    ``method="combine"``: the joint search (``beam``, ``ctc_weight``, ``lm``/``lm_weight``, ``length_bonus``,
    ``max_ratio``) and the lexicon decoder (``lexicon``, ``ngram``, ``word_score``, ``blank_penalty``; its beam,
    n-gram weight, n-best and extra blank penalties in ``combine``: ``{"beam", "lm_weight", "nbest",
    "blank_offsets", "weights"}``) pooled and reranked
    with ``combine["weights"]`` (:mod:`asr.combine`; ``lm`` also scores every candidate).

    ``shard`` = (i, n): only the i-th of every n length-sorted batches (the rows of n shards make the whole set).

    ``dereverb`` (asr.frontend.dereverb): "wpe" removes late reverberation before the features; the result is kept
    in the feature cache next to the manifest (``feature_cache/``), plain features are computed as they are read.

    ``warps``: test-time VTLP warps whose encoder outputs are averaged (asr.decode.encode; the spectrograms go
    through the feature cache)."""
    from .decode import decode_manifest
    from .loader import SpeechDataset
    from .metrics import ErrorCounts, utterance_errors
    warps = [float(w) for w in warps or ()]
    ds = SpeechDataset(manifest, tok, norm, feature_cache="auto" if dereverb != "off" or warps else None,
                       dereverb=dereverb, warps=warps)
    if limit:
        ds.entries = ds.entries[:limit]
    needs_ctc = method in ("ctc", "ctc_beam") or method == "joint" and ctc_weight > 0
    if needs_ctc and model.ctc_head is None:
        hint = " (or --ctc-weight 0: attention only)" if method == "joint" else ""
        raise SystemExit(f"asr-eval: --method {method} needs a model trained with a CTC head (model.ctc_weight > 0){hint}")
    if method in ("ctc", "ctc_beam"):
        beam, ctc_weight = (1 if method == "ctc" else beam), 0.0
    lexicon_decoder = None
    if method == "lexicon":
        if model.phone_head is None:
            raise SystemExit("asr-eval: --method lexicon needs a model trained with a phone CTC head "
                             "(model.phone_ctc_weight > 0)")
        if not lexicon:
            raise SystemExit("asr-eval: --method lexicon needs --lexicon (the model's config names no data.lexicon)")
        lexicon_decoder = _lexicon_decoder(lexicon, ngram, lm_weight, word_score, beam, model.config.phone_vocab,
                                           lexicon_nbest if att_weight > 0 else 1, blank_penalty)
        ctc_weight, length_bonus = 0.0, 0.0
    combiner = None
    if method == "combine":
        if model.phone_head is None or model.ctc_head is None:
            raise SystemExit("asr-eval: --method combine needs a model trained with a phone CTC head and a word-piece "
                             "CTC head (model.phone_ctc_weight > 0, model.ctc_weight > 0)")
        if not lexicon:
            raise SystemExit("asr-eval: --method combine needs --lexicon (the model's config names no data.lexicon)")
        combine = {**_combine_defaults(), **(combine or {})}
        combiner = _combiner(lexicon, ngram, model.config.phone_vocab, combine, word_score, blank_penalty, lm,
                             {"beam": beam, "ctc_weight": ctc_weight, "lm_weight": lm_weight if lm is not None else 0.0,
                              "length_bonus": length_bonus, "max_ratio": max_ratio})
    t0 = time.perf_counter()
    rows = decode_manifest(model, tok, ds, (method,), beam=beam, ctc_weight=ctc_weight, lm=lm, lm_weight=lm_weight,
                           length_bonus=length_bonus, att_weight=att_weight, max_ratio=max_ratio,
                           batch_seconds=batch_seconds, progress=desc or Path(manifest).name,
                           lexicon_decoder=lexicon_decoder, combiner=combiner, shard=tuple(shard), memo=True)[method]
    seconds = time.perf_counter() - t0
    skipped = [(r["id"], r["skipped"]) for r in rows if "skipped" in r]
    counts = utterance_errors([r["ref"] for r in rows], [r["hyp"] for r in rows])
    total = sum(counts, ErrorCounts())
    res = {"manifest": str(manifest), "utterances": len(rows), "wer": total.wer, "ser": total.ser,
           "skipped_utterances": len(skipped), "skipped": [{"id": i, "reason": why} for i, why in skipped],
           "substitutions": total.substitutions, "deletions": total.deletions, "insertions": total.insertions,
           "ref_words": total.ref_words,
           "per_speaker": _breakdown(ds.entries, rows, counts, "speaker")}
    if any("domain" in e for e in ds.entries):          # older manifests have no domain: no breakdown
        res["per_domain"] = _breakdown(ds.entries, rows, counts, "domain")
    for key in BAND_FIELDS:                             # far-field sets: WER per reverberation and noise band
        if any(key in e for e in ds.entries):
            res[f"per_{key}"] = _breakdown(ds.entries, rows, counts, key)
    extra = {"lexicon": str(lexicon), "ngram": str(ngram) if ngram else None, "word_score": word_score,
             "blank_penalty": blank_penalty} if method in ("lexicon", "combine") else {}
    if method == "lexicon":
        extra["lexicon_nbest"] = lexicon_nbest if att_weight > 0 else 1
    if method == "combine":
        picked = [next(c["from"] for c in r["candidates"] if c["hyp"] == r["hyp"]) for r in rows if r.get("candidates")]
        from .combine import sources
        extra.update(combine=combine, picked_from={src: picked.count(src)
                                                   for src in sources(combine.get("blank_offsets") or ())})
    return {**res, "method": method, "dereverb": dereverb, "warps": warps, "beam": beam, "ctc_weight": ctc_weight,
            "lm_weight": lm_weight if lm is not None or (method == "lexicon" and ngram) else 0.0, **extra,
            "length_bonus": length_bonus, "att_weight": att_weight, "max_ratio": max_ratio,
            "decode_seconds": round(seconds, 3), "seconds_per_utterance": round(seconds / max(len(rows), 1), 5),
            "hypotheses": rows}


_LEXICON_DECODERS: dict = {}


def _lexicon_decoder(lexicon, ngram, lm_weight, word_score, beam, phone_vocab, nbest, blank_penalty=0.0):
    """A LexiconDecoder, built once per process and setting (building one reads the LM and the lexicon's trie)."""
    from .data.lexicon import LexiconError
    from .decode import LexiconDecoder
    key = (str(lexicon), str(ngram), lm_weight, word_score, beam, phone_vocab, nbest, blank_penalty)
    if key not in _LEXICON_DECODERS:
        try:
            _LEXICON_DECODERS[key] = LexiconDecoder(lexicon, ngram, lm_weight, word_score, beam,
                                                    phone_vocab, nbest, blank_penalty)
        except (LexiconError, FileNotFoundError) as e:
            raise SystemExit(f"asr-eval: {e}")
    return _LEXICON_DECODERS[key]


def _combine_defaults(dec=None) -> dict:
    """--method combine's lexicon-side settings: the lexicon decoder's beam, n-gram weight, n-best size and extra
    blank penalties from decode (asr.config.DecodeConfig; its defaults when None), and the features' weights."""
    from .config import DecodeConfig
    dec = dec or DecodeConfig()
    return {"beam": dec.lexicon_beam, "lm_weight": dec.lexicon_lm_weight, "nbest": dec.lexicon_nbest,
            "blank_offsets": list(dec.combine_blank_offsets), "weights": dec.combine_weights or None}


_SCORERS: dict = {}


def _combiner(lexicon, ngram, phone_vocab, combine: dict, word_score, blank_penalty, lm, joint: dict):
    """An asr.combine.Combiner; its lexicon decoder, speller and n-gram scorer built once per process."""
    from .combine import Combiner, NgramScorer, Speller, full_weights
    from .data.lexicon import Lexicon, LexiconError
    dec = _lexicon_decoder(lexicon, ngram, combine["lm_weight"] if ngram else 0.0, word_score, combine["beam"],
                           phone_vocab, combine["nbest"], blank_penalty)
    key = (str(lexicon), str(ngram))
    if key not in _SCORERS:
        try:
            lex = Lexicon(lexicon)
        except LexiconError as e:
            raise SystemExit(f"asr-eval: {e}")
        _SCORERS[key] = (Speller(lex), NgramScorer(ngram, lex.words) if ngram else None)
    speller, ngram_scorer = _SCORERS[key]
    try:
        weights = full_weights(combine.get("weights"))
    except ValueError as e:
        raise SystemExit(f"asr-eval: {e}")
    return Combiner(dec, speller, ngram_scorer, joint, lm, weights, tuple(combine.get("blank_offsets") or ()))


def _breakdown(entries, rows, counts, key: str) -> dict:
    """WER and SER per value of a manifest field (entries without it: "unknown"), from the rows' error counts."""
    from .metrics import ErrorCounts
    value_of = {e["id"]: str(e.get(key, "unknown")) for e in entries}
    groups: dict = {}
    for r, c in zip(rows, counts):
        value = value_of.get(r["id"], "unknown")
        groups[value] = groups.get(value, ErrorCounts()) + c
    order = _band_order if key in BAND_FIELDS else str
    return {v: {"utterances": c.sentences, "ref_words": c.ref_words, "wer": c.wer, "ser": c.ser}
            for v, c in sorted(groups.items(), key=lambda kv: order(kv[0]))}


BAND_FIELDS = ("t60_band", "snr_band")     # the far-field set's conditions (asr.data.far), when the rows carry them


def _band_order(label: str) -> tuple:
    """Bands ("<10 dB", "10-20 dB", ">=20 dB", "no noise", "unknown") in numeric order."""
    m = re.match(r"(<|>=)?(-?[\d.]+)", label)
    if not m:
        return (1, 0.0, label)
    return (0, float(m.group(2)) - (1e-9 if m.group(1) == "<" else 0.0), label)


def _decode_config(ckpt):
    """The checkpoint's decode section as asr.config.DecodeConfig (its defaults for fields written before they
    existed; keys it no longer knows are ignored)."""
    import dataclasses
    from .config import ConfigError, DecodeConfig
    known = {f.name for f in dataclasses.fields(DecodeConfig)}
    try:
        return DecodeConfig(**{k: v for k, v in ckpt.config.get("decode", {}).items() if k in known})
    except ConfigError as e:
        raise SystemExit(f"asr-eval: the checkpoint's config: {e}")


def _method(args, ckpt) -> str:
    """--method, else the checkpoint's decode.method; a default that needs a CTC head falls back to attention
    on a model without one (an explicit --method is refused by evaluate() instead)."""
    if args.method:
        return args.method
    method = _decode_config(ckpt).method
    if method == "lexicon" and not ckpt.model_config.get("phone_ctc_weight", 0) > 0:
        method = "joint"
    if method in ("ctc", "ctc_beam", "joint") and not ckpt.model_config.get("ctc_weight", 0) > 0:
        return "attention"
    return method


def _decode_opts(args, ckpt, lm=None, method: str | None = None) -> dict:
    """evaluate()'s decoding keywords for ``method``: the command line first, then the checkpoint's decode config
    (whose defaults are asr.config.DecodeConfig's, also for checkpoints written before a field existed)."""
    dec = _decode_config(ckpt)
    method = method or _method(args, ckpt)
    pick = lambda flag, default: flag if flag is not None else default
    opts = {"beam": pick(args.beam, dec.beam), "ctc_weight": pick(args.ctc_weight, dec.ctc_weight), "method": method,
            "dereverb": pick(getattr(args, "dereverb", None), dec.dereverb),
            "warps": list(pick(getattr(args, "warps", None), dec.warps))}
    if method == "ctc_beam":
        opts.update(beam=pick(args.beam, dec.prefix_beam), lm=lm, att_weight=pick(args.att_weight, dec.att_weight),
                    lm_weight=pick(args.lm_weight, dec.lm_weight) if lm is not None else 0.0,
                    length_bonus=pick(args.length_bonus, dec.length_bonus if lm is not None else 0.0))
    elif method in ("joint", "combine"):
        opts.update(beam=pick(args.beam, dec.joint_beam), lm=lm,
                    ctc_weight=pick(args.ctc_weight, dec.joint_ctc_weight_lm if lm is not None else dec.joint_ctc_weight),
                    lm_weight=pick(args.lm_weight, dec.joint_lm_weight) if lm is not None else 0.0,
                    length_bonus=pick(args.length_bonus, dec.joint_length_bonus if lm is not None else 0.0),
                    max_ratio=pick(args.max_ratio, dec.max_ratio))
    if method in ("lexicon", "combine"):      # the lexicon decoder's words, n-gram and per-frame settings
        ngram = args.ngram or dec.ngram or None
        opts.update(lexicon=args.lexicon or ckpt.config.get("data", {}).get("lexicon") or None, ngram=ngram,
                    word_score=pick(args.word_score, dec.word_score),
                    blank_penalty=pick(args.blank_penalty, dec.lexicon_blank_penalty))
    if method == "lexicon":
        opts.update(beam=pick(args.beam, dec.lexicon_beam), ctc_weight=0.0,
                    lm_weight=pick(args.lm_weight, dec.lexicon_lm_weight) if ngram else 0.0,
                    att_weight=pick(args.att_weight, dec.lexicon_rescore_weight), lexicon_nbest=dec.lexicon_nbest)
    if method == "combine":      # the joint search's settings above; the lexicon decoder's n-best at its defaults
        opts["combine"] = _combine_defaults(dec)
        if args.combine_weights is not None:
            opts["combine"]["weights"] = args.combine_weights
        if args.combine_blank_offsets is not None:
            opts["combine"]["blank_offsets"] = args.combine_blank_offsets
    return opts


def _load_lm(args, ckpt_path, ckpt):
    """The --lm model, refused with a clear message if it was trained on another tokenizer than the checkpoint."""
    if not args.lm:
        return None
    from .models.rnnlm import load_lm
    from .train_lm import tokenizer_digest
    try:
        lm, meta = load_lm(args.lm)
    except ValueError as e:
        raise SystemExit(f"asr-eval: --lm {e}")
    tok_path = Path(ckpt.tokenizer)
    if tok_path.exists() and meta.get("tokenizer_digest") and tokenizer_digest(tok_path) != meta["tokenizer_digest"]:
        raise SystemExit(f"asr-eval: --lm {args.lm} was trained with tokenizer {meta.get('tokenizer')}, "
                         f"but {ckpt_path} uses {tok_path} (a different model): retrain the LM with asr-lm --tokenizer "
                         f"{tok_path}")
    if lm.config.vocab_size != ckpt.model_config["vocab_size"]:
        raise SystemExit(f"asr-eval: --lm {args.lm} has {lm.config.vocab_size} pieces, {ckpt_path} "
                         f"{ckpt.model_config['vocab_size']}")
    return lm


def _skip_note(res: dict) -> str:
    n = res.get("skipped_utterances", 0)
    return f"  [{n} unreadable utterance(s) skipped, counted as errors]" if n else ""


def _run_dir_methods(args, ckpt) -> list[str]:
    """--method alone, or the default method followed by the cheap greedy references (attention, CTC best path)."""
    if args.methods:
        return list(args.methods)
    methods = [_method(args, ckpt), "attention"] + (["ctc"] if ckpt.model_config.get("ctc_weight", 0) > 0 else [])
    return list(dict.fromkeys(methods))


_LOADED: dict = {}


def _loaded(checkpoint: str, lm_path: str | None):
    """(model, tok, norm, ckpt, lm) of a checkpoint and an LM, loaded once per process."""
    key = (str(checkpoint), str(lm_path))
    if key not in _LOADED:
        model, tok, norm, ckpt = load_checkpoint(checkpoint)
        lm = None
        if lm_path:
            from .models.rnnlm import load_lm
            lm = load_lm(lm_path)[0]
        _LOADED[key] = (model, tok, norm, ckpt, lm)
    return _LOADED[key]


def _decode_job(job) -> dict:
    """Decode one manifest with one setting: ``job`` = (checkpoint, LM path or None, manifest, limit, opts without
    the LM object); the LM is used only when opts' lm_weight is positive."""
    checkpoint, lm_path, manifest, limit, opts = job
    model, tok, norm, _, lm = _loaded(checkpoint, lm_path)
    use_lm = lm if opts.get("lm_weight", 0) > 0 or opts.get("method") == "combine" else None
    return evaluate(model, tok, norm, manifest, limit=limit, lm=use_lm, **opts)


def _pool_init() -> None:
    torch.set_num_threads(1)


_SHARED_POOL: tuple | None = None      # (n, pool) while shared_pool(n) is open


@contextmanager
def shared_pool(n: int):
    """Every ``_map(..., n)`` inside runs in one pool of ``n`` spawned single-thread processes, not a new pool per
    call, so the models they loaded and the encodings they memoized (asr.decode) serve every call: tuning decodes
    the same dev utterances at one setting after another."""
    global _SHARED_POOL
    if n <= 1:
        yield
        return
    import multiprocessing as mp
    pool = mp.get_context("spawn").Pool(n, initializer=_pool_init)
    _SHARED_POOL = (n, pool)
    try:
        yield
    finally:
        _SHARED_POOL = None
        _finish(pool)


def _map(fn, jobs: list, n: int) -> list:
    """``[fn(j) for j in jobs]``, in ``n`` single-thread spawned processes when n > 1 (same results, same order);
    in the pool of an open :func:`shared_pool` of the same size if there is one."""
    if n <= 1 or len(jobs) <= 1:
        return [fn(j) for j in jobs]
    if _SHARED_POOL is not None and _SHARED_POOL[0] == n:
        return _SHARED_POOL[1].map(fn, jobs, chunksize=1)
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(min(n, len(jobs)), initializer=_pool_init) as pool:
        out = pool.map(fn, jobs, chunksize=1)
        _finish(pool)
    return out


def _finish(pool) -> None:
    """Let a pool's workers exit by themselves (``with Pool`` alone terminates them, and terminated workers leave
    their semaphores to the resource tracker, which then warns about "leaked semaphore objects" at exit)."""
    pool.close()
    pool.join()


def _tune_rows(args, lm_path, base: dict, settings: list[dict]) -> list[dict]:
    """Each setting decoded on ``args.tune_on`` (``args.jobs`` at once): the setting with its WER, SER and
    per-domain WER, in the settings' order."""
    jobs = [(args.checkpoint, lm_path, args.tune_on, args.tune_limit, {**base, **st}) for st in settings]
    return [{**st, "wer": r["wer"], "ser": r["ser"], "utterances": r["utterances"],
             **({"per_domain": {d: x["wer"] for d, x in r["per_domain"].items()}} if "per_domain" in r else {})}
            for st, r in zip(settings, _map(_decode_job, jobs, args.jobs))]


def tune(args, ckpt, base: dict) -> dict:
    """Choose the joint search's CTC weight, LM weight and length bonus by WER on ``args.tune_on`` (first
    ``args.tune_limit`` utterances): the CTC weight without the LM first (decode.tune_ctc_weights), then, with
    --lm, LM weight x length bonus at that CTC weight; the lowest WER wins (ties: the earlier, simpler setting),
    so the LM is used only where it helps on dev. Flags given explicitly stay fixed. Returns the record kept in
    the result: the chosen setting and every row of the grid."""
    dec = _decode_config(ckpt)
    if base["method"] == "lexicon":
        return _tune_lexicon(args, dec, base)
    if base["method"] == "combine":
        return _tune_combination(args, ckpt, base)
    cws = [args.ctc_weight] if args.ctc_weight is not None else list(dec.tune_ctc_weights)
    lws = [args.lm_weight] if args.lm_weight is not None else list(dec.tune_lm_weights)
    lbs = [args.length_bonus] if args.length_bonus is not None else list(dec.tune_length_bonuses)
    lm_path = args.lm

    def run(settings):
        return _tune_rows(args, lm_path, base, settings)

    rows = run([{"ctc_weight": c, "lm_weight": 0.0, "length_bonus": 0.0} for c in cws])
    if lm_path and any(w > 0 for w in lws):
        best_c = min(rows, key=lambda r: r["wer"])["ctc_weight"]
        rows += run([{"ctc_weight": best_c, "lm_weight": w, "length_bonus": b} for w in lws if w > 0 for b in lbs])
    chosen = min(rows, key=lambda r: r["wer"])        # min() keeps the first of equals: the order above
    pick = {k: chosen[k] for k in ("ctc_weight", "lm_weight", "length_bonus")}
    lm_note = (f", LM weight {pick['lm_weight']:g}, length bonus {pick['length_bonus']:g}" if pick["lm_weight"] > 0
               else (", no LM (it did not help on dev)" if lm_path else ""))
    print(f"[asr-eval] tuned on {Path(args.tune_on).name} ({chosen['utterances']} utterances, {len(rows)} settings): "
          f"CTC weight {pick['ctc_weight']:g}{lm_note}: dev WER {100 * chosen['wer']:.2f}%", flush=True)
    return {"manifest": str(args.tune_on), "utterances": chosen["utterances"], "chosen": pick, "grid": rows}


def _tune_combination(args, ckpt, base: dict) -> dict:
    """--method combine: the joint search's settings first (as for --method joint, unless --ctc-weight,
    --length-bonus and, with --lm, --lm-weight are all given), then the candidates of
    ``args.tune_on`` decoded once with them and the features' weights chosen on their word errors
    (:func:`asr.combine.tune`, from --combine-weights or decode.combine_weights, and from the joint search's own
    trade-off; the better on dev wins)."""
    from .combine import full_weights, joint_start
    from .combine import tune as tune_weights
    joint_keys = ("beam", "ctc_weight", "length_bonus", "max_ratio", "lm_weight")
    fixed = (args.ctc_weight, args.length_bonus) + ((args.lm_weight,) if args.lm else ())
    if None in fixed:
        joint = tune(args, ckpt, {"method": "joint", **{k: base[k] for k in joint_keys}})
    else:     # every joint setting given (run.sh passes those its joint decode chose): nothing to tune there
        joint = {"chosen": {k: base[k] for k in ("ctc_weight", "lm_weight", "length_bonus")}, "grid": []}
    opts = {**base, **joint["chosen"]}
    n = args.jobs            # dev decoded once, its batches dealt to --jobs processes
    shards = _map(_decode_job, [(args.checkpoint, args.lm, args.tune_on, args.tune_limit, {**opts, "shard": (i, n)})
                                for i in range(n)], n)
    rows = [r for res in shards for r in res["hypotheses"] if r.get("candidates")]
    c = joint["chosen"]
    weights = tune_weights([r["ref"] for r in rows], [r["candidates"] for r in rows],
                           starts=[full_weights(base["combine"].get("weights")),
                                   joint_start(c["ctc_weight"], c["lm_weight"], c["length_bonus"])])
    words = max(weights["ref_words"], 1)
    print(f"[asr-eval] combination tuned on {Path(args.tune_on).name} ({len(rows)} utterances, "
          f"{sum(len(r['candidates']) for r in rows) / max(len(rows), 1):.1f} candidates each): dev WER "
          f"{100 * weights['start_errors'] / words:.2f}% at the start weights, {100 * weights['errors'] / words:.2f}% "
          f"tuned (oracle {100 * weights['oracle_errors'] / words:.2f}%); weights "
          + ", ".join(f"{k} {v:g}" for k, v in weights["chosen"].items()), flush=True)
    return {"manifest": str(args.tune_on), "utterances": len(rows),
            "chosen": {**joint["chosen"], "combine": {**base["combine"], "weights": weights["chosen"]}},
            "joint_grid": joint["grid"], "combination": weights}


def _tune_lexicon(args, dec, base: dict) -> dict:
    """--method lexicon, one setting at a time by WER on ``args.tune_on``: the n-gram's weight x the word score
    (decode.tune_ngram_weights x decode.tune_word_scores, blank penalty 0), then at the best of them the blank penalty
    (decode.tune_blank_penalties), then the n-best rescoring weight (decode.tune_rescore_weights; 0 = not rescored),
    then the word score and the blank penalty once more. A flag given explicitly stays fixed; the lowest WER wins
    (ties: the earlier, simpler setting)."""
    lws = [args.lm_weight] if args.lm_weight is not None else list(dec.tune_ngram_weights)
    wss = [args.word_score] if args.word_score is not None else list(dec.tune_word_scores)
    bps = [args.blank_penalty] if args.blank_penalty is not None else list(dec.tune_blank_penalties)
    aws = [args.att_weight] if args.att_weight is not None else list(dec.tune_rescore_weights)

    def run(settings):
        return _tune_rows(args, None, base, settings)

    # the later settings start at their flag, else at 0 (no penalty, not rescored), and are then tried in turn
    later = {"blank_penalty": (bps, bps[0] if args.blank_penalty is not None else 0.0),
             "att_weight": (aws, aws[0] if args.att_weight is not None else 0.0)}
    rows = run([{"lm_weight": w, "word_score": ws, **{k: first for k, (_, first) in later.items()}}
                for w in (lws if base.get("ngram") else [0.0]) for ws in wss])
    for key, (grid, first) in later.items():
        best = min(rows, key=lambda r: r["wer"])
        rows += run([{**_lexicon_setting(best), key: v} for v in grid if v != first])
    # The word score and the blank penalty both trade deletions against insertions, so the word score that was best
    # without a penalty need not be best with one: a second pass over both (settings already decoded are skipped).
    for key, grid in (("word_score", wss), ("blank_penalty", bps)):
        best = _lexicon_setting(min(rows, key=lambda r: r["wer"]))
        tried = [_lexicon_setting(r) for r in rows]
        rows += run([s for s in ({**best, key: v} for v in grid) if s not in tried])
    chosen = min(rows, key=lambda r: r["wer"])
    pick = _lexicon_setting(chosen)
    print(f"[asr-eval] tuned on {Path(args.tune_on).name} ({chosen['utterances']} utterances, {len(rows)} settings): "
          f"n-gram weight {pick['lm_weight']:g}, word score {pick['word_score']:g}, blank penalty "
          f"{pick['blank_penalty']:g}, rescoring weight {pick['att_weight']:g}: dev WER {100 * chosen['wer']:.2f}%",
          flush=True)
    return {"manifest": str(args.tune_on), "utterances": chosen["utterances"], "chosen": pick, "grid": rows}


def _lexicon_setting(row: dict) -> dict:
    """The lexicon decoder's tuned keys of a grid row."""
    return {k: row[k] for k in ("lm_weight", "word_score", "blank_penalty", "att_weight")}


def _epoch_of(ck: Path) -> int:
    return int(re.findall(r"\d+", ck.stem)[0])


def _decode_epoch(args, ck: Path, methods: list[str]) -> int:
    """Decode one epoch checkpoint with every method on every manifest not yet in RUN/eval/ (each result written
    atomically, so a stopped run keeps what it finished); returns the epoch. The methods of one manifest follow one
    another, so they read the encodings the first one made (asr.decode's memo keeps one set's)."""
    cache, epoch, loaded, lm = Path(args.run_dir) / "eval", _epoch_of(ck), None, None
    for m in args.manifest:
        for method in methods:
            name = _name(m, _label(method, args.lm))
            dest = cache / f"{name}.epoch{epoch:03d}.json"
            if dest.exists() and _same_front_end(dest, args):
                continue
            if loaded is None:
                loaded = load_checkpoint(ck)
                lm = _load_lm(args, ck, loaded[3])
            model, tok, norm, ckpt = loaded
            res = evaluate(model, tok, norm, m, limit=args.limit, desc=f"epoch {epoch} {name}",
                           **_decode_opts(args, ckpt, lm, method))
            res["epoch"] = epoch
            tmp = dest.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(res, indent=1))
            os.replace(tmp, dest)
            print(f"[asr-eval] epoch {epoch} {name}: WER {100 * res['wer']:.2f}%  SER {100 * res['ser']:.2f}%"
                  + _skip_note(res), flush=True)
    return epoch


def _same_front_end(result: Path, args) -> bool:
    """Whether a cached per-epoch result was decoded with the dereverberation and the warps asked for now
    (--dereverb, --warps; else the checkpoint's decode section; results from before an option count as "off" and
    none)."""
    if args.dereverb is None and args.warps is None:
        return True
    try:
        old = json.loads(result.read_text())
    except (OSError, ValueError):
        return False
    return ((args.dereverb is None or old.get("dereverb", "off") == args.dereverb)
            and (args.warps is None or [float(w) for w in old.get("warps", [])] == args.warps))


def warm_dereverb_cache(manifests, settings, dereverb: str, limit: int = 0, jobs: int = 1) -> None:
    """Dereverberate every utterance of ``manifests`` (the first ``limit`` of each) into the feature cache, spread
    over ``jobs`` processes, so the decoders that follow (one per epoch or per setting) read it instead of each
    computing the same utterances."""
    if dereverb == "off":
        return
    from tqdm import tqdm

    from .data.manifest import audio_path, read_manifest
    from .frontend.cache import open_feature_cache, utterance_key
    todo = []
    for m in dict.fromkeys(str(m) for m in manifests):
        cache = open_feature_cache("auto", m, settings, dereverb=dereverb)
        for e in read_manifest(m)[:limit or None]:
            path = audio_path(e, Path(m))
            try:
                if cache.path_of(utterance_key(path, e.get("md5"))).is_file():
                    continue
            except OSError:
                continue        # an unreadable file: the decoder reports it
            todo.append((cache, str(path), e.get("md5")))
    if not todo:
        return
    chunks = [todo[i::max(1, jobs * 8)] for i in range(max(1, jobs * 8))]
    bar = tqdm(total=len(todo), desc=f"asr-eval: dereverberating ({dereverb})", file=sys.stderr, dynamic_ncols=True)
    if jobs > 1:
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(jobs, initializer=_pool_init) as pool:
            for n in pool.imap_unordered(_warm_job, [c for c in chunks if c]):
                bar.update(n)
            _finish(pool)
    else:
        for c in chunks:
            bar.update(_warm_job(c))
    bar.close()


def _warm_job(chunk) -> int:
    for cache, path, md5 in chunk:      # the manifest's FeatureCache (it pickles as its paths and settings)
        try:
            cache.power(path, md5)
        except (ValueError, RuntimeError, OSError, EOFError):
            pass                # the decoder meets it again, and reports it as a skipped utterance
    return len(chunk)


def _decode_epoch_job(job) -> int:
    """A --jobs worker process (one thread, see _pool_init): one epoch checkpoint."""
    return _decode_epoch(*job)


def run_dir_mode(args) -> int:
    run = Path(args.run_dir)
    (run / "eval").mkdir(parents=True, exist_ok=True)
    done_epochs, methods = set(), None
    while True:
        ckpts = [ck for ck in sorted((run / "checkpoints").glob("epoch*.pt")) if _epoch_of(ck) not in done_epochs]
        if ckpts and methods is None:                   # every epoch of a run has the same config: ask the first
            _, _, norm, ckpt = load_checkpoint(ckpts[0])
            _load_lm(args, ckpts[0], ckpt)              # a mismatched --lm stops here, before any decoding
            methods = _run_dir_methods(args, ckpt)
            # the front end every epoch is decoded with (a cached result decoded otherwise is decoded again)
            args.dereverb = args.dereverb or _decode_config(ckpt).dereverb
            args.warps = list(_decode_config(ckpt).warps) if args.warps is None else args.warps
            warm_dereverb_cache(args.manifest, norm.settings, args.dereverb, args.limit, args.jobs)
            if args.lm and not {"ctc_beam", "joint"} & set(methods):
                raise SystemExit(f"asr-eval: --lm is used by --method ctc_beam or joint only (here: {methods[0]})")
        if args.jobs > 1 and len(ckpts) > 1:
            import multiprocessing as mp
            # spawn: a fresh interpreter per worker (no forked copy of this process's torch thread pools)
            with mp.get_context("spawn").Pool(min(args.jobs, len(ckpts)), initializer=_pool_init) as pool:
                # the latest epochs first: they decode longer hypotheses, so the pool ends level
                for epoch in pool.imap_unordered(_decode_epoch_job, [(args, ck, methods) for ck in reversed(ckpts)]):
                    done_epochs.add(epoch)
                _finish(pool)
        else:
            for ck in ckpts:
                done_epochs.add(_decode_epoch(args, ck, methods))
        write_summary(run, args.manifest, _label(methods[0], args.lm) if methods else "attention")
        if not args.watch or (run / "DONE").exists() and len(done_epochs) >= len(list((run / "checkpoints").glob("epoch*.pt"))):
            break
        time.sleep(10)
    return 0


# Every way a result can be decoded, best first as measured: the lexicon decoder of a phone-head model 38.5% at
# 31 ms per utterance against its joint search with the LM 54.3% (1,200 equal demo steps, 250 clean test
# utterances, RESULTS.md 2026-12-04 fourth session); before, exp/demo's last epoch, 200 test utterances, one
# thread: joint+LM 79.1% WER at 49 ms per utterance, joint 80.5% / 30 ms, ctc_beam+LM 80.0% / 206 ms, ctc_beam
# 88.2% / 19 ms, ctc 89.3% / 4 ms, attention greedy 96.7% / 5 ms. The summary and the plot lead with the first
# one that has results.
LABELS = ("combine", "lexicon", "joint_lm", "joint", "ctc_beam_lm", "ctc_beam", "ctc", "attention")


def _label(method: str, lm=None) -> str:
    """How a result was decoded, as it appears in cache names and the plot (the LM makes its own curve)."""
    return f"{method}_lm" if lm and method in ("ctc_beam", "joint") else method


def _name(manifest, label: str) -> str:
    return Path(manifest).stem + ("" if label == "attention" else f".{label}")


def write_summary(run: Path, manifests, method: str = "attention") -> None:
    """wer_per_epoch.json and .png from every cached result (every decoding method that was run), in LABELS order:
    the best method's curves come first and are drawn thick. ``method``: a label listed even before it has results."""
    table, where = {}, {}
    for label in LABELS:
        for i, m in enumerate(manifests):
            name = _name(m, label)
            rows = []
            for f in sorted((run / "eval").glob(f"{name}.epoch*.json")):
                r = json.loads(f.read_text())
                rows.append({"epoch": r["epoch"], "wer": r["wer"], "ser": r["ser"], "utterances": r["utterances"],
                             "skipped_utterances": r.get("skipped_utterances", 0)})
                if "per_domain" in r:
                    rows[-1]["per_domain"] = {d: x["wer"] for d, x in r["per_domain"].items()}
            if rows or label == method:
                table[name], where[name] = rows, (label, i)
    tmp = run / "wer_per_epoch.json.tmp"
    tmp.write_text(json.dumps(table, indent=1))
    os.replace(tmp, run / "wer_per_epoch.json")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lead = next((where[n][0] for n, rows in table.items() if rows), None)
    colors = dict(zip(LABELS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in table.items():
        if rows:
            label, i = where[name]
            ax.plot([r["epoch"] for r in rows], [100 * r["wer"] for r in rows], ("-", "--", ":", "-.")[i % 4],
                    marker="o", color=colors[label], label=name, lw=2.5 if label == lead else 1.0,
                    ms=5 if label == lead else 3, zorder=3 if label == lead else 2)
    ax.set_xlabel("epoch")
    ax.set_ylabel("WER (%)")
    ax.set_title(f"WER per epoch: {run}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(run / "wer_per_epoch.png", dpi=120)
    plt.close(fig)


def _describe(r: dict) -> str:
    """The decoding settings of a result, for the printed summary."""
    front = "WPE dereverberation, " if r.get("dereverb", "off") != "off" else ""
    if r.get("warps"):
        front += f"warps {','.join(f'{w:g}' for w in r['warps'])} averaged, "
    return front + _describe_decoder(r)


def _describe_decoder(r: dict) -> str:
    lm = f", LM weight {r['lm_weight']}, length bonus {r['length_bonus']}" if r["lm_weight"] else ""
    return {"ctc": "CTC best path",
            "ctc_beam": f"CTC prefix beam {r['beam']}{lm}, attention weight {r['att_weight']}",
            "joint": f"joint CTC/attention beam {r['beam']}, CTC weight {r['ctc_weight']}{lm}",
            "lexicon": f"phone CTC over the lexicon, beam {r['beam']}"
                       + (f", word n-gram weight {r['lm_weight']}" if r["lm_weight"] else ", no n-gram")
                       + f", word score {r.get('word_score', 0)}"
                       + (f", blank penalty {r['blank_penalty']}" if r.get("blank_penalty") else "")
                       + (f", {r.get('lexicon_nbest')}-best rescored at {r['att_weight']}" if r["att_weight"] else ""),
            "combine": f"lexicon {r.get('combine', {}).get('nbest')}-best"
                       + "".join(f" (+ at blank penalty +{x:g})" for x in r.get("combine", {}).get("blank_offsets") or ())
                       + f" + joint beam {r['beam']} (CTC weight "
                       f"{r['ctc_weight']}{lm}) reranked; picked from {r.get('picked_from')}",
            }.get(r["method"], "attention greedy" if r["beam"] <= 1 else f"attention beam {r['beam']}"
                  + (f", CTC rescoring weight {r['ctc_weight']}" if r["ctc_weight"] else ""))


def _tune_on_dev(args, ckpt, method: str, norm, opts: dict) -> dict:
    """--tune-on: the settings chosen on the dev set (:func:`tune`) put into ``opts`` (without the LM where its weight
    came out 0, except for combine, whose candidates the LM still scores); returns the record kept in the results."""
    warm_dereverb_cache([args.tune_on], norm.settings, opts["dereverb"], args.tune_limit, args.jobs)
    tuned = tune(args, ckpt, {k: v for k, v in opts.items() if k != "lm"})
    opts.update(tuned["chosen"])
    if opts["lm_weight"] <= 0 and method != "combine":     # combine's candidates are still scored by the LM
        opts["lm"] = None
    return tuned


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    for m in args.manifest:
        if not Path(m).exists():
            raise SystemExit(f"asr-eval: {m}: manifest not found")
    if args.lm and args.methods and not {"ctc_beam", "joint", "combine"} & set(args.methods):
        raise SystemExit("asr-eval: --lm is used by --method ctc_beam, joint or combine only")
    if args.lm and not Path(args.lm).exists():
        raise SystemExit(f"asr-eval: --lm {args.lm}: file not found (train one with asr-lm)")
    if args.run_dir:
        if not (Path(args.run_dir) / "checkpoints").is_dir() and not args.watch:
            raise SystemExit(f"asr-eval: {args.run_dir}: no checkpoints/ folder (is it a training run folder?)")
        return run_dir_mode(args)
    model, tok, norm, ckpt = load_checkpoint(args.checkpoint)
    method = _method(args, ckpt)
    if args.lm and method not in ("ctc_beam", "joint", "combine"):
        raise SystemExit(f"asr-eval: --lm is used by --method ctc_beam, joint or combine only (the default here: {method})")
    opts = _decode_opts(args, ckpt, _load_lm(args, args.checkpoint, ckpt), method)
    if args.tune_on:
        if method not in ("joint", "lexicon", "combine"):
            raise SystemExit(f"asr-eval: --tune-on tunes --method joint, lexicon or combine (here: {method})")
        if not Path(args.tune_on).exists():
            raise SystemExit(f"asr-eval: --tune-on {args.tune_on}: manifest not found")
        if Path(args.tune_on).resolve() in {Path(m).resolve() for m in args.manifest}:
            raise SystemExit(f"asr-eval: --tune-on {args.tune_on} is also a --manifest: tune on a dev set, not on "
                             f"the set you report")
    with shared_pool(args.jobs if args.tune_on else 1):    # the tuning's processes decode the test sets too
        tuned = _tune_on_dev(args, ckpt, method, norm, opts) if args.tune_on else None
        warm_dereverb_cache(args.manifest, norm.settings, opts["dereverb"], args.limit, args.jobs)
        use_lm = opts.get("lm") is not None and (opts.get("lm_weight", 0) > 0 or method == "combine")
        lm_path = args.lm if use_lm else None
        jobs = [(args.checkpoint, lm_path, m, args.limit, {k: v for k, v in opts.items() if k != "lm"})
                for m in args.manifest]
        if len(jobs) > 1 and args.jobs > 1:
            results = _map(_decode_job, jobs, args.jobs)
        else:       # one process: the model loaded above, the LM as _decode_opts gave it
            results = [evaluate(model, tok, norm, m, limit=args.limit, **opts) for m in args.manifest]
    if tuned is not None:
        for r in results:
            r["tuned_on"] = tuned
    for r in results:
        print(f"{Path(r['manifest']).name}: WER {100 * r['wer']:.2f}%  SER {100 * r['ser']:.2f}%  "
              f"({r['utterances']} utterances, {_describe(r)}; {1000 * r['seconds_per_utterance']:.0f} ms per "
              f"utterance)" + _skip_note(r))
        for s in r["skipped"][:5]:
            print(f"  skipped {s['id']}: {s['reason']}")
        for key in ("per_speaker", "per_domain", *(f"per_{b}" for b in BAND_FIELDS)):
            for value, x in r.get(key, {}).items():
                print(f"  {key[4:].replace('_band', ''):7s} {value:40s} WER {100 * x['wer']:6.2f}%  SER {100 * x['ser']:6.2f}%  "
                      f"({x['utterances']} utt)")
    if args.json and len(args.json) == len(results):
        for path, r in zip(args.json, results):
            Path(path).write_text(json.dumps(r, indent=1))
    elif args.json:
        Path(args.json[0]).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
