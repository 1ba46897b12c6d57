"""Issue 14: faults across workers: NaN/Inf on one rank, a GradScaler, mismatched ranks.

``fault_checks.py nonfinite``: for every codec (and warm-up / pipelining), rank 1 alone puts a NaN
into one gradient (a small tensor, which goes uncompressed, or a large one, which goes through the
codec) at one step. With ``nonfinite="skip"`` every worker skips that step (parameters unchanged,
the skip counted) and training goes on with the workers equal; with ``"raise"`` every worker raises.
An fp16-style GradScaler sees the Inf that reaches ``p.grad`` and backs off on every worker.

``fault_checks.py mismatch-shape`` / ``mismatch-codec``: rank 1 builds a different model or codec;
every worker must get a clear error within seconds instead of a hang.
"""
from __future__ import annotations

import sys
import time

import horovod.torch as hvd
import torch

import horovod_ext as hx
from tests.workers.common import emit

CODECS = ["none", "fp16", "bf16", "global_qsgd8", "topk0.05", "random_block0.05-ef", "random_block0.05"]
BAD_STEP = 3
_case = iter(range(10**6))


def build(codec: str, hidden: int = 1024, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 8))
    opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                                  compression=hx.Compression.from_spec(codec), **kw)
    return model, opt


def data(step: int):
    g = torch.Generator().manual_seed(100 * hvd.rank() + step)
    return torch.randn(16, 16, generator=g), torch.randn(16, 8, generator=g)


def flat(model, opt=None) -> torch.Tensor:
    """The parameters; under DEF each worker's model is x~ - c*lr*e, so compare x~ (its synced copy)."""
    out = []
    for name, p in model.named_parameters():
        synced = opt.codec_state(name).get("synced") if opt is not None else None
        out.append((synced if synced is not None else p).detach().reshape(-1))
    return torch.cat(out)


def poison(param: torch.Tensor, value: float, when):
    """On rank 1, make ``param``'s gradient non-finite during backward (before it is accumulated, so
    before the reduction starts from the accumulate hook) whenever ``when()`` is true."""
    def hook(grad):
        if hvd.rank() == 1 and when():
            grad = grad.clone()
            grad.view(-1)[0] = value
        return grad
    param.register_hook(hook)


def nonfinite_case(codec: str, target: str, policy: str, **kw) -> dict:
    model, opt = build(codec, nonfinite=policy, **kw)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    raised, changed_at_bad, before = [], None, None
    pipelined = kw.get("pipeline", False)
    step = [0]
    poison(dict(model.named_parameters())[target], float("nan"), lambda: step[0] == BAD_STEP)
    for t in range(8):
        step[0] = t
        x, y = data(t)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        # Pipelined, the NaN of step t is applied (or skipped) at step t + 1.
        bad_round = t == BAD_STEP + (1 if pipelined else 0)
        if bad_round:
            before = flat(model, opt).clone()
        try:
            opt.step()
        except hx.NonFiniteGradientError as e:
            raised.append((t, str(e)[:200]))
        if bad_round:
            changed_at_bad = not torch.equal(before, flat(model, opt))
    opt.flush()
    params = flat(model, opt)
    ref = params.clone()
    hvd.broadcast_(ref, root_rank=0, name=f"ref.{next(_case)}")
    return {"raised": raised, "changed_at_bad_step": changed_at_bad,
            "skipped": opt.comm_stats()["total"]["skipped_steps"], "finite": bool(torch.isfinite(params).all()),
            "workers_equal": bool(torch.equal(ref, params))}


def scaler_case(codec: str) -> dict:
    model, opt = build(codec)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1000)
    scales, changed = [], []
    step = [0]
    poison(model[2].weight, float("inf"), lambda: step[0] == 2)
    for t in range(5):
        step[0] = t
        x, y = data(t)
        opt.zero_grad(set_to_none=True)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        before = flat(model).clone()
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        changed.append(not torch.equal(before, flat(model)))
        scales.append(float(scaler.get_scale()))
    return {"scales": scales, "changed": changed}


def mismatch(kind: str) -> dict:
    if kind == "mismatch-shape":
        model, opt = build("none", hidden=1024 if hvd.rank() == 0 else 512)
    else:
        model, opt = build("global_qsgd8" if hvd.rank() == 0 else "topk0.05")
    t0 = time.time()
    try:
        x, y = data(0)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        return {"error": None, "seconds": time.time() - t0}
    except Exception as e:  # noqa: BLE001 - the error is the result
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.time() - t0}


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    mode = sys.argv[1]
    report = {"rank": hvd.rank()}
    if mode == "nonfinite":
        for codec in CODECS:
            for target in ("2.bias", "0.weight"):          # small (plain path), large (the codec)
                report[f"{codec}/{target}/skip"] = nonfinite_case(codec, target, "skip")
            report[f"{codec}/0.weight/raise"] = nonfinite_case(codec, "0.weight", "raise")
            report[f"{codec}/0.weight/skip+pipe"] = nonfinite_case(codec, "0.weight", "skip", pipeline=True)
        report["global_qsgd8/0.weight/skip+warmup"] = nonfinite_case("global_qsgd8", "0.weight", "skip",
                                                                     warmup_steps=5)
        for codec in ("none", "global_qsgd8"):
            report[f"scaler/{codec}"] = scaler_case(codec)
    else:
        report[mode] = mismatch(mode)
    emit(report)


if __name__ == "__main__":
    main()
