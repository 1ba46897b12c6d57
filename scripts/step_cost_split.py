"""Micro-benchmark: what one training step of a config's model costs on one thread, on the recipe's own batches.

    .venv/bin/python scripts/step_cost_split.py --corpus exp/corpus_small_2500_seed0 [--config ...] [--bf16] [key=value ...]

Batches are the corpus's training utterances packed as the trainer packs them (train.batch_seconds,
train.max_batch), their word pieces from the corpus's tokenizer, and random features of each utterance's length
(the model's cost does not depend on the values). For each batch: the whole step (forward, backward, Adam) and the
encoder's forward + backward alone; the difference is the decoder, the CTC head and the optimizer. ``--bf16``
repeats the steps under CPU autocast to bfloat16 (the trainer keeps fp32 on the CPU). Compare the result with the
recipe's ms per step (train_log.jsonl) to see what the 2-worker run adds around the model: loader workers,
Horovod's threads, the codec. Prints a summary, writes JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import random
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def synthetic_batch(b, recs, sp, dim: int, generator=None):
    """The model's inputs for utterances ``b`` of ``recs``: random features of each one's length (100 frames
    per second), its real word pieces (-1 padded); (feats, flen, toks, tlen)."""
    ids = [sp.encode(recs[i]["text"]) for i in b]
    flen = torch.tensor([int(recs[i]["duration"] * 100) for i in b])
    feats = torch.randn(len(b), int(flen.max()), dim, generator=generator)
    toks = torch.full((len(b), max(map(len, ids))), -1)
    for j, t in enumerate(ids):
        toks[j, :len(t)] = torch.tensor(t)
    return feats, flen, toks, torch.tensor([len(t) for t in ids])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="a corpus folder (train.jsonl, tokenizer/*.model)")
    p.add_argument("--config", default=str(ROOT / "recipes/bfa/conf/cpu-small.yaml"))
    p.add_argument("--batches", type=int, default=30, help="batches timed (after 3 warm-up batches)")
    p.add_argument("--bf16", action="store_true", help="also time the steps under CPU autocast to bfloat16")
    p.add_argument("--json", default="out/step_cost_split.json")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. train.fused_adam=false model.enc_layers=7")
    args = p.parse_args()
    import sentencepiece as spm
    from asr.config import load_config
    from asr.loader import eval_batches
    from asr.models.bfa import BFA
    torch.set_num_threads(1)
    cfg = load_config(args.config, args.overrides)
    corpus = Path(args.corpus)
    recs = [json.loads(line) for line in open(corpus / "train.jsonl")]
    models = glob.glob(str(corpus / "tokenizer" / "*.model"))
    if not models:
        raise SystemExit(f"step_cost_split: no tokenizer model under {corpus / 'tokenizer'} (run.sh stage 1 makes it)")
    sp = spm.SentencePieceProcessor(model_file=models[0])
    durs = [r["duration"] for r in recs]
    batches = eval_batches(durs, cfg.train.batch_seconds, cfg.train.max_batch)
    random.Random(0).shuffle(batches)
    batches = batches[:args.batches + 3]
    torch.manual_seed(0)
    model = BFA(dataclasses.replace(cfg.model, phone_ctc_weight=0.0, vocab_size=sp.get_piece_size()))
    dim = model.config.feat_dim
    model.train()
    from asr.train import make_adam
    opt = make_adam(model.parameters(), 1e-4, 0.0, fused=cfg.train.fused_adam)   # the trainer's Adam
    results = {}
    for name, dtype in [("fp32", None)] + ([("bf16", torch.bfloat16)] if args.bf16 else []):
        full, enc, shapes = [], [], []
        amp = lambda: torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        for k, b in enumerate(batches):
            feats, flen, toks, tlen = synthetic_batch(b, recs, sp, dim)
            t0 = time.perf_counter()
            opt.zero_grad()
            with amp():
                loss, _ = model(feats, flen, toks, tlen)
            loss.backward()
            opt.step()
            t1 = time.perf_counter()
            model.zero_grad()
            with amp():
                out, _ = model.encode(feats, flen)
            out.float().sum().backward()
            t2 = time.perf_counter()
            if k >= 3:
                full.append(t1 - t0)
                enc.append(t2 - t1)
                shapes.append((len(b), int(flen.max()), int(tlen.max())))
        n = len(full)
        results[name] = {"step_ms": 1000 * sum(full) / n, "encoder_ms": 1000 * sum(enc) / n,
                         "rest_ms": 1000 * (sum(full) - sum(enc)) / n}
        print(f"{name}: {results[name]['step_ms']:.1f} ms per step, encoder forward + backward "
              f"{results[name]['encoder_ms']:.1f} ms, decoder + CTC + Adam {results[name]['rest_ms']:.1f} ms "
              f"(mean of {n} batches)")
    mean = lambda i: sum(s[i] for s in shapes) / len(shapes)
    print(f"batches: {mean(0):.1f} utterances, {mean(1):.0f} frames and {mean(2):.1f} word pieces at most, on average")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"config": args.config, "corpus": str(corpus), "threads": 1,
                                           "batches": len(shapes), "results": results}, indent=1))


if __name__ == "__main__":
    main()
