"""Experiment: how far Adam moves one coordinate that arrives in bursts (random-block sparsification).

With a random block of ratio p, a coordinate is sent about once every 1/p steps, carrying the sum of the
gradients since it was last sent (error feedback). Adam normalizes by the root of its second moment, which
these bursts inflate: with a burst B about every 1/p steps, v ~ p * B^2, so one burst moves the coordinate by
about lr * B / sqrt(p * B^2) = lr / sqrt(p) in all, where dense Adam would have moved up to lr per step, lr / p
over the same steps. Where a coordinate's gradient has a signal-to-noise ratio (mean over standard deviation)
above about sqrt(p), random-block Adam therefore moves it only about sqrt(p) as fast as dense Adam; below it,
the noise dominates both moments and the two move alike. Error feedback cannot change this (it decides what is
sent, not how Adam scales it).

This script simulates one coordinate (gradient = snr + standard normal noise, Adam with PyTorch's defaults,
lr 1) and prints the mean displacement per step, dense against random block, for a range of signal-to-noise
ratios. One core, a few seconds.

    python scripts/adam_sparse_burst.py [--ratio 0.01] [--steps 20000] [--json out/adam_burst.json]
"""
from __future__ import annotations

import argparse
import json
import math
import random


def displacement_per_step(ratio: float, snr: float, steps: int, seed: int = 0,
                          beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-12) -> float:
    """Mean Adam displacement per step (lr 1) of one coordinate sent with probability ``ratio`` per step, its
    unsent gradients accumulated (error feedback)."""
    rng = random.Random(seed)
    m = v = x = residual = 0.0
    for t in range(1, steps + 1):
        residual += snr + rng.gauss(0.0, 1.0)
        sent = 0.0
        if rng.random() < ratio:
            sent, residual = residual, 0.0
        m = beta1 * m + (1 - beta1) * sent
        v = beta2 * v + (1 - beta2) * sent * sent
        x += (m / (1 - beta1 ** t)) / (math.sqrt(v / (1 - beta2 ** t)) + eps)
    return x / steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratio", type=float, default=0.01, help="fraction of coordinates sent per step (default 0.01)")
    p.add_argument("--steps", type=int, default=20000, help="simulated steps per setting (default 20000)")
    p.add_argument("--snr", default="0.01,0.03,0.1,0.3,1,10", help="comma-separated signal-to-noise ratios")
    p.add_argument("--json", help="also write the rows here")
    a = p.parse_args(argv)
    if not 0.0 < a.ratio <= 1.0:
        p.error(f"--ratio must be in (0, 1], got {a.ratio}")
    rows = []
    print(f"| snr | dense Adam per step | random block {a.ratio:g} per step | ratio |")
    print("|---|---|---|---|")
    for snr in (float(s) for s in a.snr.split(",")):
        dense = displacement_per_step(1.0, snr, a.steps)
        sparse = displacement_per_step(a.ratio, snr, a.steps)
        rows.append({"snr": snr, "dense": dense, "random_block": sparse, "ratio": sparse / dense})
        print(f"| {snr:g} | {dense:.4f} | {sparse:.4f} | {sparse / dense:.2f} |")
    print(f"sqrt(ratio) = {math.sqrt(a.ratio):.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ratio": a.ratio, "steps": a.steps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
