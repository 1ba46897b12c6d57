"""PowerSGD under real horovodrun: each rank reduces known gradients and reports its inputs, results and
codec state step by step; tests/test_powersgd.py recomputes everything with a one-process reference
from both ranks' reported gradients. Then training with hx.DistributedOptimizer (plain and pipelined)
and a state_dict round trip."""
import io

import torch
import horovod.torch as hvd

import horovod_ext as hx
from horovod_ext.communicator import Communicator
from horovod_ext.compression import ReduceContext
from horovod_ext.reduction import Reduction, complete
from tests.workers.common import emit

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.set_num_threads(1)
report = {"rank": R, "size": N}
COMM = Communicator()

# name -> shape; 'a' and 'conv' are compressed at rank 4, 'bias' (1-D) and 'small' ((3+4)*3*2 >= 12) are not
SHAPES = {"a": (24, 40), "conv": (16, 4, 3, 3), "bias": (15,), "small": (3, 4)}


def gradient(tag: str, name: str, step: int, rank: int, dtype=torch.float32) -> torch.Tensor:
    seed = 100_000 * sum(map(ord, tag)) + 1000 * step + 10 * rank + sorted(SHAPES).index(name)
    g = torch.randn(SHAPES[name], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    # a dominant low-rank part, as in real gradients, plus noise
    lead = torch.randn(SHAPES[name][0], 2, generator=torch.Generator().manual_seed(seed + 7), dtype=torch.float64)
    g = g * 0.3 + (lead @ g.reshape(SHAPES[name][0], -1)[:2]).reshape(SHAPES[name]) if g.dim() > 1 else g
    return g.to(dtype)


def as_list(t):
    return None if t is None else t.detach().double().reshape(-1).tolist()


def reduce_once(codec, grad, name, state, op=hvd.Average, slot=None):
    """Start a reduction (its first phase runs now); complete it with complete([red])."""
    ctx = ReduceContext(name=name, state=state, comm=COMM, op=op, slot=slot)
    return Reduction(codec, grad, ctx)


def kept(state):
    """The codec state a checkpoint keeps (keys starting with "_" are scratch buffers)."""
    return {k: v for k, v in state.items() if not k.startswith("_")}


def snapshot(state):
    return {k: v.detach().clone() for k, v in kept(state).items()}


def record(grad, out, state, slot=None):
    rkey, qkey = ("residual@1", "q@1") if slot == 1 else ("residual", "q")
    return {"grad": as_list(grad), "out": as_list(out), "residual": as_list(state.get(rkey)),
            "q": as_list(state.get(qkey)), "keys": sorted(k for k in state if not k.startswith("_"))}


# ---- (1) several steps, op Average and Sum, float32 and float64 --------------------------------------------
def sequence(tag, codec, names, steps, op=hvd.Average, dtype=torch.float32):
    states = {n: {} for n in names}
    rows = {n: [] for n in names}
    for t in range(steps):
        for n in names:
            g = gradient(tag, n, t, R, dtype)
            red = reduce_once(codec, g.clone(), f"{tag}.{n}", states[n], op=op)
            complete([red])
            rows[n].append(record(g, red.result, states[n]))
    return rows


report["avg"] = sequence("avg", hx.Compression.powersgd(), ["a", "conv", "bias", "small"], steps=6)
report["sum"] = sequence("sum", hx.Compression.powersgd(2, seed=3), ["a"], steps=4, op=hvd.Sum)
report["f64"] = sequence("f64", hx.Compression.powersgd(), ["a"], steps=4, dtype=torch.float64)
report["noef"] = sequence("noef", hx.Compression.from_spec("powersgd4-noef"), ["a"], steps=3)

# ---- (2) a NaN on the last rank at step 2: every rank gets NaN and keeps its state -------------------------------
codec = hx.Compression.powersgd()
nan_rows = {"a": [], "bias": []}
nan_info = {}
states = {"a": {}, "bias": {}}
for t in range(5):
    for n in ("a", "bias"):
        g = gradient("nan", n, t, R)
        if t == 2 and R == N - 1:
            g.view(-1)[5] = float("nan")
        before = snapshot(states[n])
        red = reduce_once(codec, g.clone(), f"nan.{n}", states[n])
        complete([red])
        if t == 2:
            nan_info[n] = {"all_nan": bool(torch.isnan(red.result).all()),
                           "any_nan": bool(torch.isnan(red.result).any()),
                           "state_unchanged": sorted(before) == sorted(kept(states[n])) and all(
                               torch.equal(before[k], states[n][k]) for k in before)}
        else:
            nan_rows[n].append(record(g, red.result, states[n]))
report["nan"] = {"rows": nan_rows, "info": nan_info}
try:
    hx.allreduce(torch.full((24, 40), float("inf")) if R == 0 else torch.ones(24, 40), name="nan.raise",
                 compression=codec, state={})
    report["nan"]["raised"] = False
except hx.NonFiniteGradientError:
    report["nan"]["raised"] = True

# ---- (3) pipelined: step t starts (slot t % 2) while step t-1 is still in flight ------------------------------
state, rows, prev = {}, [], None
for t in range(6):
    g = gradient("pipe", "a", t, R)
    red = reduce_once(codec, g.clone(), "pipe.a", state, slot=t % 2)
    if prev is not None:
        complete([prev[0]])
        rows.append(record(prev[1], prev[0].result, state, slot=prev[2]))
    prev = (red, g, t % 2)
complete([prev[0]])
rows.append(record(prev[1], prev[0].result, state, slot=prev[2]))
report["pipe"] = {"rows": rows, "keys": sorted(k for k in state if not k.startswith("_"))}

# ---- (4) training with hx.DistributedOptimizer; state_dict round trip ----------------------------------------------
def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 4))


