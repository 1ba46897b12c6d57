"""hx-bench codec: seconds and GB/s of every codec's compress and decompress, one thread, no network.

    hx-bench codec                                   # 22M float32 elements, every codec, JSON
    hx-bench codec --numel 1000000 --methods global_qsgd8,topk0.01 --repeat 9
    hx-bench codec --shapes bfa --methods powersgd4,topk0.01     # the BFA model's 34 tensors

Each codec reduces one gradient through its real code path (the same generator the optimizer
drives) with Horovod running as a single worker, so the collectives are local copies; the codec's
own timers (``ctx.compressing()`` / ``ctx.decompressing()``) split its work from them. As in the
optimizer, a codec that can write its result into a given buffer gets one (``ctx.out``, reused
from run to run, so no fresh 88 MB tensor's page faults are timed), and the codec's step hooks run
between runs with a plain SGD parameter group (DEF keeps its steady-state state). Global-QSGD
runs twice, on the native kernels and on the torch reference (``@reference``), when the native
ones are available. GB/s counts the float32 gradient (4 bytes per element) per second. Reports the
median over ``--repeat`` runs after one untimed run, and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

DEFAULT = "fp16,bf16,global_qsgd8,global_qsgd4,global_qsgd2,topk0.01,random_block0.01"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="hx-bench codec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=int, default=22_000_000, help="gradient elements (default 22M, the BFA model's size)")
    p.add_argument("--shapes", choices=["flat", "bfa"], default="flat",
                   help="flat: one tensor of --numel elements (default); bfa: the hx-bench BFA model's 34 parameter "
                        "tensors (22.2M elements; PowerSGD's cost depends on the matrix shapes)")
    p.add_argument("--methods", default=DEFAULT, help=f"codec specs, comma-separated (default {DEFAULT})")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per codec (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--json", default="out/hx-bench-codec.json", help="output JSON (default out/hx-bench-codec.json)")
    return p.parse_args(argv)


def measure(spec: str, grads, repeat: int, reference: bool = False) -> dict:
    """One codec over ``grads`` (a tensor, or a list of tensors: one model's parameters, each with its
    own codec state and output buffer), ``repeat`` timed runs after an untimed one."""
    import horovod.torch as hvd
    import horovod_ext as hx
    from horovod_ext import kernels
    from horovod_ext.communicator import Communicator
    from horovod_ext.compression import ReduceContext
    from horovod_ext.reduction import Reduction, complete

    import torch
    grads = grads if isinstance(grads, (list, tuple)) else [grads]
    codec = hx.Compression.from_spec(spec)
    states = [{} for _ in grads]
    outs = [torch.empty_like(g) if codec.uses_out else None for g in grads]
    params = [torch.zeros_like(g) for g in grads]
    group = {"lr": 0.01, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}
    comp, decomp, comp_cpu, decomp_cpu = [], [], [], []
    for i in range(repeat + 1):
        comm = Communicator()
        reds = []
        for j, g in enumerate(grads):
            ctx = ReduceContext(name=f"bench.{j}", state=states[j], comm=comm, op=hvd.Average, param=params[j],
                                out=outs[j])
            reds.append((g.clone(), ctx))
        if reference:
            with kernels.reference_only():
                complete([Reduction(codec, x, ctx) for x, ctx in reds])
        else:
            complete([Reduction(codec, x, ctx) for x, ctx in reds])
        for j in range(len(grads)):
            codec.before_step(params[j], states[j], group)
            codec.after_step(params[j], states[j], group)
        if i:                                       # the first run warms caches and allocators up
            comp.append(comm.stats.compress_s)
            decomp.append(comm.stats.decompress_s)
            comp_cpu.append(comm.stats.compress_cpu_s)
            decomp_cpu.append(comm.stats.decompress_cpu_s)
    c, d = statistics.median(comp), statistics.median(decomp)
    numel = sum(g.numel() for g in grads)
    gb = numel * 4 / 1e9
    return {"method": spec + ("@reference" if reference else ""), "numel": numel, "tensors": len(grads),
            "compress_s": c, "decompress_s": d, "total_s": c + d, "compress_GBps": gb / c if c else None,
            "decompress_GBps": gb / d if d else None, "compress_cpu_s": statistics.median(comp_cpu),
            "decompress_cpu_s": statistics.median(decomp_cpu), "runs_s": [a + b for a, b in zip(comp, decomp)]}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    import horovod.torch as hvd
    from horovod_ext import kernels
    torch.set_num_threads(args.threads)
    hvd.init()
    if hvd.size() != 1:
        print("hx-bench codec runs as one process (not under horovodrun)", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    if args.shapes == "bfa":
        from .models import build
        model = build("bfa", 1, 40)[0]
        grad = [torch.randn(p.shape, generator=gen) for p in model.parameters()]
        what = f"the BFA model's {len(grad)} tensors ({sum(g.numel() for g in grad) / 1e6:.1f}M float32 elements)"
    else:
        grad = torch.randn(args.numel, generator=gen)
        what = f"{args.numel / 1e6:.1f}M float32 elements"
    print(f"hx-bench codec: {what}, {args.threads} thread(s), median of {args.repeat}; kernels: {kernels.status()}")
    print("| codec | compress ms | decompress ms | total ms | compress GB/s | decompress GB/s |\n|---|---|---|---|---|---|")
    records = []
    for spec in [s.strip() for s in args.methods.split(",") if s.strip()]:
        runs = [False]
        if spec.startswith("global_qsgd") and kernels.native() is not None:
            runs.append(True)
        for ref in runs:
            t0 = time.perf_counter()
            r = measure(spec, grad, args.repeat, reference=ref)
            r["bench_s"] = time.perf_counter() - t0
            records.append(r)
            fmt = lambda v: f"{v:.2f}" if v else "-"  # noqa: E731
            print(f"| {r['method']} | {1e3 * r['compress_s']:.1f} | {1e3 * r['decompress_s']:.1f} | "
                  f"{1e3 * r['total_s']:.1f} | {fmt(r['compress_GBps'])} | {fmt(r['decompress_GBps'])} |", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"command": "hx-bench codec " + " ".join(sys.argv[1:] if argv is None else argv),
                   "threads": args.threads, "shapes": args.shapes, "kernels": kernels.status(),
                   "records": records}, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
