"""Micro-benchmark: the BFA encoder on packed sequences against padded batches on the fused kernel.

    .venv/bin/python scripts/lstm_path_bench.py [--config recipes/bfa/conf/cpu-small.yaml] [--threads 1]

Forward + backward of the encoder of a config's model on batches of mixed lengths (the recipe's
length-bucketed batches mix lengths within about 10%, a random batch far more), one thread; median
of repeats; also the largest difference between the two paths' outputs. Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "recipes/bfa/conf/cpu-small.yaml"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", default="out/lstm_path_bench.json")
    args = p.parse_args()
    import dataclasses
    from asr.config import load_config
    from asr.models.bfa import BFA
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, [])
    rows = []
    for spread, batch, frames in [("bucketed (+-10%)", 6, 800), ("random (30-100%)", 6, 800), ("bucketed", 24, 300)]:
        g = torch.Generator().manual_seed(0)
        lo = 0.9 if "bucketed" in spread else 0.3
        lengths = (frames * (lo + (1 - lo) * torch.rand(batch, generator=g))).long()
        lengths[0] = frames
        feats = torch.randn(batch, frames, 40, generator=g)
        times, outs = {}, {}
        for fused in (False, True):
            torch.manual_seed(0)
            model = BFA(dataclasses.replace(cfg.model, phone_ctc_weight=0.0, vocab_size=300, fused_lstm=fused))
            model.train()
            model.encoder.dropout.p = 0.0
            t = []
            for r in range(args.repeats):
                t0 = time.perf_counter()
                out, _ = model.encode(feats, lengths)
                out.sum().backward()
                t.append(time.perf_counter() - t0)
            times[fused], outs[fused] = statistics.median(t[2:]), out.detach()
        diff = float((outs[True] - outs[False]).abs().max())
        rows.append({"batch": f"{batch} x {frames} frames, {spread}", "packed_ms": 1000 * times[False],
                     "fused_ms": 1000 * times[True], "speedup": times[False] / times[True], "max_abs_diff": diff})
        print(f"{rows[-1]['batch']:<40} packed {rows[-1]['packed_ms']:7.1f} ms  fused {rows[-1]['fused_ms']:7.1f} ms"
              f"  x{rows[-1]['speedup']:.2f}  max |diff| {diff:.2e}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"config": args.config, "threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
