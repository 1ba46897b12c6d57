"""PowerSGD's three products on one core: M Q, M^T P (as written, and as (P^T M)^T), P Q^T.

    .venv/bin/python scripts/powersgd_matmul_bench.py [--n 2048 --m 1024 --rank 4]

Prints the best of 20 runs in ms for each form. On this project's 2-core host (MKL), M^T P took 11.6 ms
and (P^T M)^T 0.47 ms for 2048 x 1024, rank 4: why horovod_ext's PowerSGD computes the latter.
"""
import argparse
import time

import torch


def best_ms(fn, runs: int = 20) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--m", type=int, default=1024)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    mat = torch.randn(args.n, args.m, generator=g)
    q = torch.randn(args.m, args.rank, generator=g)
    pm = torch.randn(args.n, args.rank, generator=g)
    out = torch.empty(args.n, args.m)
    print(f"{args.n} x {args.m}, rank {args.rank}, {args.threads} thread(s), best of 20, ms")
    print(f"  M Q               {best_ms(lambda: mat @ q):8.3f}")
    print(f"  M^T P             {best_ms(lambda: mat.t() @ pm):8.3f}")
    print(f"  (P^T M)^T         {best_ms(lambda: (pm.t() @ mat).t().contiguous()):8.3f}")
    print(f"  P Q^T into a buffer {best_ms(lambda: torch.mm(pm, q.t(), out=out)):6.3f}")


if __name__ == "__main__":
    main()
