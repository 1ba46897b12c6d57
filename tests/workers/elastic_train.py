"""Elastic training with hx.DistributedOptimizer under ``horovodrun --host-discovery-script``.

Usage (launched by tests/test_elastic_horovod.py): ``elastic_train.py CODEC PIPELINE``.

A regression problem of N samples, dealt as fixed global batches (a seeded shuffle per epoch).
The committed state holds the model, the optimizer (codec state included), the epoch, and the
number of global batches consumed this epoch (``state.batch``): after a reset the remaining batches
are re-dealt round-robin to the current workers, the last step padded with empty batches, so every
worker runs the same number of steps and no batch is dropped. ``state.commit()`` every COMMIT steps
and at each epoch end.

Fault plan (environment):
  HX_KILL_HOST, HX_KILL_EPOCH, HX_KILL_STEP: the worker on that host takes its batch, runs backward
    (its reductions are in flight), removes its host from the discovery file and SIGKILLs itself;
  HX_READD_AFTER: rank 0, after that many steps on a smaller world, lists the host again.
Every completed step is appended to HX_TEST_OUT/seen.<host>.<pid>.jsonl (epoch, step, world
size, sample ids); each worker's final report goes to rank<r>.json.
"""
import hashlib
import json
import os
import random
import signal
import sys
import time

import torch
import horovod.torch as hvd

import horovod_ext as hx
from tests.workers.common import emit

N, BATCH, EPOCHS, COMMIT = 360, 4, 2, 5
OUT = os.environ.get("HX_TEST_OUT", "")
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")
HOSTS_FILE = os.environ.get("HX_HOSTS_FILE", "")


def global_batches(epoch: int) -> list[list[int]]:
    order = list(range(N))
    random.Random(1000 + epoch).shuffle(order)
    return [order[i:i + BATCH] for i in range(0, N, BATCH)]


def my_batch(batches, done: int, size: int, rank: int) -> list[int]:
    i = done + rank
    return batches[i] if i < len(batches) else []     # past the end: an empty batch, the step still taken


def write_hosts(lines) -> None:
    tmp = HOSTS_FILE + f".{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("".join(f"{h}\n" for h in lines))
    os.replace(tmp, HOSTS_FILE)


def main() -> int:
    codec, pipeline = sys.argv[1], sys.argv[2] == "pipe"
    hvd.init()
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N, 16, generator=gen)
    y = X @ torch.randn(16, 1, generator=gen) + 0.1 * torch.randn(N, 1, generator=gen)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5),
                                  model.named_parameters(), compression=hx.Compression.from_spec(codec),
                                  pipeline=pipeline, adaptive=False)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, batch=0, step=0)
    seen_path = os.path.join(OUT, f"seen.{HOST}.{os.getpid()}.jsonl")
    sizes = []
    kill_host = os.environ.get("HX_KILL_HOST")
    kill_epoch, kill_step = int(os.environ.get("HX_KILL_EPOCH", -1)), int(os.environ.get("HX_KILL_STEP", -1))
    readd_after = int(os.environ.get("HX_READD_AFTER", -1))
    marker = os.path.join(OUT, "killed")
    shrunk = {"steps": 0, "readded": False}

    def on_reset():
        sizes.append(hvd.size())
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        if not sizes or sizes[-1] != hvd.size():
            sizes.append(hvd.size())
        with open(seen_path, "a") as log:
            while state.epoch < EPOCHS:
                batches = global_batches(state.epoch)
                size, rank = hvd.size(), hvd.rank()
                while state.batch < len(batches):
                    ids = my_batch(batches, state.batch, size, rank)
                    opt.zero_grad()
                    if ids:
                        loss = torch.nn.functional.mse_loss(model(X[ids]), y[ids])
                        loss.backward()
                    if (HOST == kill_host and state.epoch == kill_epoch and state.step == kill_step
                            and not os.path.exists(marker)):
                        open(marker, "w").write(f"{HOST} epoch {state.epoch} step {state.step}\n")
                        with open(HOSTS_FILE) as f:
                            write_hosts([h for h in f.read().split() if h.split(":")[0] != HOST])
                        time.sleep(0.2)       # the others are already waiting in this step's reductions
                        os.kill(os.getpid(), signal.SIGKILL)
                    opt.step()
                    state.batch += size
                    state.step += 1
                    log.write(json.dumps({"epoch": state.epoch, "step": state.step, "size": size, "rank": rank,
                                          "ids": ids}) + "\n")
                    log.flush()
                    if size < 3 and rank == 0 and readd_after >= 0 and not shrunk["readded"]:
                        shrunk["steps"] += 1
                        if shrunk["steps"] >= readd_after:
                            with open(HOSTS_FILE) as f:
                                write_hosts(f.read().split() + [f"{kill_host}:1"])
                            shrunk["readded"] = True
                            time.sleep(3)     # discovery runs every second; the next commit sees the change
                    if state.step % COMMIT == 0:
                        state.commit()
                opt.flush()
                state.epoch += 1
                state.batch = 0
                state.commit()

    t0 = time.time()
    train(state)
    with torch.no_grad():
        final_loss = float(torch.nn.functional.mse_loss(model(X), y))
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    emit({"rank": hvd.rank(), "size": hvd.size(), "host": HOST, "sizes": sizes, "step": state.step,
          "final_loss": final_loss, "digest": digest, "seconds": time.time() - t0,
          "elastic": dict(hx.elastic.stats)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
