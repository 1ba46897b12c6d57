"""Smoke test: allreduce Sum and Max, and one hvd.DistributedOptimizer step."""
import torch
import horovod.torch as hvd

from tests.workers.common import emit

hvd.init()
r, n = hvd.rank(), hvd.size()
s = hvd.allreduce(torch.tensor([float(r + 1), 2.0 * r]), op=hvd.Sum, name="sum")
m = hvd.allreduce(torch.tensor([float(r), -float(r)]), op=hvd.Max, name="max")

torch.manual_seed(0)
model = torch.nn.Linear(4, 1, bias=False)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), model.named_parameters())
w0 = model.weight.detach().clone()
x = torch.full((1, 4), float(r + 1))
model(x).sum().backward()       # grad = x: the average over ranks is the mean of 1..n
opt.step()
emit({"rank": r, "size": n, "sum": s.tolist(), "max": m.tolist(),
      "update": (w0 - model.weight.detach()).reshape(-1).tolist()})
