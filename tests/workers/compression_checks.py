"""All multi-process checks of the compressed allreduce, run once per worker count.

Each check computes what every rank can verify itself (every rank regenerates all ranks' inputs
from seeds, so the exact average is known locally) and reports numbers; the pytest side asserts.
"""
import math

import torch
import horovod.torch as hvd

import horovod_ext as hx
from horovod_ext import packing
from tests.workers.common import emit

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.set_num_threads(1)
report = {"rank": R, "size": N}


def inputs(seed, shape, scale=1.0):
    """Every rank's tensor for a trial, regenerated identically on every rank."""
    return [torch.randn(shape, generator=torch.Generator().manual_seed(seed * 1000 + r)) * scale for r in range(N)]


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                                torch.nn.Tanh(), torch.nn.Linear(256, 10))
    g = torch.Generator().manual_seed(100 + R)
    data = [(torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(5)]
    return model, data


def train(model, opt, data, set_to_none=True):
    for x, y in data:
        opt.zero_grad(set_to_none=set_to_none) if set_to_none else opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# ---- none is bit-identical to hvd.DistributedOptimizer ------------------------------------------------
m1, data = model_and_data()
m2, _ = model_and_data()
o1 = hvd.DistributedOptimizer(torch.optim.SGD(m1.parameters(), lr=0.1, momentum=0.9), m1.named_parameters())
w1 = train(m1, o1, data, set_to_none=False)
o2 = hx.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9), m2.named_parameters(),
                             compression=hx.Compression.none)
w2 = train(m2, o2, data)
report["none_identical"] = all(torch.equal(a, b) for a, b in zip(w1, w2))
report["none_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(w1, w2))

# ---- fp16 / bf16 relative error -------------------------------------------------------------------------
for label, codec in (("fp16", hx.Compression.fp16), ("bf16", hx.Compression.bf16)):
    errs = []
    for trial, shape in enumerate([(1000,), (37, 53), (7,), (4096,)]):
        xs = inputs(trial + 1, shape)
        exact = sum(xs) / N
        out = hx.allreduce(xs[R].clone(), name=f"{label}.{trial}", compression=codec)
        errs.append(float((out - exact).abs().max() / exact.abs().max()))
    report[f"{label}_rel_err"] = max(errs)

# ---- Global-QSGD -----------------------------------------------------------------------------------------
qs = {}
for bits in (8, 4):
    try:
        m = packing.check_capacity(bits, N)
    except ValueError:
        qs[bits] = {"capacity_error": True}
        continue
    codec = hx.Compression.global_qsgd(bits, seed=7)
    res = {"capacity_error": False, "levels": m}
    # same global scale everywhere, and the error bound s/m
    xs = inputs(50, (3001,))
    s = max(float(x.abs().max()) for x in xs)
    exact = sum(xs) / N
    comm_before = hx.reduction._functional_comms
    out = hx.allreduce(xs[R].clone(), name=f"q{bits}.bound", compression=codec)
    res["max_err_over_bound"] = float((out - exact).abs().max()) / (s / m)
    # which collectives carried it
    st = next(iter(hx.reduction._functional_comms.values())).stats
    a0, g0 = st.allreduce_calls, st.allgather_calls
    hx.allreduce(xs[R].clone(), name=f"q{bits}.calls", compression=codec)
    res["allreduce_calls"], res["allgather_calls"] = st.allreduce_calls - a0, st.allgather_calls - g0
    # unbiasedness over 2000 seeded trials
    if bits == 8:
        trials = 2000
        x = inputs(60, (64,))
        exact = sum(x) / N
        acc = torch.zeros(64, dtype=torch.float64)
        acc2 = torch.zeros(64, dtype=torch.float64)
        state = {}
        for t in range(trials):
            o = hx.allreduce(x[R].clone(), name="q8.unbiased", compression=codec, state=state).double()
            acc += o
            acc2 += o * o
        mean = acc / trials
        var = (acc2 / trials - mean * mean).clamp_min(0) * trials / (trials - 1)
        se = (var / trials).sqrt()
        z = ((mean - exact.double()).abs() / se.clamp_min(1e-12))
        det = se < 1e-9   # deterministic elements (e.g. the max itself) must be exact
        z = torch.where(det, ((mean - exact.double()).abs() > 1e-6).double() * 1e9, z)
        res["frac_within_3se"] = float((z <= 3).double().mean())
        res["max_z"] = float(z.max())
    # edge cases: zeros, tiny, huge
    edge = {}
    for tag, scale in (("zeros", 0.0), ("tiny", 1e-40), ("small", 1e-30), ("huge", 1e30), ("max", 1e38)):
        xs = inputs(70, (513,), scale=scale) if scale else [torch.zeros(513) for _ in range(N)]
        xs = [x.clamp(-3.0e38, 3.0e38) for x in xs]
        exact = sum(x.double() for x in xs) / N
        s = max(float(x.abs().max()) for x in xs)
        out = hx.allreduce(xs[R].clone(), name=f"q{bits}.{tag}", compression=codec)
        ok = bool(torch.isfinite(out).all())
        err = float((out.double() - exact).abs().max())
        edge[tag] = {"finite": ok, "err_over_bound": (err / (s / m)) if s > 0 else err}
    res["edge"] = edge
    qs[bits] = res
report["qsgd"] = {str(k): v for k, v in qs.items()}

# ---- Global-QSGD buckets: each run of `bucket` elements has its own shared scale ------------------------------
g = torch.Generator().manual_seed(80)
xs = []
for r in range(N):
    x = torch.randn(2048 + 100, generator=g) * 1e-3
    x[:512] *= 1e6            # one loud bucket; the other buckets (and the 100-element tail) are quiet
    xs.append(x)
exact = sum(xs) / N
m = packing.check_capacity(8, N)
bk = {}
for spec in ("global_qsgd8", "global_qsgd8-tensor"):
    out = hx.allreduce(xs[R].clone(), name=f"bucket.{spec}", compression=hx.Compression.from_spec(spec))
    quiet = slice(512, None)
    quiet_scale = max(float(x[quiet].abs().max()) for x in xs)
    bk[spec] = {"quiet_err_over_bucket_bound": float((out[quiet] - exact[quiet]).abs().max()) / (quiet_scale / m),
                "quiet_rel_err": float((out[quiet] - exact[quiet]).norm() / exact[quiet].norm())}
report["qsgd_buckets"] = bk

# NaN on one worker: every worker raises, or every worker skips
if packing.levels_for(8, N) >= 1:
    for policy in ("raise", "skip"):
        model, data = model_and_data(3)
        hvd.broadcast_parameters(model.state_dict(), 0)
        opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                      compression=hx.Compression.global_qsgd(8, nonfinite=policy))
        before = [p.detach().clone() for p in model.parameters()]
        x, y = data[0]
        if R == N - 1:
            x = x.clone(); x[0, 0] = float("nan")
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        outcome = "applied"
        try:
            opt.step()
        except hx.NonFiniteGradientError as e:
            outcome = "raised"
        unchanged = all(torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
        # the next, finite step works normally on every worker
        x, y = data[1]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        finite_after = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        report[f"nan_{policy}"] = {"outcome": outcome, "unchanged": unchanged, "finite_after": finite_after,
                                   "skipped": opt.comm_stats()["total"]["skipped_steps"]}

# ---- sparsifiers with error feedback: residuals by name, conservation --------------------------------------
def conservation(codec, steps=6):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Linear(30, 5))
    hvd.broadcast_parameters(model.state_dict(), 0)
    opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), model.named_parameters(),
                                  compression=codec, adaptive=False)
    names = [n for n, _ in model.named_parameters()]
    w0 = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    raw = {n: torch.zeros_like(w0[n]) for n in names}
    residual_survives = True
    for t in range(steps):
        opt.zero_grad(set_to_none=True)
        # a loss whose gradient is a known tensor G per rank and step: sum(p * G)
        loss = 0
        for n, p in model.named_parameters():
            G = torch.randn(p.shape, generator=torch.Generator().manual_seed(1000 * t + 10 * R + names.index(n)))
            loss = loss + (p * G).sum()
            raw[n] += hvd.allreduce(G.double(), name=f"raw.{codec.label}.{t}.{n}", op=hvd.Average)
        loss.backward()
        if t > 0:
            residual_survives &= all(opt.codec_state(n).get("residual") is not None for n in names)
        opt.step()
    worst = 0.0
    for n, p in model.named_parameters():
        st = opt.codec_state(n)
        wT = st["synced"].double() if "synced" in st else p.detach().double()
        res = hvd.allreduce(st["residual"].double().view_as(p), name=f"res.{codec.label}.{n}", op=hvd.Average)
        lhs = (w0[n] - wT) + res
        worst = max(worst, float((lhs - raw[n]).abs().max() / raw[n].abs().max()))
    return {"rel_err": worst, "residual_survives_zero_grad": bool(residual_survives)}


