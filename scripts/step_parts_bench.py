"""Micro-benchmark: the parts of a cpu-small training step beside the encoder, on one thread.

    .venv/bin/python scripts/step_parts_bench.py [--config recipes/bfa/conf/cpu-small.yaml] [--json out/step_parts.json]

Times, on one batch of fixed shape (default: 13 utterances, 41 encoder frames, 25 word pieces: the mean batch of the
60-minute corpus as ``scripts/step_cost_split.py`` reports it), forward + backward of
* the config's attention decoder (cpu-small since 2026-12-06: additive, nothing fed back),
* the model's decoder with location-aware attention and the context fed back into the LSTM cell (one step per word
  piece; cpu-small's before), and those with nothing fed back (``model.dec_input_feeding: false``) and additive or
  dot-product attention (``model.attention``), which run all word pieces at once,
* the word-piece CTC loss,
and the optimizer-side work of one step on all of the model's weights: Adam as a per-weight loop, with ``foreach``,
fused (what ``asr.train.make_adam`` builds), gradient clipping and ``zero_grad``. Random features and tokens (the
cost does not depend on the values). Prints ms per call, writes JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent


def ms_per_call(fn, n: int) -> float:
    for _ in range(3):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return 1000 * (time.perf_counter() - t) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "recipes/bfa/conf/cpu-small.yaml"))
    p.add_argument("--batch", type=int, default=13)
    p.add_argument("--frames", type=int, default=41, help="encoder frames (after the time reduction)")
    p.add_argument("--pieces", type=int, default=25, help="word pieces per utterance, end symbol included")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", default="out/step_parts.json")
    args = p.parse_args()
    from asr.config import load_config
    from asr.models.bfa import BFA
    from asr.train import make_adam
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = load_config(args.config, [])
    model = BFA(dataclasses.replace(cfg.model, vocab_size=args.vocab, phone_ctc_weight=0.0)).train()
    B, T, L, V = args.batch, args.frames, args.pieces, args.vocab
    D = model.encoder.out_dim
    enc = torch.randn(B, T, D, requires_grad=True)
    lengths = torch.randint(T // 2, T + 1, (B,))
    lengths[0] = T
    tokens_in = torch.randint(0, V, (B, L))
    tokens_out = torch.randint(0, V, (B, L))
    res = {}

    def decoder_pass(decoder):
        def fn():
            logits = decoder(enc, lengths, tokens_in)
            F.cross_entropy(logits.reshape(-1, V + 1), tokens_out.reshape(-1)).backward()
        return fn
    res["decoder_ms"] = ms_per_call(decoder_pass(model.decoder), args.repeats)
    # The decoders the model builds: location-aware with feedback, and with nothing fed back (all pieces at once)
    for name, attention, feeding in [("location_fed_back", "location", True), ("parallel_additive", "additive", False),
                                     ("parallel_dot", "dot", False)]:
        variant = BFA(dataclasses.replace(cfg.model, vocab_size=V, phone_ctc_weight=0.0, attention=attention,
                                          dec_input_feeding=feeding)).train()
        res[f"{name}_decoder_ms"] = ms_per_call(decoder_pass(variant.decoder), args.repeats)

    def ctc():
        lp = F.log_softmax(model.ctc_head(enc), -1).transpose(0, 1)
        F.ctc_loss(lp, tokens_in.clamp_max(V - 1), lengths, torch.full((B,), min(L, T // 2)), blank=V,
                   zero_infinity=True).backward()
    res["wordpiece_ctc_ms"] = ms_per_call(ctc, args.repeats)

    params = list(model.parameters())
    for q in params:
        q.grad = torch.randn_like(q)
    for name, kw in [("adam_loop_ms", dict(foreach=False)), ("adam_foreach_ms", dict(foreach=True))]:
        res[name] = ms_per_call(torch.optim.Adam(params, 1e-4, **kw).step, 2 * args.repeats)
    res["adam_fused_ms"] = ms_per_call(make_adam(params, 1e-4, 0.0, fused=True).step, 2 * args.repeats)
    res["clip_grad_norm_ms"] = ms_per_call(lambda: nn.utils.clip_grad_norm_(params, 5.0), 2 * args.repeats)
    res["zero_grad_ms"] = ms_per_call(lambda: model.zero_grad(set_to_none=False), 2 * args.repeats)
    res["weights"] = sum(q.numel() for q in params)
    res["weight_tensors"] = len(params)
    for k, val in res.items():
        print(f"{k:32s} {val:.2f}" if isinstance(val, float) else f"{k:32s} {val}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"config": args.config, "threads": 1, "batch": B, "frames": T,
                                           "pieces": L, "vocab": V, "results": res}, indent=1))


if __name__ == "__main__":
    main()
