"""asr-eval: word and sentence error rates of BFA checkpoints.

    asr-eval --checkpoint exp/run/checkpoints/last.pt --manifest exp/corpus/test.jsonl --json test.json
    asr-eval --run-dir exp/run --manifest exp/corpus/test.jsonl --manifest exp/corpus/test_far.jsonl
    asr-eval --run-dir exp/run --manifest exp/corpus/test.jsonl --watch    # while training runs

With --checkpoint it decodes one checkpoint and prints WER and SER (and writes every hypothesis with
--json). With --run-dir it evaluates each epoch's checkpoint (``checkpoints/epochNNN.pt``) on every
manifest, caching results in RUN/eval/, and writes RUN/wer_per_epoch.json and RUN/wer_per_epoch.png;
with --watch it keeps going as new checkpoints appear until training writes RUN/DONE.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

from .decode import METHODS


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="asr-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="one checkpoint (.pt) written by asr.train")
    src.add_argument("--run-dir", help="a training run folder: evaluate every epoch's checkpoint")
    p.add_argument("--manifest", action="append", required=True, help="JSONL manifest (repeatable)")
    p.add_argument("--json", help="--checkpoint: write WER, SER and every hypothesis here")
    p.add_argument("--method", choices=METHODS, default="attention",
                   help="attention: the decoder (greedy or beam, optional CTC rescoring); ctc: best path of the CTC head "
                        "(no decoder); ctc_beam: CTC prefix beam search with optional LM fusion (--lm), the n-best "
                        "rescored by the attention decoder (--att-weight). Per-epoch results of each method are "
                        "kept apart (NAME, NAME.ctc, NAME.ctc_beam, NAME.ctc_beam_lm)")
    # Every decoding default is the checkpoint's config decode section (asr.config.DecodeConfig).
    p.add_argument("--beam", type=int, help="beam size (default: decode.beam, 1 = greedy; ctc_beam: decode.prefix_beam)")
    p.add_argument("--ctc-weight", type=float, help="CTC rescoring weight (default: the config's decode.ctc_weight)")
    p.add_argument("--lm", help="ctc_beam: language model from asr-lm (OUT/lm.pt) for shallow fusion")
    p.add_argument("--lm-weight", type=float, help="ctc_beam: LM weight (default: decode.lm_weight, 0.5)")
    p.add_argument("--length-bonus", type=float,
                   help="ctc_beam: score added per piece, against the LM's pull towards short hypotheses "
                        "(default: decode.length_bonus, 3.0, with --lm; 0 without)")
    p.add_argument("--att-weight", type=float,
                   help="ctc_beam: attention weight when rescoring the n-best (0: CTC and LM only; default: "
                        "decode.att_weight, 0.5)")
    p.add_argument("--limit", type=int, default=0, help="decode only the first N utterances of each manifest")
    p.add_argument("--watch", action="store_true", help="--run-dir: wait for new checkpoints until RUN/DONE")
    p.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1), help="torch threads")
    return p.parse_args(argv)




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
             lm_weight: float = 0.0, length_bonus: float = 0.0, att_weight: float = 0.0) -> dict:
    """Decode a manifest; return WER, SER and every (id, ref, hyp).

    An utterance whose audio cannot be read (see asr.loader.SkippedItem) is counted as an error: its row has an
    empty hypothesis and a ``skipped`` reason, so WER and SER keep the manifest's full denominator; the result
    also lists them under ``skipped`` and counts them in ``skipped_utterances``."""
    from .decode import decode_manifest
    from .loader import SpeechDataset
    from .metrics import ErrorCounts, utterance_errors
    ds = SpeechDataset(manifest, tok, norm)
    if limit:
        ds.entries = ds.entries[:limit]
    if method in ("ctc", "ctc_beam"):
        if model.ctc_head is None:
            raise SystemExit(f"asr-eval: --method {method} needs a model trained with a CTC head (model.ctc_weight > 0)")
        beam, ctc_weight = (1 if method == "ctc" else beam), 0.0
    rows = decode_manifest(model, tok, ds, (method,), beam=beam, ctc_weight=ctc_weight, lm=lm, lm_weight=lm_weight,
                           length_bonus=length_bonus, att_weight=att_weight, batch_seconds=batch_seconds,
                           progress=desc or Path(manifest).name)[method]
    skipped = [(r["id"], r["skipped"]) for r in rows if "skipped" in r]
    speaker = {e["id"]: e.get("speaker", "unknown") for e in ds.entries}
    counts = utterance_errors([r["ref"] for r in rows], [r["hyp"] for r in rows])
    total, by_speaker = ErrorCounts(), {}
    for r, c in zip(rows, counts):
        total += c
        spk = speaker.get(r["id"], "unknown")
        by_speaker[spk] = by_speaker.get(spk, ErrorCounts()) + c
    return {"manifest": str(manifest), "utterances": len(rows), "wer": total.wer, "ser": total.ser,
            "skipped_utterances": len(skipped), "skipped": [{"id": i, "reason": why} for i, why in skipped],
            "substitutions": total.substitutions, "deletions": total.deletions, "insertions": total.insertions,
            "ref_words": total.ref_words,
            "per_speaker": {s: {"utterances": c.sentences, "wer": c.wer, "ser": c.ser}
                            for s, c in sorted(by_speaker.items())},
            "method": method, "beam": beam, "ctc_weight": ctc_weight, "lm_weight": lm_weight if lm else 0.0,
            "length_bonus": length_bonus, "att_weight": att_weight, "hypotheses": rows}


def _decode_opts(args, ckpt, lm=None) -> dict:
    """evaluate()'s decoding keywords: the command line first, then the checkpoint's decode config (whose
    defaults are asr.config.DecodeConfig's, also for checkpoints written before a field existed)."""
    import dataclasses
    from .config import DecodeConfig
    known = {f.name for f in dataclasses.fields(DecodeConfig)}
    dec = DecodeConfig(**{k: v for k, v in ckpt.config.get("decode", {}).items() if k in known})
    pick = lambda flag, default: flag if flag is not None else default
    opts = {"beam": pick(args.beam, dec.beam), "ctc_weight": pick(args.ctc_weight, dec.ctc_weight),
            "method": args.method}
    if args.method == "ctc_beam":
        opts.update(beam=pick(args.beam, dec.prefix_beam), lm=lm, att_weight=pick(args.att_weight, dec.att_weight),
                    lm_weight=pick(args.lm_weight, dec.lm_weight) if lm is not None else 0.0,
                    length_bonus=pick(args.length_bonus, dec.length_bonus if lm is not None else 0.0))
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


def run_dir_mode(args) -> int:
    run = Path(args.run_dir)
    cache = run / "eval"
    cache.mkdir(parents=True, exist_ok=True)
    done_epochs = set()
    while True:
        ckpts = sorted((run / "checkpoints").glob("epoch*.pt"))
        for ck in ckpts:
            epoch = int(re.findall(r"\d+", ck.stem)[0])
            if epoch in done_epochs:
                continue
            loaded = None
            for m in args.manifest:
                dest = cache / f"{_name(m, _label(args))}.epoch{epoch:03d}.json"
                if dest.exists():
                    continue
                if loaded is None:
                    loaded = load_checkpoint(ck)
                    lm = _load_lm(args, ck, loaded[3])
                model, tok, norm, ckpt = loaded
                res = evaluate(model, tok, norm, m, limit=args.limit, desc=f"epoch {epoch} {Path(m).stem}",
                               **_decode_opts(args, ckpt, lm))
                res["epoch"] = epoch
                tmp = dest.with_suffix(".tmp")
                tmp.write_text(json.dumps(res, indent=1))
                os.replace(tmp, dest)
                print(f"[asr-eval] epoch {epoch} {_name(m, _label(args))}: WER {100 * res['wer']:.2f}%  SER {100 * res['ser']:.2f}%"
                      + _skip_note(res), flush=True)
            done_epochs.add(epoch)
        write_summary(run, args.manifest, _label(args))
        if not args.watch or (run / "DONE").exists() and len(done_epochs) >= len(list((run / "checkpoints").glob("epoch*.pt"))):
            break
        time.sleep(10)
    return 0


LABELS = ("attention", "ctc", "ctc_beam", "ctc_beam_lm")


def _label(args) -> str:
    """How a result was decoded, as it appears in cache names and the plot (the LM makes its own curve)."""
    return "ctc_beam_lm" if args.method == "ctc_beam" and args.lm else args.method


def _name(manifest, label: str) -> str:
    return Path(manifest).stem + ("" if label == "attention" else f".{label}")


def write_summary(run: Path, manifests, method: str = "attention") -> None:
    """wer_per_epoch.json and .png from every cached result (every decoding method that was run)."""
    table = {}
    names = [_name(m, label) for m in manifests for label in LABELS]
    for name in names:
        rows = []
        for f in sorted((run / "eval").glob(f"{name}.epoch*.json")):
            r = json.loads(f.read_text())
            rows.append({"epoch": r["epoch"], "wer": r["wer"], "ser": r["ser"], "utterances": r["utterances"],
                         "skipped_utterances": r.get("skipped_utterances", 0)})
        if rows or name in (_name(m, method) for m in manifests):
            table[name] = rows
    tmp = run / "wer_per_epoch.json.tmp"
    tmp.write_text(json.dumps(table, indent=1))
    os.replace(tmp, run / "wer_per_epoch.json")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in table.items():
        if rows:
            ax.plot([r["epoch"] for r in rows], [100 * r["wer"] for r in rows], "-o", label=name)
    ax.set_xlabel("epoch")
    ax.set_ylabel("WER (%)")
    ax.set_title(f"WER per epoch: {run}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(run / "wer_per_epoch.png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    for m in args.manifest:
        if not Path(m).exists():
            raise SystemExit(f"asr-eval: {m}: manifest not found")
    if args.lm and args.method != "ctc_beam":
        raise SystemExit("asr-eval: --lm is used by --method ctc_beam only")
    if args.lm and not Path(args.lm).exists():
        raise SystemExit(f"asr-eval: --lm {args.lm}: file not found (train one with asr-lm)")
    if args.run_dir:
        if not (Path(args.run_dir) / "checkpoints").is_dir() and not args.watch:
            raise SystemExit(f"asr-eval: {args.run_dir}: no checkpoints/ folder (is it a training run folder?)")
        return run_dir_mode(args)
    model, tok, norm, ckpt = load_checkpoint(args.checkpoint)
    opts = _decode_opts(args, ckpt, _load_lm(args, args.checkpoint, ckpt))
    results = [evaluate(model, tok, norm, m, limit=args.limit, **opts) for m in args.manifest]
    for r in results:
        how = {"ctc": "CTC best path",
               "ctc_beam": f"CTC prefix beam {r['beam']}, LM weight {r['lm_weight']}, attention weight "
                           f"{r['att_weight']}"}.get(args.method, f"beam {r['beam']}")
        print(f"{Path(r['manifest']).name}: WER {100 * r['wer']:.2f}%  SER {100 * r['ser']:.2f}%  "
              f"({r['utterances']} utterances, {how})" + _skip_note(r))
        for s in r["skipped"][:5]:
            print(f"  skipped {s['id']}: {s['reason']}")
        for spk, x in r["per_speaker"].items():
            print(f"  {spk:40s} WER {100 * x['wer']:6.2f}%  SER {100 * x['ser']:6.2f}%  ({x['utterances']} utt)")
    if args.json:
        Path(args.json).write_text(json.dumps(results[0] if len(results) == 1 else results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