TEACHER = torch.randn(16, 4, generator=torch.Generator().manual_seed(9))


def batch(rank, t):
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(5000 + 100 * t + rank))
    return x, torch.tanh(x @ TEACHER)


def run_steps(model, opt, steps, start):
    losses = []
    for t in range(start, start + steps):
        x, y = batch(R, t)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def eval_loss(model):
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(77))
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), torch.tanh(x @ TEACHER)))


def training(pipeline):
    model = make_model()
    opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  model.named_parameters(), compression=hx.Compression.powersgd(4),
                                  adaptive=False, pipeline=pipeline)
    before = eval_loss(model)
    losses = run_steps(model, opt, 60, 0)
    after = eval_loss(model)
    res = {"eval_before": before, "eval_after": after, "first": losses[:5], "last": losses[-5:],
           "bits": opt.comm_stats()["total"]["bits_per_element"]}
    # state_dict round trip through torch.save / torch.load(weights_only=True); state_dict() waits for the
    # reductions in flight (pipelined), which take their slot's residual out of the state until they end
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    res["keys"] = {n: sorted(opt.codec_state(n)) for n, _ in model.named_parameters()}
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    model2 = make_model()
    model2.load_state_dict(saved["model"])
    opt2 = hx.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9),
                                   model2.named_parameters(), compression=hx.Compression.powersgd(4),
                                   adaptive=False, pipeline=pipeline)
    opt2.load_state_dict(saved["opt"])
    same = True
    for n, _ in model.named_parameters():
        a, b = opt.codec_state(n), opt2.codec_state(n)
        same &= sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    res["state_equal"] = bool(same)
    # both continue from the same state: the same parameters, bit for bit
    run_steps(model, opt, 4, 60)
    opt.flush()
    run_steps(model2, opt2, 4, 60)
    opt2.flush()
    res["continue_equal"] = all(torch.equal(p, q) for p, q in zip(model.parameters(), model2.parameters()))
    return res


report["train"] = {"plain": training(False), "pipeline": training(True)}

# ---- (5) hvd.join(): the last rank joins, the others reduce one more step -----------------------------------------
state = {}
rows = []
g = gradient("join", "a", 0, R)
red = reduce_once(codec, g.clone(), "join.a", state)
complete([red])
rows.append(record(g, red.result, state))
if R == N - 1:
    hvd.join()
else:
    g = gradient("join", "a", 1, R)
    red = reduce_once(codec, g.clone(), "join.a", state)
    complete([red])
    rows.append(record(g, red.result, state))
    hvd.join()
report["join"] = rows
emit(report)
