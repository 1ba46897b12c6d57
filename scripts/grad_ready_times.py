"""When does each gradient of hx-bench's BFA-sized model become ready during backward? (issue 16)

One process, one thread: prints forward and backward seconds and, per parameter, the milliseconds after backward
started at which its post-accumulate-grad hook fired (where a Horovod hook can start its reduction).
    .venv/bin/python scripts/grad_ready_times.py [--steps 4]
"""
import argparse
import time

import torch

from horovod_ext.bench.models import build


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="steps run; the last one is printed")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, make_batch, loss_fn = build("bfa", 1, 40)
    x, y = make_batch(torch.Generator().manual_seed(0))
    ready = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: ready.append((time.perf_counter(), name, p.numel())))
    for _ in range(args.steps):
        ready.clear()
        model.zero_grad()
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
    print(f"forward {t1 - t0:.3f} s, backward {t2 - t1:.3f} s")
    for t, name, numel in ready:
        print(f"{(t - t1) * 1e3:8.1f} ms  {name:28s} {numel:>9,}")


if __name__ == "__main__":
    main()