report["ef"] = {
    "topk": conservation(hx.Compression.topk(0.05)),
    "topk_importance": conservation(hx.Compression.topk(0.05, importance=True)),
    "random_block_ef": conservation(hx.Compression.random_block(0.05, detached=False)),
    "random_block_def": conservation(hx.Compression.random_block(0.05, detached=True, coeff=0.3)),
}
rb = hx.Compression.random_block(0.01)
idx = rb.block("some.weight", 3, 10_000)
all_starts = hvd.allgather(idx[:1], name="rb.start")
report["random_block_shared"] = bool((all_starts == all_starts[0]).all())

# ---- bits per element handed to Horovod, on a model with realistic layer sizes -------------------------------
def bits_for(codec, adaptive=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                  compression=codec, adaptive=adaptive)
    x = torch.randn(8, 512)
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    return opt.comm_stats()["last"]["bits_per_element"]


bits = {}
for spec in ("none", "fp16", "bf16", "global_qsgd8", "global_qsgd4", "topk0.01", "random_block0.01"):
    try:
        bits[spec] = bits_for(hx.Compression.from_spec(spec))
    except ValueError as e:
        bits[spec] = str(e)
report["bits"] = bits
report["bits_adaptive_default"] = {spec: bits_for(hx.Compression.from_spec(spec), adaptive=True)
                                   for spec in ("fp16", "global_qsgd8")}


# ---- the adaptive cost rule measures the backend's float16 sum (and only for fp16) ----------------------------
def decided(spec):
    model = torch.nn.Linear(256, 256)
    spec, _, pipe = spec.partition("+")
    opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                  compression=hx.Compression.from_spec(spec), pipeline=pipe == "pipe",
                                  adaptive=hx.Adaptive(link_gbps=10.0, measure_steps=2, min_numel=1))
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(4, 256)).pow(2).mean().backward()
        opt.step()
    opt.flush()
    return opt.comm_stats()["adaptive"]


report["adaptive_backend"] = {spec: decided(spec) for spec in ("fp16", "fp16+pipe", "global_qsgd8")}
emit(report)
