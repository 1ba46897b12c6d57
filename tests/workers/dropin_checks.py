"""Drop-in checks: ``hx.DistributedOptimizer`` against ``hvd.DistributedOptimizer`` under real horovodrun.

Every scenario runs the same training twice in this process, from the same seeds and the same
per-rank data: once through variant A (usually ``hvd.DistributedOptimizer``) and once through
variant B (usually ``hx.DistributedOptimizer``), and compares the resulting tensors bit for bit.

Launched by tests/test_dropin_horovod.py (through tests/horovod_harness.py)::

    dropin_checks.py --job main|broadcast --out DIR --only NAME,NAME,... --timeout SECONDS

Each scenario is isolated: an exception is caught and reported as that scenario's result, and a
watchdog bounds it: if a scenario (including the barrier that ends it) has not finished after
``--timeout`` seconds, the rank writes ``DIR/rank<r>/<name>.hang`` (with every thread's stack) and
exits, so a deadlock in one scenario ends this launch instead of the whole test run; the pytest
side relaunches the scenarios that had not started. Files per rank and scenario:
``<name>.started``, ``<name>.json`` (the result), ``<name>.hang``.

This module is imported by the pytest side for the scenario names only: nothing runs (no
``hvd.init()``, no ``import horovod_ext``) unless it is executed as a script.
"""
from __future__ import annotations

import argparse
import copy
import faulthandler
import inspect
import json
import os
import sys
import threading
import time
import traceback
import warnings

import torch
import horovod.torch as hvd

hx = None          # horovod_ext, imported in main() (a broken horovod_ext must not break test collection)
R = N = None
STEPS = 5


# =============================================================================================== helpers
def _named(model, tag):
    """model.named_parameters() with a per-run prefix, so no collective name repeats across runs."""
    return [(f"{tag}.{n}", p) for n, p in model.named_parameters()]


def _dist(variant, base, named, **kw):
    """variant "hvd" or "hx": the DistributedOptimizer under test."""
    mod = hvd if variant == "hvd" else hx
    return mod.DistributedOptimizer(base, named_parameters=named, **kw)


def _params(model, prefix=""):
    return {prefix + n: p.detach().clone() for n, p in model.named_parameters()}


def _gen(seed):
    """Per-rank data: the same seed gives every rank different data (and each variant the same)."""
    return torch.Generator().manual_seed(1000 * seed + R)


class MLP(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


class LSTMNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, batch_first=True)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class EmbNet(torch.nn.Module):
    """A sparse embedding (sparse gradients) and a dense head."""

    def __init__(self, head=True):
        super().__init__()
        self.emb = torch.nn.Embedding(30, 5, sparse=True)
        self.head = torch.nn.Linear(5, 4) if head else None

    def forward(self, idx):
        h = self.emb(idx).mean(1)
        return self.head(h) if self.head is not None else h[:, :4]


def build(kind, seed=1):
    torch.manual_seed(seed)
    return {"mlp": MLP, "lstm": LSTMNet, "emb": EmbNet, "emb_only": lambda: EmbNet(head=False)}[kind]()


def batches(kind, n=STEPS, seed=2, shared=False):
    """n batches of (input, target); per rank unless ``shared`` (then the same on every rank)."""
    g = torch.Generator().manual_seed(seed) if shared else _gen(seed)
    out = []
    for _ in range(n):
        if kind == "mlp":
            x = torch.randn(6, 8, generator=g)
        elif kind == "lstm":
            x = torch.randn(4, 5, 6, generator=g)
        else:
            x = torch.randint(0, 30, (4, 3), generator=g)
        out.append((x, torch.randn(x.shape[0], 4, generator=g)))
    return out


