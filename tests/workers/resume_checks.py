"""Issue 14: a checkpoint of hx.DistributedOptimizer resumes bit-exactly, codec state included.

For each codec: train N steps, saving (model, ``opt.gather_state_dict()``) at step K through a real
``torch.save``/``torch.load(weights_only=True)`` round trip, with pipelined gradients still in flight
(no flush). Then build a fresh model and optimizer (another init), let rank 0 alone read the
checkpoint, broadcast it, and replay steps K..N on the same data: every loss and the final
parameters must equal the uninterrupted run's. Also: a checkpoint written by this worker count
loads with the resharding rule when the world size recorded in it differs.
"""
from __future__ import annotations

import io
import sys
import warnings

import horovod.torch as hvd
import torch

import horovod_ext as hx
from tests.workers.common import emit

N, K = 12, 5
SCENARIOS = {
    "none": dict(compression="none"),
    "global_qsgd8+pipe": dict(compression="global_qsgd8", pipeline=True),
    "global_qsgd8+pipe+warmup3": dict(compression="global_qsgd8", pipeline=True, warmup_steps=3),
    "topk0.05-ef": dict(compression="topk0.05-ef"),
    "topk0.05-def+pipe": dict(compression="topk0.05", pipeline=True),       # DEF: top-k's default
    "random_block0.05-def": dict(compression="random_block0.05"),
    "random_block0.05-def+pipe": dict(compression="random_block0.05", pipeline=True),
}


def build(init_seed: int, cfg: dict):
    torch.manual_seed(init_seed)
    # Tensors of >= 8192 elements, so the adaptive rule compresses them (smaller ones go plain).
    model = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 8))
    base = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt = hx.DistributedOptimizer(base, model.named_parameters(),
                                  compression=hx.Compression.from_spec(cfg["compression"]),
                                  pipeline=cfg.get("pipeline", False), warmup_steps=cfg.get("warmup_steps", 0))
    return model, opt


def batch(step: int):
    g = torch.Generator().manual_seed(1000 * hvd.rank() + step)
    return torch.randn(32, 16, generator=g), torch.randn(32, 8, generator=g)


def train_step(model, opt, step: int) -> float:
    x, y = batch(step)
    for g in opt.param_groups:          # a schedule: the lr after a resume must be the loaded one
        g["lr"] = 1e-2 / (1 + 0.1 * step)
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return float(loss)


def run(name: str, cfg: dict) -> dict:
    model, opt = build(0, cfg)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    losses, blob = [], None
    for t in range(N):
        if t == K:
            sd = opt.gather_state_dict(root_rank=0)
            if hvd.rank() == 0:
                buf = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": sd}, buf)
                blob = buf.getvalue()
        losses.append(train_step(model, opt, t))
    opt.flush()
    final = [p.detach().clone() for p in model.parameters()]

    model2, opt2 = build(123, cfg)          # another init: only the checkpoint can make it equal
    ckpt = torch.load(io.BytesIO(blob), weights_only=True) if hvd.rank() == 0 else None
    ckpt = hvd.broadcast_object(ckpt, 0, name=f"ckpt.{name}")
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    resumed = [train_step(model2, opt2, t) for t in range(K, N)]
    opt2.flush()
    diff = max(float((a - b.detach()).abs().max()) for a, b in zip(final, model2.parameters()))
    codec_state = opt.codec_state("0.weight")

    # The same checkpoint read as if written by another worker count: the resharding rule applies.
    other = dict(ckpt["optimizer"])
    hx_state = dict(other["horovod_ext"])
    hx_state["world_size"] = hvd.size() + 1
    hx_state["ranks"] = list(hx_state["ranks"]) + [hx_state["ranks"][0]]
    other["horovod_ext"] = hx_state
    model3, opt3 = build(7, cfg)
    model3.load_state_dict(ckpt["model"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt3.load_state_dict(other)
    reshard_warned = any("loading codec state written by" in str(w.message) for w in caught)
    resharded = opt3.codec_state("0.weight").get("residual")
    expected = None
    if "residual" in ckpt["optimizer"]["horovod_ext"]["ranks"][0]["codec"]["0.weight"]:
        rs = [r["codec"]["0.weight"]["residual"].double() for r in hx_state["ranks"]]
        expected = (sum(rs) / len(rs)).float()
    return {"losses": losses[K:], "resumed": resumed, "equal": losses[K:] == resumed, "param_max_diff": diff,
            "has_residual": "residual" in codec_state, "has_dither": "dither_base" in codec_state,
            "has_synced": "synced" in codec_state, "reshard_warned": reshard_warned,
            "reshard_mean_ok": (expected is None and resharded is None)
            or (resharded is not None and bool(torch.equal(resharded, expected))),
            "steps_restored": opt2._steps_taken == opt._steps_taken}


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    only = sys.argv[1:] or list(SCENARIOS)
    report = {"rank": hvd.rank(), "size": hvd.size()}
    for name in only:
        try:
            report[name] = run(name, SCENARIOS[name])
        except Exception as e:  # noqa: BLE001 - reported per scenario
            report[name] = {"error": f"{type(e).__name__}: {e}"}
    emit(report)


if __name__ == "__main__":
    main()
