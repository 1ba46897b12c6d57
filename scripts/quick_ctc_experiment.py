"""Quick single-process experiment (not part of the library): train the BFA model on cached clean features for a
fixed wall-clock budget and report CTC best-path WER on seen training utterances and on unseen-voice dev/test
subsets, split by domain (command / open), at regular intervals.

Two of these run side by side on the 2 cores (one thread each) to compare one change at equal CPU; the figures are
only comparable within such a pair. The recipe's numbers come from recipes/bfa/run.sh, never from this script.

    .venv/bin/python scripts/quick_ctc_experiment.py --corpus exp/corpus_small_seed0 --minutes 10 \\
        --json out/quick/base.json [--cmvn utterance] [--tokenizer T.model] [--set model.enc_hidden=192]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import torch

from asr.config import CHOICES


def load_or_cache(corpus: Path, split: str, cache_dir: Path, limit: int | None, settings):
    """Clean features of a split (``settings``: the statistics file's FeatureSettings), cached on disk."""
    from asr.checkpoint import CheckpointError, atomic_save, load_checkpoint
    from asr.data.manifest import audio_path, read_manifest
    from asr.frontend import compute_features, load_wave
    cache = cache_dir / f"{split}.pt"
    entries = read_manifest(corpus / f"{split}.jsonl")
    feats = None
    if cache.exists():
        try:
            feats = load_checkpoint(cache, what=f"a list of {len(entries)} feature tensors cached by this script")
            if not isinstance(feats, list) or len(feats) != len(entries):
                n = f" of {len(feats)} items" if isinstance(feats, list) else ""
                raise CheckpointError(f"{cache}: holds a {type(feats).__name__}{n}, expected {len(entries)} "
                                      f"feature tensors (one per utterance of {split}.jsonl)")
        except CheckpointError as e:
            print(f"rebuilding the feature cache: {e}", flush=True)
            feats = None
    if feats is None:
        feats = [compute_features(load_wave(audio_path(e, corpus / f"{split}.jsonl"), settings.sample_rate),
                                  settings).half() for e in entries]
        atomic_save(feats, cache)
    pairs = list(zip(entries, feats))
    if limit:
        random.Random(0).shuffle(pairs)
        pairs = pairs[:limit]
    return pairs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, default=None)
    p.add_argument("--cmvn", choices=CHOICES["data.cmvn"], default="global")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--eval-every", type=float, default=2.5, help="minutes")
    p.add_argument("--eval-limit", type=int, default=200)
    p.add_argument("--batch-seconds", type=float, default=40.0)
    p.add_argument("--lr", type=float, default=0.006)
    p.add_argument("--decay", type=float, default=0.9)
    p.add_argument("--train-limit", type=int, default=None)
    p.add_argument("--config", type=Path, default=Path("recipes/bfa/conf/cpu-small.yaml"))
    p.add_argument("--set", action="append", default=[], help="config overrides, e.g. model.enc_hidden=192")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    from asr.config import load_config
    from asr.decode import decode_manifest
    from asr.loader import BucketBatchSampler, Normalizer, Tokenizer, collate
    from asr.models.bfa import BFA, parameter_count
    from asr.metrics import ErrorCounts, word_errors
    from asr.train import lr_factor

    cfg = load_config(a.config, a.set)
    tok = Tokenizer(a.tokenizer or a.corpus / "tokenizer" / "tokenizer.model")
    norm = Normalizer(a.corpus / "stats" / "feature_stats.json", a.cmvn)
    cache = a.corpus / "quick_cache"
    train = load_or_cache(a.corpus, "train", cache, a.train_limit, norm.settings)
    evals = {split: load_or_cache(a.corpus, split, cache, a.eval_limit, norm.settings)
             for split in ("train", "dev", "test")}

    def prep(e, f):
        return e["id"], norm(f.float()), tok.encode(e["text"]), e["text"]

    model_cfg = dataclasses.replace(cfg.model, vocab_size=tok.vocab_size, phone_ctc_weight=0.0)
    torch.manual_seed(a.seed)
    model = BFA(model_cfg)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    sampler = BucketBatchSampler([e["duration"] for e, _ in train], a.batch_seconds, 96, seed=a.seed)

    class Cached:
        """Cached features as decode_manifest reads a dataset (nothing is skipped)."""

        def __init__(self, pairs):
            self.pairs, self.entries = pairs, [e for e, _ in pairs]
            self.durations = [e["duration"] for e in self.entries]

        def __getitem__(self, i):
            return prep(*self.pairs[i])

    eval_sets = {name: Cached(pairs) for name, pairs in evals.items()}

    def evaluate():
        out = {}
        for name, ds in eval_sets.items():
            info = {e["id"]: e for e in ds.entries}
            errs = {}
            for r in decode_manifest(model, tok, ds, ("ctc",), batch_seconds=1e9)["ctc"]:
                e, counts = info[r["id"]], word_errors(r["ref"], r["hyp"])
                for key in ("all", e.get("domain", "?"), e["speaker"]):
                    errs[key] = errs.get(key, ErrorCounts()) + counts
            out[name] = {k: round(100 * v.wer, 1) for k, v in errs.items()}
        model.train()
        return out

    t0, step, epoch, last_eval, curve = time.time(), 0, 0, 0.0, []
    budget = a.minutes * 60
    losses = []
    while time.time() - t0 < budget:
        sampler.set_epoch(epoch)
        for b in sampler:
            if time.time() - t0 >= budget:
                break
            batch = collate([prep(*train[i]) for i in b])
            feats, flen, toks, tlen = batch.feats, batch.flen, batch.toks, batch.tlen
            for g in opt.param_groups:
                g["lr"] = a.lr * lr_factor(step, epoch, cfg.train.warmup_steps, a.decay)
            loss, stats = model(feats, flen, toks, tlen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip)
            opt.step()
            step += 1
            losses.append(stats.get("ctc_loss", stats["loss"]))
            el = time.time() - t0
            if el - last_eval >= a.eval_every * 60:
                last_eval = el
                rec = {"minutes": round(el / 60, 2), "step": step, "epoch": epoch,
                       "ctc_loss": round(sum(losses[-50:]) / len(losses[-50:]), 3), "wer": evaluate()}
                curve.append(rec)
                print(json.dumps(rec), flush=True)
        epoch += 1
    rec = {"minutes": round((time.time() - t0) / 60, 2), "step": step, "epoch": epoch,
           "ctc_loss": round(sum(losses[-50:]) / max(len(losses[-50:]), 1), 3), "wer": evaluate()}
    curve.append(rec)
    print(json.dumps(rec), flush=True)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                  "parameters": parameter_count(model), "curve": curve}, indent=1))


if __name__ == "__main__":
    main()
