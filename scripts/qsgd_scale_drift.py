#!/usr/bin/env python
"""How far Global-QSGD's bucket scales move from one step to the next on real BFA training (an experiment, not a
test): could a one-phase codec quantize with an earlier step's scale (times a headroom h) instead of waiting for this
step's Max allreduce?

From a checkpoint: K training steps with Adam on consecutive batches, two simulated workers per step (the update
uses their exact average). Each step's global bucket scales (max |g| over both workers, 512-element buckets, as the
codec's Max allreduce makes them) are recorded. For each headroom h and lag L (1: the step before, what an
unpipelined run has finished; 2: two steps before, all a pipelined run is sure to have) it reports:

* overflow: the share of buckets whose scale exceeds h times the scale L steps before (those would have to be sent
  again with their own scale), and the share of tensors with at least one such bucket;
* clipped: the L2 norm of what lies beyond h x the older scale, relative to the gradient's (what a codec that clips
  instead of resending would hold back for error feedback);
* the relative L2 error of the averaged gradient when the other buckets are rounded with h x the older scale
  (8 bits, m = 63 levels, the overflowing ones with their own scale), against the two-phase codec's error.

    .venv/bin/python scripts/qsgd_scale_drift.py --corpus exp/corpus_small_2500_seed0 RUN/checkpoints/epoch001.pt
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qsgd_bucket_error import grads, load_model, training_data  # noqa: E402  (corpus, checkpoint, gradients)

BUCKET, M = 512, 63


def worker_grads(model, ds, batch):
    return {n: g.reshape(-1) for n, g in grads(model, ds, batch).items()}


def rows(x):
    b = BUCKET if BUCKET < x.numel() else x.numel()
    return torch.nn.functional.pad(x, (0, (-x.numel()) % b)).view(-1, b)


def rounded(rs, s):
    s = s.clamp_min(1e-30)[:, None]
    return sum(((r / s * M) + torch.rand_like(r)).floor().clamp(-M, M) * s / M for r in rs) / len(rs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="an asr.train checkpoint (epochNNN.pt)")
    ap.add_argument("--corpus", default="exp/corpus_small_2500_seed0", help="corpus folder (train.jsonl, tokenizer, stats)")
    ap.add_argument("--steps", type=int, default=12, help="training steps to follow (default 12)")
    ap.add_argument("--lr", type=float, default=0.003, help="Adam learning rate of the steps (default 0.003)")
    ap.add_argument("--headroom", default="1.25,1.5,2,3,4", help="headrooms h to try")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ds, batches = training_data(args.corpus, 2 * args.steps)
    model = load_model(args.checkpoint)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    history = []       # per step: {name: (rows of worker 0, rows of worker 1, global scales)}
    for step in range(args.steps):
        gs = [worker_grads(model, ds, batches[2 * step + w]) for w in range(2)]
        rec = {}
        for n in gs[0]:
            rs = [rows(g[n]) for g in gs]
            rec[n] = (rs, torch.stack([r.abs().amax(1) for r in rs]).amax(0))
        history.append(rec)
        for n, p in model.named_parameters():
            p.grad = ((gs[0][n] + gs[1][n]) / 2).view_as(p)
        opt.step()
        print(f"step {step}: followed", file=sys.stderr, flush=True)
    for lag in (1, 2):
        for h in (float(x) for x in args.headroom.split(",")):
            over = buckets = tensors_over = tensors = 0
            err2 = err2_exact = ref2 = clip2 = mass2 = 0.0
            for t in range(lag, args.steps):
                for n, (rs, s) in history[t].items():
                    s_old = h * history[t - lag][n][1]
                    bad = s > s_old
                    over += int(bad.sum())
                    buckets += s.numel()
                    tensors_over += bool(bad.any())
                    tensors += 1
                    exact = sum(rs) / 2
                    used = torch.where(bad | (s_old == 0), s, s_old)
                    err2 += float((rounded(rs, used) - exact).norm() ** 2)
                    err2_exact += float((rounded(rs, s) - exact).norm() ** 2)
                    ref2 += float(exact.norm() ** 2)
                    lim = s_old[:, None]
                    clip2 += sum(float((r - r.clamp(-lim, lim)).norm() ** 2) for r in rs)
                    mass2 += sum(float(r.norm() ** 2) for r in rs)
            print(f"lag {lag} h {h:g}: buckets over {100 * over / buckets:.2f}%, tensors with one over "
                  f"{100 * tensors_over / tensors:.0f}%, relative L2 error {(err2 / ref2) ** 0.5:.4f} "
                  f"(own scale: {(err2_exact / ref2) ** 0.5:.4f}); clipped at h x the older scale: "
                  f"{100 * (clip2 / mass2) ** 0.5:.2f}% of the gradient's L2 norm")


if __name__ == "__main__":
    main()
