"""Top-k selection on the CPU: the full ``torch.topk`` against the sampled threshold (DGC's) that
``hx.Compression.topk`` uses, on one thread.

    .venv/bin/python scripts/topk_select_bench.py                      # 22M float32, k = 1%
    .venv/bin/python scripts/topk_select_bench.py --numel 2000000 --ratio 0.001 --json out/x.json

Two figures per input: the selection alone (``torch.topk(score, k)`` against
``topk_indices(score, k, "sample")``) and the codec's whole compress phase (gradient + residual,
|.|, selection, values, residual update, payload), ``TopK(ratio)`` with ``_select="full"`` against the
default. Each is the median of ``--repeats`` runs after one warm-up run; every run of the new path is
checked to select exactly torch.topk's set. Inputs: Gaussian, and heavy-tailed (Gaussian times
exp(2 * Gaussian), like real gradients with a few large entries).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import horovod.torch as hvd  # noqa: E402  (hvd.Average only; no hvd.init())

from horovod_ext.compression.base import ReduceContext  # noqa: E402
from horovod_ext.compression.sparsify import TopK, _count, topk_indices  # noqa: E402


def timed(fn, repeats: int):
    fn()                                   # warm-up (allocator, first-touch)
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


class _Stats:
    """Stands in for the communicator's statistics: every counter starts at 0."""
    def __getattr__(self, name):
        return 0.0


def compress_phase(codec: TopK, grad: torch.Tensor):
    """Run the codec's first phase (everything before the allgather) with a stub communicator."""
    comm = SimpleNamespace(size=2, stats=_Stats(), allgather=lambda payload, name: payload)
    ctx = ReduceContext(name="w", state={}, comm=comm, op=hvd.Average)
    gen = codec.reduce(grad, ctx)
    payload = next(gen)
    gen.close()
    return payload


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=int, default=22_000_000)
    p.add_argument("--ratio", type=float, default=0.01)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="out/topk-select-bench.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    k = _count(args.numel, args.ratio)
    g = torch.Generator().manual_seed(args.seed)
    inputs = {"gaussian": torch.randn(args.numel, generator=g)}
    inputs["heavy_tailed"] = inputs["gaussian"] * torch.exp(2 * torch.randn(args.numel, generator=g))
    results = []
    for tag, x in inputs.items():
        score = x.abs()
        t_full, full_runs, ref = timed(lambda: torch.topk(score, k, sorted=False).indices, args.repeats)
        t_new, new_runs, idx = timed(lambda: topk_indices(score, k, "sample"), args.repeats)
        same = bool(torch.equal(torch.sort(ref).values, torch.sort(idx).values))
        old_codec, new_codec = TopK(args.ratio), TopK(args.ratio)
        old_codec._select = "full"
        c_old, c_old_runs, p_old = timed(lambda: compress_phase(old_codec, x), args.repeats)
        c_new, c_new_runs, p_new = timed(lambda: compress_phase(new_codec, x), args.repeats)
        same_payload = bool(torch.equal(torch.sort(p_old[k:]).values, torch.sort(p_new[k:]).values))
        row = {"input": tag, "numel": args.numel, "k": k, "threads": args.threads,
               "select_full_s": t_full, "select_sampled_s": t_new, "select_speedup": t_full / t_new,
               "compress_full_s": c_old, "compress_sampled_s": c_new, "compress_speedup": c_old / c_new,
               "same_set": same and same_payload,
               "runs": {"select_full": full_runs, "select_sampled": new_runs,
                        "compress_full": c_old_runs, "compress_sampled": c_new_runs}}
        results.append(row)
        print(f"{tag:13s} n={args.numel:,} k={k:,} ({args.threads} thread): selection {1e3 * t_full:7.1f} ms -> "
              f"{1e3 * t_new:6.1f} ms ({t_full / t_new:4.1f}x); compress phase {1e3 * c_old:7.1f} ms -> "
              f"{1e3 * c_new:6.1f} ms ({c_old / c_new:4.1f}x); same set as torch.topk: {row['same_set']}", flush=True)
    meta = {"torch": torch.__version__, "command": "python scripts/topk_select_bench.py " + " ".join(sys.argv[1:]),
            "repeats": args.repeats, "statistic": "median"}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print(f"wrote {args.json}")
    return 0 if all(r["same_set"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
