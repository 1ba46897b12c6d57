"""hx.Gossip under real horovodrun: each configuration trains the small SlowMo test problem on this rank's
own batches and reports the parameters after every step; tests/test_gossip.py replays every worker in
one process with its own mixing matrices and compares. Then a flush + state_dict round trip."""
import torch
import horovod.torch as hvd

import horovod_ext as hx
from tests.workers.common import emit
from tests.workers.slowmo_problem import batch, make_model, round_trip

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.set_num_threads(1)
CONFIGS = {"ring": dict(topology="ring", push_sum=False, average_every=0),
           "exp": dict(topology="exponential", push_sum=True, average_every=0),
           "exp_avg3": dict(topology="exponential", push_sum=False, average_every=3)}
STEPS = 7


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def train(cfg, model=None, opt=None, start=0, steps=STEPS):
    model = model or make_model()
    opt = opt or hx.Gossip(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model.named_parameters(), **cfg)
    trail = []
    for t in range(start, start + steps):
        x, y = batch(R, t)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        trail.append(flat(model))
    return model, opt, trail


report = {"rank": R, "size": N, "trail": {}, "final": {}}
for name, cfg in CONFIGS.items():
    model, opt, trail = train(cfg)
    report["trail"][name] = trail
    opt.flush()
    report["final"][name] = flat(model)
    report.setdefault("stats", {})[name] = opt.comm_stats()["total"]

cfg = CONFIGS["exp"]
model, opt, _ = train(cfg, steps=4)
opt.flush()
ck = round_trip(model, opt)
train(cfg, model, opt, start=4, steps=5)
model2 = make_model()
model2.load_state_dict(ck["model"])
opt2 = hx.Gossip(torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9), model2.named_parameters(), **cfg)
opt2.load_state_dict(ck["opt"])
train(cfg, model2, opt2, start=4, steps=5)
report["resume_equal"] = flat(model) == flat(model2)
emit(report)