def loss_of(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def fit(model, opt, data, before=None):
    for t, b in enumerate(data):
        if before is not None:
            before(t)
        opt.zero_grad()
        loss_of(model, b).backward()
        opt.step()


def _same(a, b):
    """Bit-exact equality; NaN equals NaN."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b)) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_sparse or b.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        if a.is_floating_point():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def _max_abs_diff(a, b):
    try:
        a = a.to_dense() if a.is_sparse else a
        b = b.to_dense() if b.is_sparse else b
        if a.shape != b.shape:
            return f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    except Exception as e:     # noqa: BLE001
        return f"not comparable: {e}"


def _err(e):
    return {"type": type(e).__name__, "message": str(e)[:2000],
            "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]}


# ===================================================================================== main scenarios
OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),     # asr.train's Adam on CPU and CUDA
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
}


def sc_dense(kind, opt_name):
    def fn(v, tag, info):
        model = build(kind)
        opt = _dist(v, OPTIMIZERS[opt_name](model.parameters()), _named(model, tag))
        fit(model, opt, batches(kind))
        return _params(model)
    return fn


def sc_options(**kw):
    """The MLP with SGD momentum and extra DistributedOptimizer arguments."""
    def fn(v, tag, info):
        model = build("mlp")
        opt = _dist(v, OPTIMIZERS["sgd_momentum"](model.parameters()), _named(model, tag), **kw)
        fit(model, opt, batches("mlp"))
        return _params(model)
    return fn


def sc_compression(which):
    """Variants "hx:hx.<which>" and "hx:hvd.<which>": hx with its own codec and with Horovod's object.
    adaptive=False so that fp16 is really used on these small tensors (both variants alike)."""
    def fn(v, tag, info):
        model = build("mlp")
        impl, _, codec = v.partition(":")
        owner, _, attr = codec.partition(".Compression.")          # e.g. "hvd", "fp16"
        kw = {"compression": getattr((hvd if owner == "hvd" else hx).Compression, attr)}
        if which == "fp16":
            kw["adaptive"] = False
        opt = _dist(impl, OPTIMIZERS["sgd_momentum"](model.parameters()), _named(model, tag), **kw)
        fit(model, opt, batches("mlp"))
        out = _params(model)
        if which == "fp16" and v == f"hx:hx.Compression.fp16":
            # the scenario must be able to tell fp16 from none: run hx's none once more for reference
            ref = build("mlp")
            o = _dist("hx", OPTIMIZERS["sgd_momentum"](ref.parameters()), _named(ref, tag + ".none"),
                      compression=hx.Compression.none)
            fit(ref, o, batches("mlp"))
            info["fp16_differs_from_none"] = not _same(out, _params(ref))
        return out
    return fn


def sc_sparse(sparse_as_dense, opt_name, head=True):
    def fn(v, tag, info):
        model = build("emb" if head else "emb_only")
        if opt_name == "sparse_adam":
            base = torch.optim.SparseAdam(model.parameters(), lr=1e-2)
        else:
            base = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        kw = {"sparse_as_dense": True} if sparse_as_dense else {}
        opt = _dist(v, base, _named(model, tag), **kw)
        fit(model, opt, batches("emb"))
        g = model.emb.weight.grad
        info["emb_grad_after_step"] = None if g is None else {"sparse": bool(g.is_sparse),
                                                                "sparse_dim": g.sparse_dim() if g.is_sparse else None,
                                                                "nnz": int(g._nnz()) if g.is_sparse else None}
        return _params(model)
    return fn


def sc_param_groups(v, tag, info):
    model = build("mlp")
    base = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                            {"params": model[2].parameters(), "lr": 0.01}], lr=0.05, momentum=0.9)
    opt = _dist(v, base, None)      # named_parameters=None: Horovod names them allreduce.noname.<group>.<i>
    fit(model, opt, batches("mlp"))
    return _params(model)


def sc_backward_passes(set_later):
    def fn(v, tag, info):
        model = build("mlp")
        base = OPTIMIZERS["sgd_momentum"](model.parameters())
        if set_later:
            opt = _dist(v, base, _named(model, tag))
            opt.set_backward_passes_per_step(2)
        else:
            opt = _dist(v, base, _named(model, tag), backward_passes_per_step=2)
        data = batches("mlp", n=2 * STEPS)
        for t in range(STEPS):
            opt.zero_grad()
            loss_of(model, data[2 * t]).backward()
            loss_of(model, data[2 * t + 1]).backward()
            opt.step()
        return _params(model)
    return fn


def sc_groups(kind, **kw):
    def fn(v, tag, info):
        model = build("mlp")
        extra = dict(kw)
        if kind == "list":
            extra["groups"] = [[model[0].weight, model[2].weight], [model[0].bias]]   # model[2].bias: its own group
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt = _dist(v, OPTIMIZERS["sgd_momentum"](model.parameters()), _named(model, tag), **extra)
        info["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
        fit(model, opt, batches("mlp"))
        return _params(model)
    return fn


def sc_clip(v, tag, info):
    model = build("mlp")
    opt = _dist(v, OPTIMIZERS["sgd_momentum"](model.parameters()), _named(model, tag))
    norms = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b in batches("mlp"):
            opt.zero_grad()
            loss_of(model, b).backward()
            opt.synchronize()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)))
            with opt.skip_synchronize():
                opt.step()
    info["grad_norms_before_clip"] = norms          # > 0.05: the clipping really acted
    info["warnings"] = sorted({str(w.message) for w in caught})
    return _params(model)


def sc_freeze(v, tag, info):
    model = build("mlp")
    opt = _dist(v, OPTIMIZERS["sgd_momentum"](model.parameters()), _named(model, tag))
    layer = model[0]
    snap = {}

    def before(t):
        if t == 2:      # after steps 0 and 1: freeze the first layer
            layer.requires_grad_(False)
            snap["w"] = layer.weight.detach().clone()
        if t == 4:      # after steps 2 and 3: unfreeze it
            info["frozen_layer_moved_while_frozen"] = not torch.equal(snap["w"], layer.weight.detach())
            layer.requires_grad_(True)
    fit(model, opt, batches("mlp"), before=before)
    return _params(model)


def _implementation(opt):
    """Which class's step() the optimizer runs: Horovod's Adasum optimizer, its plain one, or another."""
    from horovod.torch import optimizer as hvd_opt
    step = type(opt).__dict__.get("step")
    for cls in (hvd_opt._DistributedAdasumOptimizer, hvd_opt._DistributedOptimizer):
        if step is not None and step is cls.__dict__.get("step"):
            return f"horovod.torch.optimizer.{cls.__name__}"
    return f"{type(opt).__module__}.{type(opt).__qualname__}"


def sc_adasum(v, tag, info):
    model = build("mlp")
    info["stage"] = "construct"
    opt = _dist(v, torch.optim.SGD(model.parameters(), lr=0.1), _named(model, tag), op=hvd.Adasum)
    info["class"] = _implementation(opt)
    info["stage"] = "train"
    fit(model, opt, batches("mlp"))
    info["stage"] = "done"
    return _params(model)


HVD_HX = ("hvd", "hx")

# name -> (function, (variant A, variant B)); A is the reference. Adasum last: its backend error is the
# most likely to leave Horovod in an odd state.
MAIN_SCENARIOS = {
    "dense_mlp_sgd_momentum": (sc_dense("mlp", "sgd_momentum"), HVD_HX),
    "dense_mlp_adam": (sc_dense("mlp", "adam"), HVD_HX),
    "dense_lstm_sgd_momentum": (sc_dense("lstm", "sgd_momentum"), HVD_HX),
    "dense_lstm_adam": (sc_dense("lstm", "adam"), HVD_HX),
    "dense_lstm_adam_fused": (sc_dense("lstm", "adam_fused"), HVD_HX),
    "op_sum": (sc_options(op=hvd.Sum), HVD_HX),
    "compression_hvd_none": (sc_compression("none"), ("hx:hx.Compression.none", "hx:hvd.Compression.none")),
    "compression_hvd_none_vs_horovod": (sc_compression("none"), ("hvd:hvd.Compression.none",
                                                                 "hx:hvd.Compression.none")),
    "compression_hvd_fp16": (sc_compression("fp16"), ("hx:hx.Compression.fp16", "hx:hvd.Compression.fp16")),
    "sparse_as_dense_sgd": (sc_sparse(True, "sgd"), HVD_HX),
    "sparse_allgather_sgd": (sc_sparse(False, "sgd"), HVD_HX),
    "sparse_allgather_sparse_adam": (sc_sparse(False, "sparse_adam", head=False), HVD_HX),
    "param_groups_unnamed": (sc_param_groups, HVD_HX),
    "backward_passes_per_step_2": (sc_backward_passes(False), HVD_HX),
    "set_backward_passes_per_step_2": (sc_backward_passes(True), HVD_HX),
    "predivide_2": (sc_options(gradient_predivide_factor=2.0), HVD_HX),
    # With 2 workers, predivide 2 scales by exact powers of two: (a/2 + b/2) * 1 == (a + b) / 2 bit for
    # bit, so ignoring the factor would pass predivide_2. 3 rounds differently: it shows.
    "predivide_3": (sc_options(gradient_predivide_factor=3.0), HVD_HX),
    "predivide_op_sum_rejected": (sc_options(gradient_predivide_factor=2.0, op=hvd.Sum), HVD_HX),
    "groups_int_2": (sc_groups("int", groups=2), HVD_HX),
    "groups_list": (sc_groups("list"), HVD_HX),
    "num_groups_2_deprecated": (sc_groups("int", num_groups=2), HVD_HX),
    # Horovod's grouped allreduce passes no prescale/postscale: the predivide factor is ignored there.
    "groups_2_predivide_3": (sc_groups("int", groups=2, gradient_predivide_factor=3.0), HVD_HX),
    "groups_invalid_negative": (sc_groups("int", groups=-1), HVD_HX),
    "clip_between_synchronize_and_step": (sc_clip, HVD_HX),
    "freeze_unfreeze_between_steps": (sc_freeze, HVD_HX),
    "adasum": (sc_adasum, HVD_HX),
}


# ================================================================================ broadcast scenarios
BCAST_KW = dict(lr=0.05, momentum=0.9, centered=True)   # each class takes the ones its __init__ accepts
MIN_BCAST_CLASSES = {"SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam",
                     "RMSprop", "Rprop"}


def _kwargs_for(cls):
    accepted = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in BCAST_KW.items() if k in accepted}


def optimizer_classes():
    """(included: {name: class}, excluded: {name: why}) among torch.optim's Optimizer subclasses,
    found as Horovod's test/parallel/test_torch.py does (``Optimizer.__subclasses__()``, here
    recursively), keeping those that take a model of 1-D and 2-D parameters with BCAST_KW."""
    def walk(c):
        for s in c.__subclasses__():
            yield s
            yield from walk(s)
    found = {c.__name__: c for c in walk(torch.optim.Optimizer)
             if c.__module__.split(".")[:2] == ["torch", "optim"] and not c.__name__.startswith("_")}
    included, excluded = {}, {}
    for name, cls in sorted(found.items()):
        if cls is torch.optim.LBFGS:
            excluded[name] = ("hvd.broadcast_optimizer_state refuses it (ValueError: cannot broadcast "
                              "torch.optim.LBFGS state); its step() also needs a closure")
            continue
        if cls is torch.optim.SparseAdam:
            excluded[name] = ("needs sparse gradients: broadcast on an Embedding(sparse=True) model instead "
                              "(scenarios bcast_*_SparseAdam)")
            continue
        try:      # a 2-D weight and a 1-D bias, one plain step
            torch.manual_seed(0)
            lin = torch.nn.Linear(3, 2)
            o = cls(lin.parameters(), **_kwargs_for(cls))
            lin(torch.randn(4, 3)).sum().backward()
            o.step()
        except Exception as e:     # noqa: BLE001
            excluded[name] = f"cannot optimize a 1-D and a 2-D parameter with {_kwargs_for(cls)}: {type(e).__name__}: {e}"
            continue
        included[name] = cls
    return included, excluded


def broadcast_scenario_names():
    included, _ = optimizer_classes()
    names = list(included) + ["SparseAdam"]
    # fresh first: a hang in a resume case ends its launch, the fresh results are in by then
    return [f"bcast_fresh_{n}" for n in names] + [f"bcast_resume_{n}" for n in names]


def _bcast_model(cls_name):
    return build("emb_only" if cls_name == "SparseAdam" else "mlp", seed=7)


def _bcast_data(cls_name, seed, same_on_every_rank=False):
    return batches("emb" if cls_name == "SparseAdam" else "mlp", n=3, seed=seed, shared=same_on_every_rank)


def _make_base(cls_name, model):
    if cls_name == "SparseAdam":
        return torch.optim.SparseAdam(model.parameters(), lr=0.05)
    cls = optimizer_classes()[0][cls_name]
    return cls(model.parameters(), **_kwargs_for(cls))


def _snapshot(model, opt):
    sd = opt.state_dict()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "state": {str(k): {kk: (vv.detach().clone() if torch.is_tensor(vv) else vv) for kk, vv in s.items()}
                      for k, s in sd["state"].items()},
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]}


def _diff_keys(a, b, prefix=""):
    """Where two snapshots differ (for the report)."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{prefix}{k} (only on one side)")
            else:
                out += _diff_keys(a[k], b[k], f"{prefix}{k}.")
    elif not _same(a, b):
        extra = _max_abs_diff(a, b) if torch.is_tensor(a) and torch.is_tensor(b) else f"{a!r} vs {b!r}"
        out.append(f"{prefix.rstrip('.')}: {extra}")
    return out


