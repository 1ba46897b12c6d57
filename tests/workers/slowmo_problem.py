"""The small problem shared by tests/workers/slowmo_checks.py (the workers) and tests/test_slowmo.py
(the one-process replay): the model, every rank's batches, and the configurations."""
import io

import torch

CONFIGS = {
    # local SGD with momentum; 8 steps = two periods of 3 and a short one ended by flush()
    "sgd_momentum": dict(opt="sgd", lr=0.05, momentum=0.9, tau=3, slow_lr=1.0, slow_momentum=0.5,
                         buffers="average", inner=None, steps=8),
    # local Adam, buffers cleared at each average
    "adam_reset": dict(opt="adam", lr=0.01, momentum=0.0, tau=2, slow_lr=0.8, slow_momentum=0.6,
                       buffers="reset", inner=None, steps=5),
    # plain periodic averaging (local SGD): slow_lr 1, slow_momentum 0
    "local_sgd": dict(opt="sgd", lr=0.1, momentum=0.0, tau=4, slow_lr=1.0, slow_momentum=0.0,
                      buffers="average", inner=None, steps=8),
    # gradients averaged every step through hx.DistributedOptimizer (fp32), slow momentum every 3
    "inner_allreduce": dict(opt="sgd", lr=0.1, momentum=0.0, tau=3, slow_lr=1.0, slow_momentum=0.5,
                            buffers="average", inner="none", steps=6),
}


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def base_optimizer(cfg: dict, model: torch.nn.Module) -> torch.optim.Optimizer:
    if cfg["opt"] == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    return torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def round_trip(model: torch.nn.Module, opt) -> dict:
    """The model's and the optimizer's state as a checkpoint holds them: through torch.save and
    torch.load(weights_only=True), a copy independent of the live objects."""
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)
