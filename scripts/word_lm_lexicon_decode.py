"""Experiment (not part of the library): decode a checkpoint's CTC posteriors with a word lexicon and a word n-gram
LM (KenLM) in torchaudio's lexicon decoder (flashlight-text), against the recipe's own decode.

The question: are the open-domain errors a language-model problem (a word LM over the same text, with every output
a real word, would fix them) or an acoustic one? The lexicon is every word of the LM text, spelt in the model's
word pieces; the LM is a KenLM n-gram over the same text (`lmplz`, modified Kneser-Ney). The LM weight and word
score are chosen on the first --dev-limit dev utterances, then each test manifest is decoded once.

KenLM's estimator is not on PyPI as a binary; its PyPI sdist carries the whole source. Build `lmplz` once:

    apt-get install -y libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev
    curl -sLO https://files.pythonhosted.org/packages/02/6e/f4e159cef39ea4ef2244b4aa32857d447d60a5d0ee269e1b1f8d3723c03e/kenlm-0.3.0.tar.gz
    tar xzf kenlm-0.3.0.tar.gz && cmake -S kenlm-0.3.0 -B kenlm-0.3.0/build && make -C kenlm-0.3.0/build -j2 lmplz
    C=exp/corpus_small_2500_seed0
    .venv/bin/python scripts/word_lm_lexicon_decode.py --lmplz kenlm-0.3.0/build/bin/lmplz \\
        --checkpoint exp/demo/checkpoints/last.pt --text $C/lm/text.txt --dev $C/dev.jsonl \\
        --test $C/test.jsonl --test $C/test_far.jsonl --json out/word_lm_lexicon.json

Figures: recipes/bfa/RESULTS.md (2026-12-04).
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="asr.train checkpoint with a CTC head")
    p.add_argument("--text", required=True, help="LM text, one sentence per line (asr-prep lm-text)")
    p.add_argument("--lmplz", required=True, help="KenLM's lmplz binary (see above)")
    p.add_argument("--order", type=int, default=4, help="n-gram order (default 4)")
    p.add_argument("--dev", required=True, help="manifest the weights are chosen on")
    p.add_argument("--dev-limit", type=int, default=100, help="its first N utterances (default 100)")
    p.add_argument("--test", action="append", required=True, help="manifest to decode (repeatable)")
    p.add_argument("--lm-weights", default="0.3,0.6,1.0,1.5,2.5", help="grid of LM weights")
    p.add_argument("--word-scores", default="-1,0,1,2,4", help="grid of per-word scores")
    p.add_argument("--beam", type=int, default=50)
    p.add_argument("--json", help="write the figures here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    from torchaudio.models.decoder import ctc_decoder

    from asr.evaluate import load_checkpoint
    from asr.decode import utterance_ctc_log_probs
    from asr.loader import SpeechDataset
    from asr.metrics import corpus_errors

    model, tok, norm, _ = load_checkpoint(args.checkpoint)
    if model.ctc_head is None:
        raise SystemExit(f"word_lm_lexicon_decode: {args.checkpoint} has no CTC head")
    V = model.config.vocab_size
    tokens = [tok.sp.id_to_piece(i) for i in range(V)] + ["<ctc_blank>", "<ctc_sil>"]   # blank = V (model's eos)
    work = Path(tempfile.mkdtemp(prefix="word_lm_"))
    lexicon, arpa = work / "lexicon.txt", work / f"{args.order}gram.arpa"
    words = sorted({w for line in Path(args.text).read_text().splitlines() for w in line.split()})
    lexicon.write_text("".join(f"{w} {' '.join(tok.sp.encode(w, out_type=str))}\n" for w in words))
    with open(args.text) as src, open(arpa, "w") as dst:
        subprocess.run([args.lmplz, "-o", str(args.order), "--discount_fallback", "-S", "20%", "-T", str(work)],
                       stdin=src, stdout=dst, stderr=subprocess.DEVNULL, check=True)
    print(f"{len(words)} words in the lexicon, {args.order}-gram LM {arpa}", file=sys.stderr)

    def posteriors(manifest, limit=0):
        ds = SpeechDataset(manifest, tok, norm)
        if limit:
            ds.entries = ds.entries[:limit]
        out = []
        for i, item, logp in utterance_ctc_log_probs(model, ds):
            em = torch.cat([logp, torch.full((logp.shape[0], 1), -1e4)], 1).float().contiguous()[None]
            out.append((item[3], em, ds.entries[i].get("domain")))
        return out

    def decode(utts, lm_weight, word_score):
        dec = ctc_decoder(lexicon=str(lexicon), tokens=tokens, lm=str(arpa), nbest=1, beam_size=args.beam,
                          beam_size_token=V + 1, beam_threshold=25.0, lm_weight=lm_weight, word_score=word_score,
                          unk_word="<unk>", sil_score=0.0, log_add=False, blank_token="<ctc_blank>",
                          sil_token="<ctc_sil>")
        hyps = []
        for _, em, _ in utts:
            res = dec(em, torch.tensor([em.shape[1]]))[0]
            hyps.append(" ".join(res[0].words) if res else "")
        return hyps

    def wer(utts, hyps, domain=None):
        sel = [(u[0], h) for u, h in zip(utts, hyps) if domain is None or u[2] == domain]
        return corpus_errors([r for r, _ in sel], [h for _, h in sel]).wer

    dev = posteriors(args.dev, args.dev_limit)
    grid = []
    for lmw, ws in itertools.product([float(x) for x in args.lm_weights.split(",")],
                                     [float(x) for x in args.word_scores.split(",")]):
        grid.append({"lm_weight": lmw, "word_score": ws, "dev_wer": wer(dev, decode(dev, lmw, ws))})
        print(f"dev: lm weight {lmw:g}, word score {ws:g}: WER {100 * grid[-1]['dev_wer']:.1f}%", flush=True)
    best = min(grid, key=lambda g: g["dev_wer"])
    results = {}
    for manifest in args.test:
        utts = posteriors(manifest)
        t0 = time.perf_counter()
        hyps = decode(utts, best["lm_weight"], best["word_score"])
        sec = (time.perf_counter() - t0) / max(len(utts), 1)
        results[manifest] = {"wer": wer(utts, hyps), "command": wer(utts, hyps, "command"),
                             "open": wer(utts, hyps, "open"), "seconds_per_utterance": round(sec, 4),
                             "utterances": len(utts)}
        r = results[manifest]
        print(f"{manifest}: WER {100 * r['wer']:.1f}% (commands {100 * r['command']:.1f}%, open-domain "
              f"{100 * r['open']:.1f}%), {1000 * sec:.0f} ms per utterance", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"checkpoint": args.checkpoint, "text": args.text, "words": len(words),
                                               "order": args.order, "beam": args.beam, "chosen": best,
                                               "grid": grid, "tests": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
