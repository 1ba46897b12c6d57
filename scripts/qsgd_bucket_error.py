#!/usr/bin/env python
"""How much rounding noise Global-QSGD adds to real BFA gradients, per scale granularity (an experiment, not a test).

For each checkpoint: the gradients of two training batches (two simulated workers), each stochastically rounded to
m = 63 levels (8 bits, 2 workers) with a scale shared per bucket of B elements (the max |g| over both workers, as the
codec's Max allreduce makes it), averaged, and compared with the exact average: relative L2 error over all
parameters. B = 0 is one scale per tensor. The rounding is the codec's arithmetic (horovod_ext.compression.quantize)
written out in one process, so no Horovod job is needed.

    .venv/bin/python scripts/qsgd_bucket_error.py --corpus exp/corpus_small_seed0 RUN/checkpoints/epoch001.pt
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asr.checkpoint import load_checkpoint  # noqa: E402
from asr.loader import BucketBatchSampler, Normalizer, SpeechDataset, Tokenizer, collate  # noqa: E402
from asr.models.bfa import BFA, BFAConfig  # noqa: E402


def grads(model, ds, batch):
    model.zero_grad()
    b = collate([ds[i] for i in batch])
    if b.skipped:
        print(f"skipped {len(b.skipped)} utterance(s): {b.skipped[0][1]}", file=sys.stderr)
    if not b.ids:
        raise SystemExit("every utterance of a batch was skipped")
    f, fl, t, tl = b.feats, b.flen, b.toks, b.tlen
    model(f, fl, t, tl)[0].backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def rounded_average(gs, m, bucket):
    out = {}
    for name in gs[0]:
        flat = [g[name].reshape(-1) for g in gs]
        b = bucket if 0 < bucket < flat[0].numel() else flat[0].numel()
        pad = (-flat[0].numel()) % b
        rows = [torch.nn.functional.pad(x, (0, pad)).view(-1, b) for x in flat]
        s = torch.stack([r.abs().amax(1) for r in rows]).amax(0).clamp_min(1e-30)[:, None]
        q = sum(((r / s * m) + torch.rand_like(r)).floor().clamp(-m, m) * s / m for r in rows) / len(rows)
        out[name] = q.reshape(-1)[:flat[0].numel()].view_as(gs[0][name])
    return out


def training_data(corpus, batches: int):
    """The corpus's training set (clean features) and its first ``batches`` batches of 20 s of audio."""
    c = Path(corpus)
    ds = SpeechDataset(c / "train.jsonl", Tokenizer(c / "tokenizer/tokenizer.model"),
                       Normalizer(c / "stats/feature_stats.json"))
    return ds, BucketBatchSampler(ds.durations, 20.0, 48, seed=1)._batches()[:batches]


def load_model(checkpoint):
    """The BFA model of an asr.train checkpoint, in training mode."""
    obj = load_checkpoint(checkpoint, expect_keys=("model", "model_config"), what="a BFA checkpoint written by asr.train")
    model = BFA(BFAConfig(**obj["model_config"]))
    model.load_state_dict(obj["model"])
    return model.train()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoints", nargs="+", help="asr.train checkpoints (epochNNN.pt)")
    ap.add_argument("--corpus", default="exp/corpus_small_seed0", help="corpus folder (train.jsonl, tokenizer, stats)")
    ap.add_argument("--buckets", default="0,4096,512,128", help="bucket sizes to compare (0: per tensor)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ds, batches = training_data(args.corpus, 2)
    for ck in args.checkpoints:
        model = load_model(ck)
        gs = [grads(model, ds, b) for b in batches]
        exact = {n: (gs[0][n] + gs[1][n]) / 2 for n in gs[0]}
        ref = sum(float(v.norm() ** 2) for v in exact.values()) ** 0.5
        for bucket in (int(b) for b in args.buckets.split(",")):
            q = rounded_average(gs, 63, bucket)
            err = sum(float((q[n] - exact[n]).norm() ** 2) for n in exact) ** 0.5
            print(f"{ck}: bucket {bucket or 'per tensor'}: relative L2 error {err / ref:.3f}")


if __name__ == "__main__":
    main()
