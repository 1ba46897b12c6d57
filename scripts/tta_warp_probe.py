"""Experiment: test-time VTLP warps fused into the phone posteriors before the lexicon decoder.

Each utterance's features are computed at several VTLP warps from its cached (dereverberated) power spectrogram
(a warp changes the mel filterbank only, so every copy has the same frames), the phone head's posteriors of the
copies are averaged (the mean of the probabilities), and the lexicon decoder searches the mean. With one warp, 1.0,
it is the plain lexicon decoder. Run it on a trained model with the lexicon decoder's settings chosen on dev:

    python scripts/tta_warp_probe.py --checkpoint E/checkpoints/last.pt --manifest C/test.jsonl \
        --manifest C/test_far.jsonl --warps 1.0 --warps 0.9,1.0,1.1 --lm-weight 1.5 --word-score 0 --blank-penalty 1

It prints WER per manifest and warp set (and the seconds it took) and writes --json if given.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asr.evaluate import _lexicon_decoder, load_checkpoint  # noqa: E402
from asr.loader import SpeechDataset  # noqa: E402
from asr.data.manifest import audio_path  # noqa: E402
from asr.metrics import ErrorCounts, utterance_errors  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--manifest", action="append", required=True)
    p.add_argument("--warps", action="append", required=True, help="comma-separated warps, e.g. 0.9,1.0,1.1")
    p.add_argument("--lm-weight", type=float, default=1.5)
    p.add_argument("--word-score", type=float, default=0.0)
    p.add_argument("--blank-penalty", type=float, default=0.0)
    p.add_argument("--beam", type=int, default=50)
    p.add_argument("--dereverb", default="wpe")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--fuse", choices=("prob", "enc"), default="prob",
                   help="prob: the mean of the phone probabilities; enc: the mean of the encoder outputs (the heads "
                        "are linear, so the mean of their logits: every head and the attention decoder can read it)")
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(1)
    model, tok, norm, ckpt = load_checkpoint(args.checkpoint)
    lex = ckpt.config["data"]["lexicon"]
    ngram = ckpt.config.get("decode", {}).get("ngram")
    dec = _lexicon_decoder(lex, ngram, args.lm_weight, args.word_score, args.beam, model.config.phone_vocab, 1,
                           args.blank_penalty)
    sets = [[float(w) for w in s.split(",")] for s in args.warps]
    out = []
    for manifest in args.manifest:
        ds = SpeechDataset(manifest, tok, norm, feature_cache="auto", dereverb=args.dereverb)
        entries = ds.entries[:args.limit] if args.limit else ds.entries
        hyps = {tuple(s): [] for s in sets}
        secs = {tuple(s): 0.0 for s in sets}
        refs = []
        for e in entries:
            path = audio_path(e, ds.manifest)
            refs.append(e["text"])
            cache = {}
            for s in sets:
                t0 = time.perf_counter()
                logps = []
                for w in s:
                    if w not in cache:
                        f = norm(ds.feature_cache.features(path, e.get("md5"), warp=w))
                        with torch.no_grad():
                            cache[w] = model.encode(f[None], torch.tensor([f.shape[0]]))
                    logps.append(cache[w])
                with torch.no_grad():
                    if args.fuse == "enc":
                        lp, n = model.phone_log_probs(torch.stack([x[0] for x in logps]).mean(0), logps[0][1])
                    else:
                        lps = [model.phone_log_probs(*x) for x in logps]
                        lp = torch.logsumexp(torch.stack([x[0] for x in lps]), dim=0) - math.log(len(lps))
                        n = lps[0][1]
                hyps[tuple(s)].append(dec(lp, n)[0])
                secs[tuple(s)] += time.perf_counter() - t0
        for s in sets:
            total = sum(utterance_errors(refs, hyps[tuple(s)]), ErrorCounts())
            row = {"manifest": Path(manifest).name, "warps": s, "fuse": args.fuse, "wer": total.wer, "utterances": len(refs),
                   "seconds": round(secs[tuple(s)], 1)}
            out.append(row)
            print(f"{row['manifest']:>16}  warps {','.join(map(str, s)):<20} WER {100 * total.wer:6.2f}%  "
                  f"({len(refs)} utterances)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
