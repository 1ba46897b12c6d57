"""Probe: does the combination pick better with scores it does not have yet? Offline, on stored candidates.

``asr-eval --method combine`` keeps every utterance's pooled candidates with their features. On the 60-minute model
the best candidate of each pool reads 19.6% on dev against 24.9% for the pick, so a better scorer of the same
candidates would pay. Two kinds of new evidence are tried here, each re-tuned on dev by the same coordinate descent
as :func:`asr.combine.tune` (from the weights the stored result was picked with) and then applied to the test sets:

* ``score``: another checkpoint of the same run (an earlier epoch, or the EMA of the weights) scores every stored
  candidate with its phone CTC head (through the lexicon's spelling), its word-piece CTC head and its attention
  decoder, with the same front end as asr-eval (WPE, test-time warps). Scoring the run's own last checkpoint gives
  back the stored features (a check of the probe).
* ``tune --extra A,B --mode avg``: the three acoustic features averaged over the stored ones and each checkpoint's
  (a snapshot ensemble in score space); ``--mode sep``: each checkpoint's three scores as features of their own;
  ``--source``: three features from the pool's order (from the joint search, from a higher blank penalty, rank in
  the lexicon decoder's n-best).

    python scripts/combine_extra_scores_probe.py score --checkpoint RUN/checkpoints/epoch012.pt \\
        --manifest CORPUS/test.jsonl --result RUN/final_combine_test.json --out scores/epoch012_test.json
    python scripts/combine_extra_scores_probe.py tune --dev dev_combine.json --test RUN/final_combine_test.json \\
        --test RUN/final_combine_test_far.json --scores scores --extra epoch012,epoch010 --mode avg

``dev_combine.json`` is dev decoded with the stored weights (the command is in scripts/combine_mbr_probe.py); the
scores of a set are read from ``SCORES/<name>_<dev|test|test_far>.json``, named by the result's manifest.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ACOUSTIC = 3      # the first three of asr.combine.FEATURES: phone_ctc, piece_ctc, attention
SOURCE = ("from_joint", "from_offset", "lexicon_rank")
SOURCE_GRID = (-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0)


def score(args) -> None:
    """Every stored candidate of ``--result`` scored by ``--checkpoint``'s three acoustic heads."""
    from asr.combine import INFEASIBLE, Speller, acoustic_scores
    from asr.data.lexicon import Lexicon
    from asr.decode import encode
    from asr.evaluate import load_checkpoint
    from asr.loader import SpeechDataset, collate, eval_batches
    torch.set_num_threads(1)
    model, tok, norm, _ = load_checkpoint(args.checkpoint)
    res = json.load(open(args.result))
    cands = {h["id"]: [c["hyp"] for c in h["candidates"]] for h in res["hypotheses"] if h.get("candidates")}
    speller = Speller(Lexicon(res["lexicon"]))
    ds = SpeechDataset(args.manifest, tok, norm, feature_cache="auto", dereverb=res["dereverb"],
                       warps=[float(w) for w in res["warps"]])
    ds.entries = [e for e in ds.entries if e["id"] in cands]
    out = {}
    with torch.no_grad():
        for b in eval_batches(ds.durations, 120.0, max_batch=64):
            batch = collate([ds[i] for i in b])
            enc, enc_len = encode(model, batch.feats, batch.flen)
            phone_lp, phone_len = model.phone_log_probs(enc, enc_len)
            for k, utt in enumerate(batch.ids):
                texts = cands[utt]
                feats = acoustic_scores(model, enc[k:k + 1], int(enc_len[k]), phone_lp[k], int(phone_len[k]),
                                        [p for p, _ in speller(texts)], [tok.encode(t) for t in texts])
                out[utt] = [[max(float(x), INFEASIBLE) for x in row] for row in zip(*feats.values())]
            print(f"{len(out)} / {len(cands)}", file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    json.dump(out, open(args.out, "w"))


def _set_name(result: dict) -> str:
    return Path(result["manifest"]).stem


def _table(path: str, args):
    """[U, C, F] features, [U, C] mask, [U, C] word errors and the reference words of one stored result."""
    from asr.combine import FEATURES
    from asr.metrics import utterance_errors
    res = json.load(open(path))
    hyps = [h for h in res["hypotheses"] if h.get("candidates")]
    extra = [json.load(open(Path(args.scores) / f"{e}_{_set_name(res)}.json")) for e in args.extra]
    rows_of = []
    for h in hyps:
        rows, rank = [], 0
        for i, c in enumerate(h["candidates"]):
            f, others = list(c["features"]), [x[h["id"]][i] for x in extra]
            if args.mode == "avg":
                f[:ACOUSTIC] = [(f[j] + sum(o[j] for o in others)) / (1 + len(others)) for j in range(ACOUSTIC)]
            else:
                f += [v for o in others for v in o]
            if args.source:
                f += [float(c["from"] == "joint"), float(c["from"].startswith("lexicon+")),
                      -float(rank) if c["from"] == "lexicon" else 0.0]
                rank += c["from"] == "lexicon"
            rows.append(f)
        rows_of.append(rows)
    U, C, nf = len(hyps), max(len(r) for r in rows_of), len(rows_of[0][0])
    feats = torch.zeros(U, C, nf, dtype=torch.float64)
    mask = torch.zeros(U, C, dtype=torch.bool)
    errors = torch.full((U, C), 1 << 30, dtype=torch.long)
    for u, (h, rows) in enumerate(zip(hyps, rows_of)):
        feats[u, :len(rows)] = torch.tensor(rows, dtype=torch.float64)
        mask[u, :len(rows)] = True
        counts = utterance_errors([h["ref"]] * len(rows), [c["hyp"] for c in h["candidates"]])
        errors[u, :len(rows)] = torch.tensor([e.errors for e in counts])
    assert len(FEATURES) + (0 if args.mode == "avg" else ACOUSTIC * len(extra)) + (3 if args.source else 0) == nf
    return res, feats, mask, errors, sum(len(h["ref"].split()) for h in hyps)


def _cost(feats, mask, errors, w) -> int:
    return int(errors.gather(1, (feats @ w).masked_fill(~mask, -torch.inf).argmax(1)[:, None]).sum())


def tune(args) -> None:
    from asr.combine import FEATURES, GRIDS
    names = list(FEATURES) + ([f"{e}:{f}" for e in args.extra for f in FEATURES[:ACOUSTIC]] if args.mode == "sep"
                              else []) + (list(SOURCE) if args.source else [])
    grids = [SOURCE_GRID if n in SOURCE else GRIDS[n.split(":")[-1]] for n in names]
    dev, *dev_table = _table(args.dev, args)
    start = dev["combine"]["weights"]
    w = torch.tensor([start.get(n, 0.0) for n in names], dtype=torch.float64)
    best = first = _cost(*dev_table[:3], w)
    for _ in range(4):                       # coordinate descent on dev's word errors, as asr.combine.tune
        changed = False
        for i, grid in enumerate(grids):
            for v in grid:
                trial = w.clone()
                trial[i] = v
                c = _cost(*dev_table[:3], trial)
                if c < best:
                    best, w, changed = c, trial, True
        if not changed:
            break
    ref_words = dev_table[3]
    print(f"extra {args.extra or '-'} mode {args.mode} source {args.source}: dev {100 * first / ref_words:.2f}% at "
          f"the stored weights, {100 * best / ref_words:.2f}% tuned", {n: v for n, v in zip(names, w.tolist()) if v})
    for path in args.test:
        res, feats, mask, errors, words = _table(path, args)
        stored = torch.tensor([start.get(n, 0.0) for n in names], dtype=torch.float64)
        print(f"  {_set_name(res)}: {100 * _cost(feats, mask, errors, stored) / words:.2f}% stored -> "
              f"{100 * _cost(feats, mask, errors, w) / words:.2f}%")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score", help="score a result's stored candidates with another checkpoint")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--manifest", required=True, help="the manifest the result decoded")
    s.add_argument("--result", required=True, help="an asr-eval --method combine JSON")
    s.add_argument("--out", required=True)
    t = sub.add_parser("tune", help="re-tune the combination with the extra scores on dev, apply to the tests")
    t.add_argument("--dev", required=True)
    t.add_argument("--test", action="append", default=[])
    t.add_argument("--scores", default=".", help="the folder of score's outputs")
    t.add_argument("--extra", type=lambda s: [x for x in s.split(",") if x], default=[])
    t.add_argument("--mode", choices=("avg", "sep"), default="avg")
    t.add_argument("--source", action="store_true", help="add the pool's order as features")
    args = p.parse_args(argv)
    score(args) if args.cmd == "score" else tune(args)


if __name__ == "__main__":
    main()
