"""The worker side of hx-bench: time training steps of one model under every communication scheme.

Runs under horovodrun (hx-bench launches it). Every method trains the same model from the same
seed on the same batches; rank 0 appends one JSON record per method to ``--out-jsonl`` as soon as
it is measured, so an interrupted run keeps what it finished.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from ..kernels import status as kernels_status
from ..stats import CommStats
from .models import build, parameter_count

HOROVOD = ("hvd_fp32", "hvd_fp16")
DDP = ("ddp", "ddp_powersgd")


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bfa")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--methods", required=True)
    p.add_argument("--bandwidth-bps", type=float, default=0.0, help="link rate, for limit_s (0: unknown)")
    p.add_argument("--bandwidth", default="unshaped")
    p.add_argument("--setting", default="comm-bound")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--no-adaptive", action="store_true")
    p.add_argument("--out-jsonl", required=True)
    return p.parse_args(argv)


def _init_ddp(hvd):
    import torch.distributed as dist
    import psutil
    iface = os.environ.get("HOROVOD_GLOO_IFACE")
    addr = "127.0.0.1"
    if iface and iface in psutil.net_if_addrs():
        addr = next(a.address for a in psutil.net_if_addrs()[iface] if a.family == 2)
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    master = hvd.broadcast_object(addr, root_rank=0, name="ddp.master")
    port = hvd.broadcast_object(29500 + (os.getpid() % 1000), root_rank=0, name="ddp.port")
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=hvd.rank(), world_size=hvd.size())


def _powersgd_bytes(model, rank: int) -> int:
    total = 0
    for p in model.parameters():
        if p.dim() >= 2:
            n, m = p.shape[0], p.numel() // p.shape[0]
            total += (n + m) * rank * 4 if (n + m) * rank < n * m else p.numel() * 4
        else:
            total += p.numel() * 4
    return total


def make_optimizer(method: str, model, lr: float, hvd, hx, powersgd_rank: int, link_gbps=None, measure_steps=3,
                   cost_rule: bool = True):
    """Return (model to call, optimizer, bytes handed per step or None, codec stats getter)."""
    params = parameter_count(model)
    if method in HOROVOD:
        comp = hvd.Compression.fp16 if method == "hvd_fp16" else hvd.Compression.none
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr), model.named_parameters(),
                                       compression=comp)
        return model, opt, params * (2 if method == "hvd_fp16" else 4), None
    if method in DDP:
        from torch.nn.parallel import DistributedDataParallel
        if method == "ddp":
            ddp = DistributedDataParallel(model)
            return ddp, torch.optim.SGD(ddp.parameters(), lr=lr), params * 4, None
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
        # One bucket: PowerSGD over Gloo aborted with DDP's default 25 MB buckets (shared/notes/stack.md).
        ddp = DistributedDataParallel(model, bucket_cap_mb=1000)
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=powersgd_rank,
                                       start_powerSGD_iter=2, min_compression_rate=2)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=lr), _powersgd_bytes(model, powersgd_rank), None
    if method.startswith("hx_gossip"):
        opt = hx.Gossip.from_spec(torch.optim.SGD(model.parameters(), lr=lr), model.named_parameters(), method[3:])
        return model, opt, None, opt
    if method.startswith("hx_slowmo"):
        from ..slowmo import parse_spec
        spec, _, pipe = method[3:].partition("+")
        kw = {}
        if parse_spec(spec)["inner"]:
            kw = dict(pipeline=pipe == "pipe", adaptive=hx.Adaptive(link_gbps=link_gbps if cost_rule else None,
                                                                    measure_steps=measure_steps))
        elif pipe:
            raise ValueError(f"{method}: +pipe needs an inner codec (e.g. hx_slowmo4-global_qsgd8+pipe)")
        opt = hx.SlowMo.from_spec(torch.optim.SGD(model.parameters(), lr=lr), model.named_parameters(), spec, **kw)
        return model, opt, None, opt
    if method.startswith("hx_"):
        spec, _, pipe = method[3:].partition("+")
        opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr), model.named_parameters(),
                                      compression=hx.Compression.from_spec(spec), pipeline=pipe == "pipe",
                                      adaptive=hx.Adaptive(link_gbps=link_gbps if cost_rule else None,
                                                           measure_steps=measure_steps))
        return model, opt, None, opt
    if method == "compute":
        return model, torch.optim.SGD(model.parameters(), lr=lr), 0, None
    raise ValueError(f"unknown method {method!r}")


def time_steps(model, opt, make_batch, loss_fn, steps: int, warmup: int, seed: int, on_warm=None, on_end=None):
    """Step times after ``warmup`` untimed steps; ``on_warm()`` is called when the timed steps start and
    ``on_end()`` after the last one, before ``opt.flush()`` (whose traffic belongs to no timed step)."""
    g = torch.Generator().manual_seed(seed)
    batches = [make_batch(g) for _ in range(4)]
    times = []
    for i in range(warmup + steps):
        if i == warmup and on_warm is not None:
            on_warm()
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad()      # Horovod's optimizer takes no set_to_none (None is torch's default anyway)
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if on_end is not None:
        on_end()
    if hasattr(opt, "flush"):
        opt.flush()
    return times[warmup:]


def main(argv=None) -> None:
    import horovod.torch as hvd
    import horovod_ext as hx
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(args.threads)
    rank, n = hvd.rank(), hvd.size()
    methods = args.methods.split(",")
    if any(m in DDP for m in methods):
        _init_ddp(hvd)

    def emit(rec):
        if rank == 0:
            with open(args.out_jsonl, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"[hx-bench] {args.bandwidth:>9} {rec['method']:<24} median step {rec['median_step_s']:.3f} s"
                  + (f"  limit {rec['limit_s']:.3f} s" if rec.get("limit_s") is not None else ""), flush=True)

    # Compute alone (no communication): the floor every method shares.
    cmodel, cmake, closs = build(args.model, args.batch, args.frames)
    _, copt, _, _ = make_optimizer("compute", cmodel, 0.01, hvd, hx, args.powersgd_rank)
    compute = statistics.median(time_steps(cmodel, copt, cmake, closs, args.steps, args.warmup, seed=rank))
    compute = float(hvd.allreduce(torch.tensor(compute), name="compute", op=hvd.Max))
    params = parameter_count(cmodel)
    base = {"model": args.model, "parameters": params, "workers": n, "bandwidth": args.bandwidth,
            "bandwidth_bps": args.bandwidth_bps, "setting": args.setting, "batch": args.batch,
            "frames": args.frames, "steps": args.steps, "compute_s": compute, "kernels": kernels_status(),
            "host_cores": os.cpu_count(),
            "cost_rule": not args.no_adaptive}
    emit(dict(base, method="compute_only", median_step_s=compute, bytes_per_step=0))

    def compute_beside() -> list[float]:
        # Compute alone again (the same model and plain optimizer), right beside a method: this host's speed
        # drifts by tens of percent within one run, so a method's limit and exposed communication are taken
        # against compute measured next to it.
        return time_steps(cmodel, copt, cmake, closs, max(4, args.steps // 2), 1, seed=rank)

    for method in methods:
        before = compute_beside()
        model, make_batch, loss_fn = build(args.model, args.batch, args.frames)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        call, opt, nbytes, hx_opt = make_optimizer(method, model, 0.01, hvd, hx, args.powersgd_rank,
                                                   link_gbps=args.bandwidth_bps / 1e9 or None,
                                                   measure_steps=max(1, args.warmup - 2),
                                                   cost_rule=not args.no_adaptive)
        warm = {}
        # codec figures over the timed steps only (the first steps allocate buffers and state)
        end = {}
        on_warm = (lambda: warm.update(hx_opt.comm_stats()["total"])) if hx_opt is not None else None
        on_end = (lambda: end.update(hx_opt.comm_stats()["total"])) if hx_opt is not None else None
        times = time_steps(call, opt, make_batch, loss_fn, args.steps, args.warmup, seed=rank, on_warm=on_warm,
                           on_end=on_end)
        # SlowMo (and Gossip with -a<k>) communicate more on some steps: the median would skip those, so
        # their figure is the mean over the timed steps (a whole number of periods when tau divides --steps)
        statistic = statistics.mean if method.startswith(("hx_slowmo", "hx_gossip")) else statistics.median
        step = float(hvd.allreduce(torch.tensor(statistic(times)), name=f"t.{method}", op=hvd.Max))
        del opt, call, model
        after = compute_beside()
        here = float(hvd.allreduce(torch.tensor(statistics.median(before + after)), name=f"c.{method}", op=hvd.Max))
        rec = dict(base, method=method, median_step_s=step, step_statistic=statistic.__name__, step_times_s=times,
                   compute_s=here, compute_first_s=compute,
                   exposed_comm_s=max(step - here, 0.0), comm_fraction=max(step - here, 0.0) / step)
        if hx_opt is not None:
            st = {f: end[f] - warm.get(f, 0) for f in CommStats.__dataclass_fields__}
            st["bits_per_element"] = end["bits_per_element"]
            k = max(st["steps"], 1)
            cs = CommStats(**{f: st[f] for f in CommStats.__dataclass_fields__})
            rec["adaptive"] = hx_opt.comm_stats().get("adaptive")
            rec.update(bytes_per_step=st["bytes_handed"] / k, wire_bytes_per_step=cs.wire_bytes(n) / k,
                       bits_per_element=st["bits_per_element"], codec_s=(st["compress_s"] + st["decompress_s"]) / k,
                       compress_s=st["compress_s"] / k, decompress_s=st["decompress_s"] / k,
                       compress_cpu_s=st["compress_cpu_s"] / k, decompress_cpu_s=st["decompress_cpu_s"] / k,
                       bytes_allreduce_per_step=st["bytes_allreduce"] / k,
                       bytes_allgather_per_step=st["bytes_allgather"] / k,
                       bytes_alltoall_per_step=st["bytes_alltoall"] / k,
                       collectives_per_step=st["collectives"] / k, wait_s=st["wait_s"] / k)
            wire_s = rec["wire_bytes_per_step"] * 8 / args.bandwidth_bps if args.bandwidth_bps else 0.0
            rec["wire_s"] = wire_s
            rec["limit_s"] = max(here, wire_s)
        else:
            rec["bytes_per_step"] = rec["bytes_allreduce_per_step"] = nbytes
            wire = 2 * (n - 1) / n * nbytes
            rec["wire_bytes_per_step"] = wire
            rec["wire_s"] = wire * 8 / args.bandwidth_bps if args.bandwidth_bps else None
        emit(rec)
    if any(m in DDP for m in methods):
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
