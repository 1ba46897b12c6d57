"""Probe: minimum-Bayes-risk picking over ``asr-eval --method combine``'s pooled candidates, offline.

The combination picks the candidate with the highest weighted feature sum (MAP). MBR picks the candidate with the
lowest expected word edit distance to the others, each weighted by its posterior ``softmax(score / T)`` (n-best MBR,
Stolcke et al. 1997; Goel & Byrne 2000); T = 0 is MAP. T is chosen on a dev set's candidates and then applied to the
test sets. Every result must come from the same weights (the combination tuned on dev), so decode dev with them:

    asr-eval --checkpoint RUN/checkpoints/last.pt --manifest CORPUS/dev.jsonl --json dev_combine.json \\
        --method combine --lm CORPUS/lm/lm.pt --ctc-weight C --lm-weight L --length-bonus B --word-score S \\
        --blank-penalty P --combine-weights '<RUN/final_combine_test.json's combine.weights>' \\
        --combine-blank-offsets 1.5 --warps 0.9,0.95,1,1.05,1.1 --jobs 2
    python scripts/combine_mbr_probe.py dev_combine.json RUN/final_combine_test.json RUN/final_combine_test_far.json

Prints the dev WER per T, the chosen T, and each test set's WER at MAP, at the chosen T and at every T.
"""
from __future__ import annotations

import argparse
import json

import torch
from torchaudio.functional import edit_distance

from asr.combine import FEATURES
from asr.metrics import ErrorCounts, utterance_errors

TEMPERATURES = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def load(path: str) -> tuple[dict, list[dict]]:
    r = json.load(open(path))
    if r.get("method") != "combine":
        raise SystemExit(f"{path}: not an asr-eval --method combine result (method {r.get('method')!r})")
    return r, [h for h in r["hypotheses"] if h.get("candidates")]


def pick(hyps: list[dict], weights: dict, T: float) -> list[str]:
    w = torch.tensor([weights[f] for f in FEATURES], dtype=torch.float64)
    out = []
    for h in hyps:
        cands = h["candidates"]
        score = torch.tensor([c["features"] for c in cands], dtype=torch.float64) @ w
        if T == 0:
            out.append(cands[int(score.argmax())]["hyp"])
            continue
        words = [c["hyp"].split() for c in cands]
        dist = torch.tensor([[edit_distance(a, b) for b in words] for a in words], dtype=torch.float64)
        out.append(cands[int((dist @ torch.softmax(score / T, 0)).argmin())]["hyp"])
    return out


def wer(hyps: list[dict], picks: list[str]) -> float:
    return 100 * sum(utterance_errors([h["ref"] for h in hyps], picks), ErrorCounts()).wer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dev", help="asr-eval --method combine JSON of the dev set (its candidates)")
    p.add_argument("tests", nargs="+", help="asr-eval --method combine JSONs of the test sets, the same weights")
    a = p.parse_args()
    dev, dev_hyps = load(a.dev)
    weights = dev["combine"]["weights"]
    dev_wer = {T: wer(dev_hyps, pick(dev_hyps, weights, T)) for T in TEMPERATURES}
    chosen = min(TEMPERATURES, key=lambda T: dev_wer[T])      # the first of equals: the lower temperature
    print("dev WER by T:", {T: round(v, 2) for T, v in dev_wer.items()}, "chosen T", chosen)
    for path in a.tests:
        r, hyps = load(path)
        if r["combine"]["weights"] != weights:
            raise SystemExit(f"{path}: its combination weights differ from {a.dev}'s")
        by_t = {T: round(wer(hyps, pick(hyps, weights, T)), 2) for T in TEMPERATURES}
        print(f"{path}: MAP {by_t[0.0]:.2f}%, MBR at T={chosen:g} {by_t[chosen]:.2f}%; by T {by_t}")


if __name__ == "__main__":
    main()
