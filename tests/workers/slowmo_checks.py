"""hx.SlowMo under real horovodrun: each configuration trains a small model on this rank's own batches
and reports the final parameters; tests/test_slowmo.py replays every worker in one process with its own
implementation of the algorithm and compares. Then a flush + state_dict round trip."""

import torch
import horovod.torch as hvd

import horovod_ext as hx
from tests.workers.common import emit
from tests.workers.slowmo_problem import CONFIGS, batch, base_optimizer, make_model, round_trip

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.set_num_threads(1)
report = {"rank": R, "size": N, "final": {}}


def train(cfg: dict, model=None, opt=None, start: int = 0, steps: int | None = None):
    model = model or make_model()
    opt = opt or hx.SlowMo(base_optimizer(cfg, model), model.named_parameters(), tau=cfg["tau"],
                           slow_lr=cfg["slow_lr"], slow_momentum=cfg["slow_momentum"], inner=cfg["inner"],
                           buffers=cfg["buffers"], **({"adaptive": False} if cfg["inner"] else {}))
    for t in range(start, start + (cfg["steps"] if steps is None else steps)):
        x, y = batch(R, t)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    opt.flush()
    return model, opt


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


for name, cfg in CONFIGS.items():
    model, opt = train(cfg)
    report["final"][name] = flat(model)
    report.setdefault("periods", {})[name] = opt.comm_stats()["slowmo"]["periods"]

# Resume: 4 steps, flush, checkpoint (model + optimizer, through torch.save with weights_only), then
# 5 more steps in the same objects and, separately, in fresh objects loaded from the checkpoint.
cfg = CONFIGS["sgd_momentum"]
model, opt = train(cfg, steps=4)
ck = round_trip(model, opt)
train(cfg, model, opt, start=4, steps=5)
model2 = make_model()
model2.load_state_dict(ck["model"])
opt2 = hx.SlowMo(base_optimizer(cfg, model2), model2.named_parameters(), tau=cfg["tau"], slow_lr=cfg["slow_lr"],
                 slow_momentum=cfg["slow_momentum"], buffers=cfg["buffers"])
opt2.load_state_dict(ck["opt"])
train(cfg, model2, opt2, start=4, steps=5)
report["resume_equal"] = flat(model) == flat(model2)
report["after_flush_same_everywhere"] = bool(
    (hvd.allgather(torch.tensor([flat(model)]), name="slowmo.same") == torch.tensor([flat(model)])).all())
emit(report)
