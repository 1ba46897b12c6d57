"""2-worker checks of DEF with the perturbation in the wrapped optimizer's units (SGD, SGD with
momentum, Adam) for top-k and random block, and of top-k's sampled selection across workers.

The loss is sum(p * G) with G known per rank and step (regenerated on every rank), so every rank can
check conservation and the running mean of squared gradients itself. Reports numbers; the pytest
side (tests/test_sparsify_momentum.py) asserts.
"""
import io

import torch
import horovod.torch as hvd

import horovod_ext as hx
from horovod_ext.compression import sparsify
from horovod_ext.compression.sparsify import RandomBlock, TopK, _count
from tests.workers.common import emit

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.set_num_threads(1)
report = {"rank": R, "size": N}

CODECS = {"topk-def": lambda: TopK(0.05, detached=True), "random_block-def": lambda: RandomBlock(0.05)}
OPTS = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
        "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1),
        "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2)}


def make_model(seed=5):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Linear(30, 5))


def build(kind, opt_name, seed=5, **kw):
    model = make_model(seed)
    hvd.broadcast_parameters(model.state_dict(), 0)
    opt = hx.DistributedOptimizer(OPTS[opt_name](model.parameters()), model.named_parameters(),
                                  compression=CODECS[kind](), adaptive=False, **kw)
    return model, opt


def known(t, i, shape, rank=R):
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * t + 10 * rank + i))


def step(model, opt, t, poison=False):
    """One step of the loss sum(p * G_t); returns this rank's G_t per parameter."""
    opt.zero_grad(set_to_none=True)
    loss, gs = 0, []
    for i, p in enumerate(model.parameters()):
        g = known(t, i, p.shape)
        if poison and i == 0:
            g = g.clone()
            g.view(-1)[3] = float("nan")
        gs.append(g)
        loss = loss + (p * g).sum()
    loss.backward()
    opt.step()
    return gs


def expected_d(codec, st, group, shape):
    """coeff * D(e), written out independently of the codec."""
    e = st["residual"].double().view(shape)
    if "betas" in group:
        return codec.coeff * group["lr"] * e / (st["grad_sq"].double().view(shape).sqrt() + group["eps"])
    m, d = group.get("momentum", 0.0), group.get("dampening", 0.0)
    return codec.coeff * group["lr"] * (1 - d) / (1 - m) * e


def same_everywhere(t, name):
    g = hvd.allgather(t.detach().reshape(1, -1).contiguous(), name=name)
    return bool((g == g[0]).all())


def perturbation_error(model, opt, tag):
    codec, worst = opt._compression, 0.0
    group = opt.param_groups[0]
    for n, p in model.named_parameters():
        st = opt.codec_state(n)
        want = st["synced"].double() - expected_d(codec, st, group, p.shape)
        worst = max(worst, float((p.detach().double() - want).abs().max()))
    return worst


# ---- DEF per codec and optimizer: synced copy, per-worker x, conservation, state ----------------------------
report["def"] = {}
for kind in CODECS:
    for opt_name in OPTS:
        tag = f"{kind}/{opt_name}"
        model, opt = build(kind, opt_name)
        names = [n for n, _ in model.named_parameters()]
        raw = [torch.zeros(p.shape, dtype=torch.float64) for p in model.parameters()]
        applied = [torch.zeros_like(r) for r in raw]
        sq = [torch.zeros_like(r) for r in raw]
        T = 6
        for t in range(T):
            gs = step(model, opt, t)
            for i, (p, g) in enumerate(zip(model.parameters(), gs)):
                raw[i] += sum(known(t, i, p.shape, r).double() for r in range(N)) / N
                applied[i] += p.grad.double()
                sq[i] = 0.999 * sq[i] + 0.001 * g.double() ** 2
        cons, sq_err, synced_eq, differ = 0.0, 0.0, True, False
        for i, (n, p) in enumerate(model.named_parameters()):
            st = opt.codec_state(n)
            res = hvd.allreduce(st["residual"].double().view(p.shape), name=f"res.{tag}.{n}", op=hvd.Average)
            cons = max(cons, float((applied[i] + res - raw[i]).abs().max() / raw[i].abs().max()))
            synced_eq &= same_everywhere(st["synced"], f"synced.{tag}.{n}")
            differ |= not same_everywhere(p, f"param.{tag}.{n}")
            if "grad_sq" in st:
                want = sq[i] / (1 - 0.999 ** T)
                sq_err = max(sq_err, float((st["grad_sq"].double().view(p.shape) - want).abs().max() / want.max()))
        report["def"][tag] = {"synced_equal_across_workers": synced_eq, "params_differ_across_workers": differ,
                              "param_is_synced_minus_coeff_d": perturbation_error(model, opt, tag),
                              "conservation_rel_err": cons, "grad_sq_rel_err": sq_err,
                              "keys": sorted(opt.codec_state(names[0]))}

