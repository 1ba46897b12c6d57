"""Rank 1 dies in the middle of training; the others must fail with a clear error, not hang."""
import os
import sys
import time

import torch
import horovod.torch as hvd

import horovod_ext as hx

hvd.init()
model = torch.nn.Linear(100, 100)
opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                              compression=hx.Compression.global_qsgd(8), pipeline=True)
for step in range(1000):
    opt.zero_grad()
    model(torch.randn(4, 100)).sum().backward()
    if hvd.rank() == 1 and step == 5:
        print("rank 1: dying now", flush=True)
        os._exit(3)
    opt.step()
    time.sleep(0.01)
print(f"rank {hvd.rank()} finished 1000 steps, which it should not have", flush=True)
sys.exit(0)