def sc_broadcast(case, cls_name):
    def fn(v, tag, info):
        model = _bcast_model(cls_name)
        opt = _dist(v, _make_base(cls_name, model), _named(model, tag))
        if case == "resume":
            # A checkpoint, made identically on every rank (plain optimizer, same data everywhere), then
            # loaded on rank 0 only: the other ranks start fresh, as when resuming from rank 0's file.
            twin = _bcast_model(cls_name)
            plain = _make_base(cls_name, twin)
            for b in _bcast_data(cls_name, seed=9, same_on_every_rank=True):
                plain.zero_grad()
                loss_of(twin, b).backward()
                plain.step()
            saved = copy.deepcopy(plain.state_dict())
            saved["param_groups"][0]["lr"] *= 0.5           # as if a scheduler had lowered it
            if R == 0:
                model.load_state_dict(twin.state_dict())
                opt.load_state_dict(saved)
            info["rank0_state_keys"] = sorted({k for s in saved["state"].values() for k in s})
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        snap = _snapshot(model, opt)
        root = hvd.broadcast_object(snap, root_rank=0, name=f"{tag}.snapshot")
        info["consistent_with_rank0"] = _same(snap, root)
        info["differs_from_rank0"] = _diff_keys(root, snap)[:20]
        fit(model, opt, _bcast_data(cls_name, seed=11))
        out = {f"after_broadcast.param.{n}": t for n, t in snap["params"].items()}
        for k, s in snap["state"].items():
            for kk, vv in s.items():
                if torch.is_tensor(vv):
                    out[f"after_broadcast.state.{k}.{kk}"] = vv
                else:
                    info.setdefault("after_broadcast_scalars", {})[f"{k}.{kk}"] = repr(vv)
        info["after_broadcast_param_groups"] = repr(snap["param_groups"])
        out.update(_params(model, "after_2_steps."))
        return out
    return fn


