"""Experiment: the rate of each Horovod collective between workers, one message size, for the transports
that issue 19's algorithms use (allreduce for averages, alltoall with one peer for gossip and the sparse
allreduce, allgather). Run under horovodrun, e.g. across emulated hosts:

    hx-bench hosts up 2 --bandwidth 1gbit && export PATH=/run/hx-hosts/bin:$PATH
    horovodrun -np 2 -H 198.18.1.2:1,198.18.1.3:1 --network-interface hxhost0 --gloo \
        .venv/bin/python scripts/collective_rates.py --mb 88.8
    hx-bench hosts down

Rank 0 prints, per collective, the lowest of --repeats times and the bytes each worker sent (by the
textbook count), so the effective send rate per worker is comparable across collectives.
"""
import argparse
import time

import torch
import horovod.torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=88.8, help="message size in MB (float32 elements)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunks", type=int, default=8, help="the alltoall again as this many async ops")
    args = p.parse_args()
    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    numel = int(args.mb * 1e6 / 4)
    t = torch.ones(numel)

    def best(fn):
        fn()
        times = []
        for _ in range(args.repeats):
            hvd.allreduce(torch.zeros(1), name="barrier")
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    one_peer = torch.zeros(n, dtype=torch.int32)
    one_peer[(rank + 1) % n] = numel
    rows = {
        "allreduce": (lambda: hvd.allreduce(t, name="ar", op=hvd.Sum), 2 * (n - 1) / n * numel * 4),
        "alltoall, one peer": (lambda: hvd.alltoall(t, splits=one_peer, name="a2a"), numel * 4),
        "allgather": (lambda: hvd.allgather(t[: numel // n], name="ag"), (n - 1) * numel // n * 4),
    }
    chunk = numel // args.chunks
    part = torch.zeros(n, dtype=torch.int32)
    part[(rank + 1) % n] = chunk

    def chunked():
        handles = [hvd.alltoall_async(t[i * chunk:(i + 1) * chunk], splits=part, name=f"a2a.{i}")
                   for i in range(args.chunks)]
        for h in handles:
            hvd.synchronize(h)

    rows[f"alltoall, one peer, {args.chunks} async chunks"] = (chunked, chunk * args.chunks * 4)
    for name, (fn, sent) in rows.items():
        s = best(fn)
        if rank == 0:
            print(f"{n} workers, {name:<20} {sent / 1e6:8.1f} MB sent per worker in {s:.3f} s: "
                  f"{sent * 8 / s / 1e9:.3f} Gbit/s", flush=True)


if __name__ == "__main__":
    main()
