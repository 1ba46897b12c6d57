"""asr-prep: data preparation for the ASR recipe.

  synth      build a deterministic offline synthetic corpus (espeak-ng, flite, festival)
  import     import LibriSpeech-layout, JSON-lines or TSV corpora into the same manifest format
  tokenizer  train a sentencepiece unigram word-piece model on a manifest's transcripts
  stats      feature mean/variance for normalization, and a duration histogram
  lm-text    text for the language model: training transcripts plus unseen generator sentences
  lexicon    every word of the LM text spelt in phones (espeak-ng), for the phone CTC head and the lexicon decoder
  ngram      a word n-gram LM (KenLM) over the LM text, for the lexicon decoder
  baseline   decode a manifest with pocketsphinx and report WER / sentence error rate
  far        the far-field test set: a manifest passed once through the acoustic simulator (fixed seed)
  augment-demo  a few augmented WAVs and a PNG of clean / VTLP / reverberant-noisy spectrograms

Manifests are JSON lines (id, audio_filepath, duration, text, speaker, md5); see asr/data/manifest.py.
Exit codes: 0 ok; 1 nothing usable remained (or --strict and something was rejected); 2 bad arguments or input.
"""
from __future__ import annotations

import argparse
import os
import sys


def _synth(a) -> int:
    from .synth import build_corpus
    return build_corpus(a.out, a.size, a.seed, a.jobs, a.limit, a.strict, a.data_dir, a.train)


def _import(a) -> int:
    from .importers import import_corpus
    return import_corpus(a.format, a.src, a.out, a.split, a.strict, a.jobs)


def _tokenizer(a) -> int:
    from .tokenizer import train_tokenizer
    train_tokenizer(a.manifest, a.vocab_size, a.out, text=a.text)
    return 0


def _stats(a) -> int:
    from .stats import compute_stats
    from ..frontend import FeatureSettings
    compute_stats(a.manifest, a.out, FeatureSettings(mel_compression=a.mel_compression), a.jobs, a.feature_cache)
    return 0


def _lm_text(a) -> int:
    from .lm_text import build_lm_text
    build_lm_text(a.corpus, a.out, a.extra, a.data_dir)
    return 0


def _lexicon(a) -> int:
    from .lexicon import build_lexicon, print_summary
    print_summary(build_lexicon(a.text, a.manifest or [], a.out, a.voice), a.out)
    return 0