def broadcast_scenarios():
    out = {}
    for name in broadcast_scenario_names():
        _, case, cls_name = name.split("_", 2)
        out[name] = (sc_broadcast(case, cls_name), HVD_HX)
    return out


# ============================================================================================= running
def compare(name, fn, variants):
    """Run both variants; compare their tensors bit for bit."""
    res = {"scenario": name, "rank": R, "variants": list(variants), "runs": {}}
    outs = {}
    for v in variants:
        info = {}
        t0 = time.time()
        try:
            outs[v] = fn(v, f"{name}.{v.replace(':', '-')}", info)
            res["runs"][v] = {"ok": True, "info": info}
        except Exception as e:     # noqa: BLE001
            res["runs"][v] = {"ok": False, "error": _err(e), "info": info}
        res["runs"][v]["seconds"] = round(time.time() - t0, 3)
    a, b = variants
    if a in outs and b in outs:
        ta, tb = outs[a], outs[b]
        diffs = {k: (_max_abs_diff(ta[k], tb[k]) if not _same(ta[k], tb[k]) else 0.0)
                 for k in ta if k in tb}
        res["equal"] = ta.keys() == tb.keys() and all(_same(ta[k], tb[k]) for k in ta)
        res["missing_in_b"] = sorted(set(ta) - set(tb))
        res["extra_in_b"] = sorted(set(tb) - set(ta))
        res["diffs"] = {k: d for k, d in diffs.items() if d != 0.0}
        num = [d for d in diffs.values() if isinstance(d, float)]
        res["max_abs_diff"] = max(num) if num else 0.0
    return res


