"""Paired run: torchaudio's CTC beam search decoder (flashlight-text) against the hand-written CTC prefix beam
search that asr.decode used before (kept below as handwritten_prefix_search; asr.decode.prefix_search now runs
torchaudio's, the faster at equal or better WER in this pair), on the same CTC log-probabilities, at equal beam, without and with the
word-piece LSTM LM (wrapped in torchaudio's CTCDecoderLM interface), lexicon-free over word pieces.

    .venv/bin/pip install flashlight-text          # torchaudio's decoder needs it
    .venv/bin/python scripts/ctc_decoder_pair.py --checkpoint exp/demo/checkpoints/last.pt \\
        --manifest exp/corpus_small_2500_seed0/test.jsonl --lm exp/corpus_small_2500_seed0/lm/lm.pt \\
        --limit 200 --json out/ctc_decoder_pair.json

Both decoders score a prefix log P_ctc + lm_weight * log P_lm (eos included at the end) + length_bonus per
piece; torchaudio's lexicon-free decoder has no per-token score, so the bonus rides on the LM score
(bonus / lm_weight per piece). The encoder runs once per utterance; the times are the searches' alone.
Besides WER it reports which decoder found the higher-scoring hypothesis under that shared score (search
errors), so a WER difference can be told apart from a scoring difference.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log1p(math.exp(-abs(a - b)))


class _LMCache:
    """LM log-probabilities of the next piece for every prefix the beam has held, computed in batches."""

    def __init__(self, lm):
        self.lm = lm
        eos = lm.config.eos
        logp, state = lm.step(torch.tensor([eos]))
        self.next_logp = {(): logp[0].tolist()}
        self.state = {(): state}

    def extend(self, prefixes) -> None:
        new = [p for p in prefixes if p not in self.next_logp]
        if not new:
            return
        hs, cs = zip(*(self.state[p[:-1]] for p in new))
        state = (torch.cat(hs, dim=1), torch.cat(cs, dim=1))
        logp, (h, c) = self.lm.step(torch.tensor([p[-1] for p in new]), state)
        for i, p in enumerate(new):
            self.next_logp[p] = logp[i].tolist()
            self.state[p] = (h[:, i:i + 1], c[:, i:i + 1])




def handwritten_prefix_search(logp: torch.Tensor, blank: int, beam: int = 8, lm=None, lm_weight: float = 0.0,
                  length_bonus: float = 0.0, prune: float = -12.0) -> list[tuple[list[int], float, float]]:
    """CTC prefix beam search over one utterance's log-probabilities ``logp`` [T, V+1].

    Unlike the best path, a prefix's probability sums over every alignment that collapses to it. While
    searching, a prefix scores log P_ctc + lm_weight * log P_lm + length_bonus * |prefix|; ``lm`` is a
    PieceLM whose eos is ``blank``. Pieces below ``prune`` (log-probability) in a frame are not tried there.
    Returns the final beam as (pieces, log P_ctc, log P_lm including eos; 0 without an LM), best first."""
    cache = _LMCache(lm) if lm is not None and lm_weight else None
    lm_total = {(): 0.0}
    beams = {(): (0.0, -math.inf)}                       # prefix -> (log p ending in blank, in non-blank)

    def total(p, pb_pnb):
        s = _logaddexp(*pb_pnb) + length_bonus * len(p)
        return s + lm_weight * lm_total[p] if cache else s

    for t in range(logp.shape[0]):
        row = logp[t]
        cand = [c for c in torch.nonzero(row > prune).flatten().tolist() if c != blank]
        lp = row.tolist()
        nxt: dict[tuple, list[float]] = {}
        for p, (pb, pnb) in beams.items():
            cur = nxt.setdefault(p, [-math.inf, -math.inf])
            cur[0] = _logaddexp(cur[0], _logaddexp(pb, pnb) + lp[blank])
            last = p[-1] if p else None
            for c in cand:
                q = p + (c,)
                ext = nxt.setdefault(q, [-math.inf, -math.inf])
                if c == last:
                    cur[1] = _logaddexp(cur[1], pnb + lp[c])          # repeat without blank: same prefix
                    ext[1] = _logaddexp(ext[1], pb + lp[c])
                else:
                    ext[1] = _logaddexp(ext[1], _logaddexp(pb, pnb) + lp[c])
                if q not in lm_total:
                    lm_total[q] = lm_total[p] + (cache.next_logp[p][c] if cache else 0.0)
        live = [kv for kv in nxt.items() if max(kv[1]) > -math.inf]     # a repeat needs a blank in between
        beams = dict(sorted(live, key=lambda kv: -total(kv[0], kv[1]))[:beam])
        if cache:
            cache.extend(beams)
    out = [(list(p), _logaddexp(*v), lm_total[p] + cache.next_logp[p][blank] if cache else 0.0)
           for p, v in beams.items()]
    return sorted(out, key=lambda x: -(x[1] + lm_weight * x[2] + length_bonus * len(x[0])))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--lm", help="asr-lm language model (OUT/lm.pt); without it only the no-LM pair runs")
    p.add_argument("--limit", type=int, default=200, help="first N utterances (0: all)")
    p.add_argument("--beam", type=int, default=8, help="beam of both decoders")
    p.add_argument("--lm-weight", type=float, default=0.5)
    p.add_argument("--length-bonus", type=float, default=3.0, help="per piece, with the LM (0 without)")
    p.add_argument("--prune", type=float, default=-12.0,
                   help="hand-written: pieces below this log-probability in a frame are not tried there")
    p.add_argument("--beam-size-token", type=int, default=0,
                   help="torchaudio: pieces tried per frame (0: all, at least as many as the hand-written tries)")
    p.add_argument("--beam-threshold", type=float, default=1000.0,
                   help="torchaudio: hypotheses this far below the best are dropped (large: the beam alone prunes, "
                        "as in the hand-written search)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:                                   # torchaudio raises RuntimeError on first use without flashlight-text
        from torchaudio.models.decoder import ctc_decoder
    except (ImportError, RuntimeError) as e:
        raise SystemExit(f"ctc_decoder_pair: torchaudio's CTC decoder is not usable ({e}); "
                         f"install it with: .venv/bin/pip install flashlight-text")

    from asr.decode import _PieceLMForFlashlight, utterance_ctc_log_probs
    from asr.evaluate import load_checkpoint
    from asr.loader import SpeechDataset
    from asr.metrics import corpus_errors
    from asr.models.rnnlm import load_lm

    model, tok, norm, _ = load_checkpoint(args.checkpoint)
    if model.ctc_head is None:
        raise SystemExit(f"ctc_decoder_pair: {args.checkpoint} has no CTC head")
    lm = None
    if args.lm:
        lm, _ = load_lm(args.lm)
        if lm.config.vocab_size != model.config.vocab_size:
            raise SystemExit(f"ctc_decoder_pair: {args.lm} has {lm.config.vocab_size} pieces, the model "
                             f"{model.config.vocab_size}")
    ds = SpeechDataset(args.manifest, tok, norm)
    if args.limit:
        ds.entries = ds.entries[:args.limit]

    # CTC log-probabilities once per utterance; the dummy silence column (never emitted) is flashlight's sil_token.
    V, blank = model.config.vocab_size, model.config.eos
    t0 = time.perf_counter()
    utts = [(item[3], logp) for _, item, logp in utterance_ctc_log_probs(model, ds)]
    skipped = len(ds) - len(utts)
    encode_s = (time.perf_counter() - t0) / max(len(utts), 1)
    pieces = [tok.sp.id_to_piece(i) for i in range(V)]
    tokens = pieces + ["<ctc_blank>", "<ctc_sil>"]
    if len(set(tokens)) != len(tokens):
        raise SystemExit("ctc_decoder_pair: the tokenizer's pieces collide with <ctc_blank>/<ctc_sil>")
    sil = V + 1

    def hand_written(logp, use_lm):
        return handwritten_prefix_search(logp, blank, args.beam, lm if use_lm else None, args.lm_weight if use_lm else 0.0,
                             args.length_bonus if use_lm else 0.0, args.prune)[0][0]

    def torchaudio_decoder(use_lm):
        dec = ctc_decoder(lexicon=None, tokens=tokens,
                          lm=_PieceLMForFlashlight(lm, args.length_bonus / args.lm_weight) if use_lm else None,
                          nbest=1, beam_size=args.beam, beam_size_token=args.beam_size_token or V + 1,
                          beam_threshold=args.beam_threshold, lm_weight=args.lm_weight if use_lm else 0.0,
                          sil_score=0.0, log_add=True, blank_token="<ctc_blank>", sil_token="<ctc_sil>")

        def run(logp):
            em = torch.cat([logp, torch.full((logp.shape[0], 1), -1e4)], dim=1).float().contiguous()[None]
            hyp = dec(em, torch.tensor([em.shape[1]]))[0][0]
            return [int(t) for t in hyp.tokens if int(t) not in (blank, sil)]
        return run

    def shared_score(hyps, use_lm):
        """log P_ctc + lm_weight * log P_lm + bonus * |hyp| of each utterance's chosen hypothesis."""
        out = []
        for (_, logp), h in zip(utts, hyps):
            nll = F.ctc_loss(logp[:, None], torch.tensor([h or [0]]), torch.tensor([logp.shape[0]]),
                             torch.tensor([len(h)]), blank=blank, reduction="sum")
            s = -float(nll)
            if use_lm:
                s += args.lm_weight * lm.score([h])[0] + args.length_bonus * len(h)
            out.append(s)
        return out

    runs = []
    for use_lm in ([False, True] if lm is not None else [False]):
        pair = {}
        for name, decode in (("hand-written prefix_search", lambda lp, u=use_lm: hand_written(lp, u)),
                             ("torchaudio ctc_decoder", torchaudio_decoder(use_lm))):
            t0 = time.perf_counter()
            hyps = [decode(logp) for _, logp in utts]
            sec = (time.perf_counter() - t0) / max(len(utts), 1)
            e = corpus_errors([ref for ref, _ in utts], [tok.decode(h) for h in hyps])
            pair[name] = hyps
            runs.append({"decoder": name, "lm": use_lm, "seconds_per_utterance": round(sec, 5), "wer": e.wer,
                         "ser": e.ser, "ref_words": e.ref_words, "errors": e.errors})
            print(f"{name:28s} LM {'yes' if use_lm else 'no ':3s}  {1000 * sec:8.1f} ms/utt  WER {100 * e.wer:6.2f}%  "
                  f"SER {100 * e.ser:6.2f}%", flush=True)
        (a_name, a), (b_name, b) = pair.items()
        sa, sb = shared_score(a, use_lm), shared_score(b, use_lm)
        cmp = {"same_hypothesis": sum(x == y for x, y in zip(a, b)),
               f"{a_name} scores higher": sum(x > y + 1e-3 for x, y in zip(sa, sb)),
               f"{b_name} scores higher": sum(y > x + 1e-3 for x, y in zip(sa, sb))}
        runs[-1]["versus_hand_written"] = runs[-2]["versus_torchaudio"] = cmp
        print(f"  of {len(utts)} utterances: {cmp}")

    result = {"checkpoint": args.checkpoint, "manifest": args.manifest, "lm": args.lm, "utterances": len(utts),
              "skipped_utterances": skipped, "beam": args.beam, "lm_weight": args.lm_weight,
              "length_bonus": args.length_bonus, "prune": args.prune,
              "beam_size_token": args.beam_size_token or V + 1, "beam_threshold": args.beam_threshold,
              "encode_seconds_per_utterance": round(encode_s, 5), "threads": args.threads, "runs": runs}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