def _ngram(a) -> int:
    from .ngram import build_ngram
    out = build_ngram(a.text, a.out, a.order)
    print(f"asr-prep ngram: {a.order}-gram over {a.text} -> {out} ({out.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0


def _baseline(a) -> int:
    from .baseline import run_baseline
    run_baseline(a.manifest, a.json, a.jobs, a.limit)
    return 0


def _far(a) -> int:
    from .far import make_far
    make_far(a.manifest, a.out or os.path.dirname(os.path.abspath(a.manifest)), a.seed, a.pool_size, a.name)
    return 0


def _rooms(a) -> int:
    import dataclasses
    import json
    from ..augment.pipeline import Augmenter
    from ..augment.rooms import prebuild_rooms
    from ..config import load_config
    cfg = load_config(a.config, a.overrides)
    cache = cfg.rir_cache_dir()
    if not cfg.augment.enabled or cfg.augment.sim_prob <= 0 or cache is None:
        print("asr-prep rooms: nothing to build (augment.enabled is false, augment.sim_prob is 0 or "
              "augment.rir_cache is empty)", file=sys.stderr)
        return 0
    pool = Augmenter(dataclasses.replace(cfg.augment, rir_cache=cache), seed=cfg.train.seed).pool
    summary = prebuild_rooms(pool, a.epochs, a.jobs)
    print(f"asr-prep rooms: {summary['rooms']} rooms for epochs 0-{a.epochs - 1} in {cache}: {summary['built']} "
          f"built ({summary['build_s']:.1f} s of building, {summary['wall_s']:.1f} s wall), "
          f"{summary['cached']} already there", file=sys.stderr)
    print(json.dumps(summary))
    return 0


def _augment_demo(a) -> int:
    from .augment_demo import main as demo
    return demo(a.rest)


def build_parser() -> argparse.ArgumentParser:
    from ..frontend import DEFAULT_FEATURES, MEL_COMPRESSIONS
    from . import DATA_DIR
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="asr-prep", description=__doc__, formatter_class=fmt)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    jobs_help = "worker processes (default: all cores)"

    s = sub.add_parser("synth", help="build a deterministic offline synthetic speech corpus", formatter_class=fmt,
                       description="""\
Synthesize a speech corpus offline with espeak-ng, flite and festival: voice-assistant commands from
data/text/templates.yaml and open-domain sentences from Debian text packages (data/text/sources.yaml), spoken by
the voices of data/voices.yaml. Splits are disjoint by voice and by sentence (dev/test voices never train).

Writes DIR/audio/<split>/<id>.flac (16 kHz mono), DIR/{train,dev,test}.jsonl (audio_filepath relative to DIR),
DIR/corpus.json (seed, counts, voices, hours, vocabulary) and DIR/rejected.jsonl. The same seed gives the same
bytes. Re-running resumes: an utterance whose FLAC matches the md5 recorded in DIR/.done/<id>.json is skipped,
anything missing or damaged is made again.""")
    s.add_argument("--out", required=True, metavar="DIR", help="output folder (created; reused to resume)")
    s.add_argument("--size", choices=["tiny", "small", "full"], default="tiny",
                   help="tiny: 300 utterances (well under 2 min), small: 5000 (~4 h), full: 30000 (~25 h, "
                        ">5k-word vocabulary)")
    s.add_argument("--train", type=int, default=None, metavar="N",
                   help="N training utterances instead of the size's 80%%; dev and test stay those of --size "
                        "(held-out sentences are drawn first), so runs on more or less training data share one "
                        "test set. The recipe's 60-minute benchmark uses --size small --train 20000 (~16 h)")
    s.add_argument("--seed", type=int, default=0, help="seed for text, voice and prosody choices (default 0)")
    s.add_argument("--jobs", type=int, default=os.cpu_count(), help=jobs_help)
    s.add_argument("--strict", action="store_true", help="exit 1 if any utterance was rejected")
    s.add_argument("--data-dir", default=DATA_DIR, help=f"folder with voices.yaml and text/ (default {DATA_DIR})")
    s.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)  # small corpora for tests
    s.set_defaults(func=_synth)

    s = sub.add_parser("import", help="import an existing corpus into manifest format", formatter_class=fmt,
                       description="""\
Import a corpus into DIR/<split>.jsonl.
  librispeech  SRC is a folder SRC/<speaker>/<chapter>/<id>.flac with <speaker>-<chapter>.trans.txt lines "ID TEXT"
  jsonl        SRC is a file of JSON objects with audio_filepath (relative to SRC's folder or absolute), text,
               and optional id and speaker
  tsv          SRC is a tab-separated file whose header names a path column and a text column (also accepted:
               audio_filepath/audio/file, sentence/transcript; optional id, speaker/client_id)
Text is normalized like synthesized text. 16 kHz mono audio is used in place (absolute path); other rates or
stereo are converted to 16 kHz mono FLAC under DIR/audio/<split>/ (with a note).

Missing, empty (0 bytes or 0 samples), corrupt or truncated audio, non-UTF-8 or empty transcripts, audio without
a transcript and duplicate ids are each reported with the file and reason and listed in DIR/rejected.jsonl; the
rest is imported. Exit 1 only if nothing usable remains, or with --strict if anything was rejected.""")
    s.add_argument("--format", required=True, choices=["librispeech", "jsonl", "tsv"])
    s.add_argument("src", metavar="SRC", help="corpus folder (librispeech) or file (jsonl, tsv)")
    s.add_argument("--out", required=True, metavar="DIR", help="output folder")
    s.add_argument("--split", default=None, help="manifest name (default: SRC's folder name or file stem)")
    s.add_argument("--strict", action="store_true", help="exit 1 if anything was rejected")
    s.add_argument("--jobs", type=int, default=os.cpu_count(), help=jobs_help)
    s.set_defaults(func=_import)

    s = sub.add_parser("tokenizer", help="train a sentencepiece unigram word-piece model",
                       description="Train a deterministic sentencepiece unigram model (character_coverage=1.0, one "
                       "thread) on the transcripts of a manifest, or on a text file of one sentence per line (the "
                       "recipe uses the language model's text, DIR/lm/text.txt: the training transcripts plus more "
                       "sentences from the same generators, never a dev or test sentence); writes "
                       "OUT/tokenizer.model, OUT/tokenizer.vocab and the training text OUT/transcripts.txt.")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--manifest", help="training manifest, e.g. DIR/train.jsonl")
    src.add_argument("--text", help="text file, one sentence per line, e.g. DIR/lm/text.txt (from asr-prep lm-text)")
    s.add_argument("--vocab-size", type=int, required=True, help="number of pieces (the paper uses about 10k)")
    s.add_argument("--out", required=True, help="output folder, e.g. DIR/tokenizer")
    s.set_defaults(func=_tokenizer)

    s = sub.add_parser("stats", help="feature mean/variance and a duration histogram",
                       description="Compute per-dimension mean and variance of the front end's mel features "
                       "(asr.frontend.compute_features: 40 bands, 25 ms windows, 10 ms hop, power-law x**(1/15) by "
                       "default) over all frames of a manifest, for feature normalization. Writes "
                       "OUT/feature_stats.json (with the feature settings, which training and evaluation then use) "
                       "and .pt; prints a duration histogram and saves it as OUT/durations.txt and .png. On the way "
                       "it stores each utterance's clean spectrogram in the feature cache that training reads "
                       "(data.feature_cache: auto), so the first epoch does not compute them.")
    s.add_argument("--manifest", required=True, help="manifest, e.g. DIR/train.jsonl")
    s.add_argument("--out", required=True, help="output folder, e.g. DIR/stats")
    s.add_argument("--mel-compression", choices=MEL_COMPRESSIONS, default=DEFAULT_FEATURES.mel_compression,
                   help="compression of the mel energies: power (x ** (1/15)) or log (log(x + 1e-6))")
    s.add_argument("--jobs", type=int, default=os.cpu_count(), help=jobs_help)
    s.add_argument("--feature-cache", default="auto", metavar="auto|off|DIR",
                   help="where the clean spectrograms go (auto: feature_cache/ next to the manifest, where "
                        "training's data.feature_cache=auto reads them; off: nowhere)")
    s.set_defaults(func=_stats)

    s = sub.add_parser("lm-text", help="text for the language model (no dev/test sentence)",
                       description="Write the language-model text: the training transcripts of a corpus plus EXTRA "
                       "sentences from the same generators (half commands from data/text/templates.yaml, half "
                       "open-domain from the Debian text sources), excluding every sentence of the corpus's held-out "
                       "manifests (dev, test, test_far). Writes OUT and OUT.json (counts).")
    s.add_argument("--corpus", required=True, metavar="DIR", help="corpus folder from asr-prep synth")
    s.add_argument("--out", required=True, help="output text file, e.g. DIR/lm/text.txt")
    s.add_argument("--extra", type=int, default=60000, help="sentences beyond the training transcripts (default 60000)")
    s.add_argument("--data-dir", default=DATA_DIR, help=f"folder with text/ (default {DATA_DIR})")
    s.set_defaults(func=_lm_text)

    s = sub.add_parser("lexicon", help="every word spelt in phones (espeak-ng), for phone CTC and lexicon decoding",
                       description="Spell every word of the LM text (and of the given manifests' transcripts) in "
                       "phones with espeak-ng's letter-to-sound rules (stress marks dropped). Writes OUT/lexicon.txt "
                       "(word and its phones), OUT/phones.txt (the phone inventory the model's phone CTC head emits, "
                       "model.phone_ctc_weight > 0) and OUT/lexicon.json. The lexicon decoder (asr-eval --method "
                       "lexicon) can output only these words.")
    s.add_argument("--text", required=True, help="LM text, one sentence per line, e.g. DIR/lm/text.txt")
    s.add_argument("--manifest", action="append", help="also spell this manifest's transcripts (repeatable; "
                   "the training manifest, so every training transcript has phone targets)")
    s.add_argument("--out", required=True, help="output folder, e.g. DIR/lexicon")
    s.add_argument("--voice", default="en-us", help="espeak-ng voice whose rules spell the words (default en-us)")
    s.set_defaults(func=_lexicon)

    s = sub.add_parser("ngram", help="a word n-gram LM (KenLM) over the LM text",
                       description="Estimate a modified Kneser-Ney word n-gram over the LM text with KenLM's lmplz "
                       "and write it in KenLM's binary format (build_binary), for asr-eval --method lexicon.")
    s.add_argument("--text", required=True, help="LM text, one sentence per line, e.g. DIR/lm/text.txt")
    s.add_argument("--out", required=True, help="output file, e.g. DIR/lm/words.4gram.bin")
    s.add_argument("--order", type=int, default=4, help="n-gram order (default 4)")
    s.set_defaults(func=_ngram)

    s = sub.add_parser("baseline", help="pocketsphinx baseline WER on a manifest",
                       description="Decode every utterance of a manifest with pocketsphinx's bundled en-us model "
                       "(acoustic model, generic LM, CMU dictionary), normalize hypotheses like references, and "
                       "report word error rate and sentence error rate, overall and per speaker.")
    s.add_argument("--manifest", required=True, help="manifest to decode")
    s.add_argument("--json", default=None, metavar="OUT", help="also write results and hypotheses to this JSON file")
    s.add_argument("--jobs", type=int, default=os.cpu_count(), help=jobs_help)
    s.add_argument("--limit", type=int, default=None, help="decode only the first N utterances")
    s.set_defaults(func=_baseline)

    s = sub.add_parser("far", help="far-field copy of a manifest through the acoustic simulator",
                       formatter_class=fmt, description=(
                           "Pass every utterance of a manifest (normally DIR/test.jsonl) once through the acoustic\n"
                           "simulator (random shoebox room, reverberation, 0-3 noise sources, SNR 0-30 dB) with a\n"
                           "fixed seed, writing OUT/audio/NAME/*.flac and OUT/NAME.jsonl. Re-runs skip finished files."))
    s.add_argument("--manifest", required=True, help="source manifest, e.g. DIR/test.jsonl")
    s.add_argument("--out", help="corpus folder to write into (default: the manifest's folder)")
    s.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    s.add_argument("--pool-size", type=int, default=32, help="rooms in the RIR pool (default 32)")
    s.add_argument("--name", default="test_far", help="output name (default test_far)")
    s.set_defaults(func=_far)

    s = sub.add_parser("rooms", help="build the simulated rooms training will use, ahead of training",
                       formatter_class=fmt, description="""\
Build, on all cores, every simulated room (RIR pool entry) that the first --epochs epochs of a training config
draw, into the shared room cache (augment.rir_cache; "auto" is rir_cache/ next to data.train). Training then
reads rooms instead of building them on its loader workers while the trainers wait. The pool's seed is
train.seed, as in training. Rooms already in the cache are skipped, so re-running is cheap; epochs beyond
--epochs still build their rooms lazily during training.

  asr-prep rooms --config recipes/bfa/conf/cpu-small.yaml --epochs 20 data.train=exp/corpus/train.jsonl""")
    s.add_argument("--config", required=True, help="training config (YAML), e.g. recipes/bfa/conf/cpu-small.yaml")
    s.add_argument("--epochs", type=int, default=20, help="build the rooms of epochs 0..N-1 (default 20)")
    s.add_argument("--jobs", type=int, default=os.cpu_count(), help=jobs_help)
    s.add_argument("overrides", nargs="*", metavar="key=value",
                   help="config overrides as for asr.train (data.train=... sets where 'auto' puts the cache)")
    s.set_defaults(func=_rooms)

    s = sub.add_parser("augment-demo", help="augmented WAVs and a spectrogram PNG to look at and listen to",
                       formatter_class=fmt, add_help=False,
                       description="Same as python -m asr.data.augment_demo: --manifest M.jsonl --out DIR [...]")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=_augment_demo)
    return p


def main(argv=None) -> int:
    from ..frontend import AudioError
    from .importers import ImportFailed
    from .manifest import ManifestError
    from .ngram import NgramError
    from .stats import StatsError
    from .text import TextSourceError
    from .tokenizer import TokenizerError
    from .voices import ReservedVoiceError, VoiceConfigError
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["augment-demo"]:          # its own parser (asr.data.augment_demo), --help included
        from .augment_demo import main as demo
        return demo(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ReservedVoiceError:
        raise  # a reserved voice must never be reached: fail loudly with the traceback
    except (ImportFailed, ManifestError, StatsError, TextSourceError, TokenizerError, VoiceConfigError,
            NgramError, AudioError, ValueError, OSError) as e:
        print(f"asr-prep {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