def _write(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, default=repr)
    os.replace(path + ".tmp", path)


def main():
    global hx, R, N
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", choices=["main", "broadcast"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()

    hvd.init()
    R, N = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    out = os.path.join(args.out, f"rank{R}")
    os.makedirs(out, exist_ok=True)
    import horovod_ext
    hx = horovod_ext

    registry = MAIN_SCENARIOS if args.job == "main" else broadcast_scenarios()
    names = [n for n in args.only.split(",") if n] or list(registry)
    for name in names:
        base = os.path.join(out, name)
        open(base + ".started", "w").close()

        def hang(name=name, base=base):
            main_frame = sys._current_frames().get(threading.main_thread().ident)
            with open(base + ".hang", "w") as f:
                f.write(f"rank {R}: scenario {name} did not finish within {args.timeout:.0f} s "
                        f"(deadlock in a collective?); main thread:\n")
                f.write("".join(traceback.format_stack(main_frame)[-12:]) if main_frame else "?\n")
                f.write("all threads:\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            print(f"rank {R}: HANG in scenario {name}; exiting", file=sys.stderr, flush=True)
            os._exit(3)
        timer = threading.Timer(args.timeout, hang)
        timer.daemon = True
        timer.start()
        t0 = time.time()
        if name not in registry:
            res = {"scenario": name, "rank": R, "setup_error": f"unknown scenario {name!r} in job {args.job}"}
        else:
            fn, variants = registry[name]
            try:
                res = compare(name, fn, variants)
            except Exception as e:     # noqa: BLE001
                res = {"scenario": name, "rank": R, "setup_error": _err(e)}
        res["seconds"] = round(time.time() - t0, 3)
        _write(base + ".json", res)
        # End the scenario together: a rank stuck in this scenario's collectives shows as a hang here,
        # not as a mismatch in the next scenario's.
        hvd.allgather_object(name, name=f"dropin.end.{name}")
        timer.cancel()
    print(f"rank {R}: all {len(names)} scenarios done", flush=True)


if __name__ == "__main__":
    main()