# ---- checkpoint: every worker re-derives its own x from x~, its residual and its running mean ----------------------
report["resume"] = {}
for kind in CODECS:
    model, opt = build(kind, "adam")
    for t in range(4):
        step(model, opt, t)
    sd = opt.gather_state_dict(root_rank=0)
    blob = None
    if R == 0:
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": sd}, buf)
        blob = buf.getvalue()
    before = [p.detach().clone() for p in model.parameters()]
    ckpt = torch.load(io.BytesIO(blob), weights_only=True) if R == 0 else None
    ckpt = hvd.broadcast_object(ckpt, 0, name=f"ckpt.{kind}")
    model2 = make_model(seed=99)
    opt2 = hx.DistributedOptimizer(OPTS["adam"](model2.parameters()), model2.named_parameters(),
                                   compression=CODECS[kind](), adaptive=False)
    model2.load_state_dict(ckpt["model"])            # rank 0's own (perturbed) parameters
    opt2.load_state_dict(ckpt["optimizer"])
    rederived = all(torch.equal(a, b.detach()) for a, b in zip(before, model2.parameters()))
    step(model, opt, 4)
    step(model2, opt2, 4)
    report["resume"][kind] = {"params_rederived_equal": rederived,
                              "next_step_equal": all(torch.equal(a.detach(), b.detach())
                                                     for a, b in zip(model.parameters(), model2.parameters()))}

# ---- non-finite on one worker, policy skip: the step and the tensor's codec state are left as they were -------------
report["nonfinite"] = {}
for kind in CODECS:
    model, opt = build(kind, "adam", nonfinite="skip")
    for t in range(3):
        step(model, opt, t)
    name0 = next(n for n, _ in model.named_parameters())
    st = opt.codec_state(name0)
    params = [p.detach().clone() for p in model.parameters()]
    saved = {k: st[k].clone() for k in ("grad_sq", "grad_sq_norm", "residual")}
    step(model, opt, 3, poison=(R == N - 1))
    st = opt.codec_state(name0)
    unchanged = {k: torch.equal(st[k], v) for k, v in saved.items()}
    params_same = all(torch.equal(a, p.detach()) for a, p in zip(params, model.parameters()))
    step(model, opt, 4)
    report["nonfinite"][kind] = {"skipped": opt.comm_stats()["total"]["skipped_steps"],
                                 "params_unchanged": params_same,
                                 "grad_sq_unchanged": unchanged["grad_sq"] and unchanged["grad_sq_norm"],
                                 "residual_unchanged": unchanged["residual"],
                                 "finite_after": all(bool(torch.isfinite(p).all()) for p in model.parameters())}

# ---- pipelined (Pipe-SGD): x = x~ - coeff * D(e) after flush, x~ the same everywhere ------------------------------
report["pipeline"] = {}
for kind in CODECS:
    model, opt = build(kind, "adam", pipeline=True)
    first = [p.detach().clone() for p in model.parameters()]
    for t in range(6):
        step(model, opt, t)
    opt.flush()
    report["pipeline"][kind] = {
        "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
        "moved": any(not torch.equal(a, p.detach()) for a, p in zip(first, model.parameters())),
        "synced_equal_across_workers": all(same_everywhere(opt.codec_state(n)["synced"], f"pipe.{kind}.{n}")
                                           for n, _ in model.named_parameters()),
        "param_is_synced_minus_coeff_d": perturbation_error(model, opt, f"pipe.{kind}")}

# ---- top-k by a sampled threshold: every worker's exact top k, summed in rank order --------------------------------
numel, ratio = 200_000, 0.05
xs = [torch.randn(numel, generator=torch.Generator().manual_seed(500 + r)) for r in range(N)]
k = _count(numel, ratio)
exact = torch.zeros(numel)
for x in xs:
    idx = torch.topk(x.abs(), k).indices
    exact.index_add_(0, idx, x[idx])
exact /= N
calls = []
real_at_or_above = sparsify._at_or_above
sparsify._at_or_above = lambda *a: calls.append(1) or real_at_or_above(*a)
try:
    out = hx.allreduce(xs[R].clone(), name="sampled.topk", compression=TopK(ratio, error_feedback=False))
finally:
    sparsify._at_or_above = real_at_or_above
report["sampled_topk"] = {"equal_to_exact": bool(torch.equal(out, exact)), "used_sampling": bool(calls), "k": k}
emit(report)
