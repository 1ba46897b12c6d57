"""asr-lm: train the word-piece LSTM language model used for shallow fusion (asr-eval --lm).

    asr-prep lm-text --corpus exp/corpus --out exp/corpus/lm/text.txt
    asr-lm --text exp/corpus/lm/text.txt --tokenizer exp/corpus/tokenizer/tokenizer.model --out exp/corpus/lm

Trains on one process (text only, minutes on a CPU), holds out 1% of the sentences for perplexity, writes
OUT/lm.pt atomically after every epoch (the best held-out perplexity is kept) and OUT/lm_log.jsonl.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

from .batching import pack_by_length
from .models.rnnlm import LMConfig, PieceLM, pad_pieces, save_lm


def tokenizer_digest(path) -> str:
    """sha256 of a sentencepiece model file: an LM and an acoustic model fit together only if these match."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _batches(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Length-bucketed batches of at most ``batch_tokens`` padded pieces (each sentence + 1 for eos), shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out = pack_by_length(order, [n + 1 for n in lengths], batch_tokens)
    rng.shuffle(out)
    return out


def perplexity(model: PieceLM, seqs: list[list[int]], batch_tokens: int = 8000) -> float:
    model.eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for b in _batches([len(s) for s in seqs], batch_tokens, random.Random(0)):
            loss, count = model.loss(*pad_pieces([seqs[i] for i in b]))
            nll, n = nll + float(loss), n + count
    model.train()
    return math.exp(nll / max(n, 1))


def train_lm(text, tokenizer, out_dir, config: LMConfig | None = None, epochs: int = 3, lr: float = 2e-3,
             batch_tokens: int = 4000, max_minutes: float = 0.0, seed: int = 0) -> Path:
    import sentencepiece as spm
    from tqdm import tqdm
    lines = [ln.strip() for ln in Path(text).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ValueError(f"{text}: need at least 2 sentences, found {len(lines)}")
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    seqs = [s for s in (sp.encode(ln, out_type=int) for ln in lines) if s]
    rng = random.Random(seed)
    rng.shuffle(seqs)
    n_dev = max(1, len(seqs) // 100)
    dev, train = seqs[:n_dev], seqs[n_dev:]
    torch.manual_seed(seed)
    model = PieceLM(config or LMConfig(vocab_size=sp.get_piece_size()))
    if model.config.vocab_size != sp.get_piece_size():
        raise ValueError(f"LM vocab_size {model.config.vocab_size} != {tokenizer}'s {sp.get_piece_size()} pieces")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "lm_log.jsonl", "a")
    meta = {"tokenizer": str(tokenizer), "tokenizer_digest": tokenizer_digest(tokenizer), "text": str(text)}
    best, start = float("inf"), time.time()
    print(f"asr-lm: {len(train)} training / {len(dev)} held-out sentences, "
          f"{sum(len(s) for s in train)} pieces; {sum(p.numel() for p in model.parameters())} parameters",
          file=sys.stderr)
    for epoch in range(epochs):
        batches = _batches([len(s) for s in train], batch_tokens, rng)
        total, count = 0.0, 0
        bar = tqdm(batches, desc=f"LM epoch {epoch}", dynamic_ncols=True, disable=not sys.stderr.isatty())
        for step, b in enumerate(bar):
            loss, n = model.loss(*pad_pieces([train[i] for i in b]))
            opt.zero_grad()
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            total, count = total + float(loss.detach()), count + n
            if step % 50 == 0:
                bar.set_postfix(ppl=f"{math.exp(total / count):.2f}")
            if max_minutes and time.time() - start > 60 * max_minutes:
                break
        dev_ppl = perplexity(model, dev)
        rec = {"epoch": epoch, "train_ppl": math.exp(total / max(count, 1)), "dev_ppl": dev_ppl,
               "minutes": (time.time() - start) / 60}
        log.write(json.dumps(rec) + "\n")
        log.flush()
        print(f"asr-lm: epoch {epoch}: train perplexity {rec['train_ppl']:.2f}, held-out {dev_ppl:.2f} "
              f"({rec['minutes']:.1f} min)", file=sys.stderr)
        if dev_ppl < best:
            best = dev_ppl
            save_lm(model, out / "lm.pt", dev_ppl=dev_ppl, epoch=epoch, **meta)
        if max_minutes and time.time() - start > 60 * max_minutes:
            print(f"asr-lm: stopping after epoch {epoch}: --max-minutes {max_minutes} reached", file=sys.stderr)
            break
    return out / "lm.pt"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="asr-lm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True, help="one sentence per line (asr-prep lm-text)")
    p.add_argument("--tokenizer", required=True, help="the acoustic model's sentencepiece model")
    p.add_argument("--out", required=True, help="output folder (OUT/lm.pt, OUT/lm_log.jsonl)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256, help="LSTM units (default 256)")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--emb-dim", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--batch-tokens", type=int, default=4000, help="pieces per batch, padding included")
    p.add_argument("--max-minutes", type=float, default=0.0,
                   help="stop training after this many minutes (the partial epoch is still evaluated; 0: no limit)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    for path, what in ((a.text, "--text"), (a.tokenizer, "--tokenizer")):
        if not Path(path).exists():
            raise SystemExit(f"asr-lm: {what} {path}: file not found")
    import sentencepiece as spm
    vocab = spm.SentencePieceProcessor(model_file=a.tokenizer).get_piece_size()
    try:
        train_lm(a.text, a.tokenizer, a.out, LMConfig(vocab, a.emb_dim, a.hidden, a.layers), a.epochs, a.lr,
                 a.batch_tokens, a.max_minutes, a.seed)
    except ValueError as e:
        raise SystemExit(f"asr-lm: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
