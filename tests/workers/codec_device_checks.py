"""Every codec under real Horovod: devices and dtypes, non-finite values, hvd.join(), process sets.

``python codec_device_checks.py basic`` (2 ranks; HOROVOD_DYNAMIC_PROCESS_SETS=1):
* meta: each codec reduces CPU gradients (float32, float64, float16, bfloat16; large, small and 2-D
  shapes; two steps, so error-feedback residuals are used) once normally and once with
  ``torch.set_default_device("meta")`` in force: a tensor made without an explicit device lands on
  meta and breaks the reduction or changes the result. Codecs run in this thread (hx.allreduce, or
  the same Reduction/complete machinery when a parameter is needed), because the default device is
  thread-local. 2-bit Global-QSGD (one worker only) runs on singleton process sets.
* nonfinite: NaN or Inf on rank 1 only; every rank's result must be non-finite and every rank's
  residual unchanged; the next finite step works.

``python codec_device_checks.py join`` (3 ranks; HOROVOD_DYNAMIC_PROCESS_SETS=1):
* join: rank 2 calls hvd.join() at once; ranks 0 and 1 reduce with every codec, op Average and Sum,
  and compare with hvd.allreduce of the plain tensors under the same join (and record what Horovod
  does: what a joined rank contributes, what Average divides by);
* pset: every codec on the process set [1, 2] of the 3 ranks, against exact results.

Every rank regenerates every rank's inputs from seeds, so exact results are known locally; the pytest
side (tests/test_codec_devices.py) asserts on the reports.
"""
import math
import sys
import traceback

import torch
import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError

import horovod_ext as hx
from horovod_ext import packing
from horovod_ext.communicator import Communicator
from horovod_ext.compression import ReduceContext
from horovod_ext.compression.cast import JoinNotSupportedError
from horovod_ext.reduction import Reduction, complete
from tests.workers.common import emit

MODE = sys.argv[1]
hvd.init()
R, N = hvd.rank(), hvd.size()
torch.set_num_threads(1)
report = {"rank": R, "size": N, "mode": MODE}

SPECS = ["none", "fp16", "bf16", "global_qsgd8", "global_qsgd8-tensor", "global_qsgd8-b64", "global_qsgd4",
         "topk0.05", "topk0.05-imp", "topk0.05-sar", "random_block0.05", "random_block0.05-ef", "powersgd4"]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def codec_for(spec: str):
    """Codecs with fixed seeds, so that two runs of the same reduction are identical."""
    c = hx.Compression.from_spec(spec)
    if spec.startswith("global_qsgd"):
        c = hx.Compression.global_qsgd(c.bits, seed=11, bucket=c.bucket)
    return c


def x_for(rank: int, seed: int, shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed * 100 + rank)
    return torch.randn(shape, generator=g, device="cpu", dtype=torch.float64).to(dtype)


def param_for(numel: int, shape, dtype) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(999)
    return torch.randn(shape, generator=g, device="cpu", dtype=torch.float64).to(dtype)


_comms: dict = {}


def reduce_once(codec, tensor, name, state, op=hvd.Average, process_set=hvd.global_process_set, param=None):
    """What hx.allreduce does (in this thread), with a parameter for importance-weighted top-k and
    without raising on a non-finite result (the optimizer's job): returns (result, ctx)."""
    comm = _comms.setdefault(id(process_set), Communicator(process_set))
    ctx = ReduceContext(name=name, state=state, comm=comm, op=op, param=param)
    red = Reduction(codec, tensor, ctx)
    complete([red])
    return red.result, ctx


def run(spec, codec, tensor, name, state, op=hvd.Average, process_set=hvd.global_process_set, param=None):
    if spec.endswith("-imp"):
        return reduce_once(codec, tensor, name, state, op, process_set, param)[0]
    return hx.allreduce(tensor, name, compression=codec, op=op, process_set=process_set, state=state)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.float().nan_to_num(7.0), b.float().nan_to_num(7.0))


def err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:600]


# ------------------------------------------------------------------------------------------------ basic
def meta_case(spec, dtype, shape, process_set=hvd.global_process_set, tag=""):
    """One codec, dtype and shape: two steps normally, then the same two steps under the meta default."""
    codec = codec_for(spec)
    name = f"meta.{spec}.{dtype}.{'x'.join(map(str, shape))}{tag}"
    rank = process_set.rank()
    param = param_for(0, shape, dtype)
    inputs = [x_for(rank, s, shape, dtype) for s in (1, 2)]
    res = {}
    outs = {}
    for mode in ("cpu", "meta"):
        state = {}
        results = []
        try:
            if mode == "meta":
                torch.set_default_device("meta")
            for t, x in enumerate(inputs):
                results.append(run(spec, codec, x.clone(), name, state, process_set=process_set, param=param))
            if hasattr(codec, "after_step") and spec.startswith("random_block"):
                p = param.clone()
                codec.after_step(p, state, {"lr": 0.1})
                results.append(p)
        except Exception as e:   # noqa: BLE001 - reported, asserted on the pytest side
            res[f"{mode}_error"] = err(e)
            traceback.print_exc()
        finally:
            torch.set_default_device(None)
        outs[mode] = (results, state)
    if "cpu_error" in res or "meta_error" in res:
        return res
    (a, sa), (b, sb) = outs["cpu"], outs["meta"]
    res["identical"] = all(same(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    res["dtype_device_ok"] = all(o.dtype == dtype and o.device.type == "cpu" and o.shape == inputs[0].shape
                                 for o in b[:2])
    res["finite"] = all(bool(torch.isfinite(o.float()).all()) for o in b)
    if "residual" in sa or "residual" in sb:
        res["residual_identical"] = ("residual" in sa and "residual" in sb
                                     and same(sa["residual"], sb["residual"])
                                     and sb["residual"].device.type == "cpu")
    return res


def meta_checks():
    out = {}
    shapes = [(3001,), (7,), (37, 53)]
    for spec in SPECS:
        for dname, dtype in DTYPES.items():
            for shape in shapes:
                out[f"{spec}|{dname}|{'x'.join(map(str, shape))}"] = meta_case(spec, dtype, shape)
    # one worker per process set: 2-bit Global-QSGD has room for one worker's sum only
    singles = [hvd.add_process_set([r]) for r in range(N)]
    mine = singles[R]
    for spec in SPECS + ["global_qsgd2", "global_qsgd2-tensor"]:
        for dname in ("float32", "float64"):
            for shape in [(3001,), (7,)]:
                out[f"single:{spec}|{dname}|{'x'.join(map(str, shape))}"] = meta_case(
                    spec, DTYPES[dname], shape, process_set=mine, tag=".single")
    hvd.allreduce(torch.zeros(1), name="meta.singles.done")
    for ps in singles:
        hvd.remove_process_set(ps)
    return out


def nonfinite_checks():
    out = {}
    for spec in SPECS:
        codec = codec_for(spec)
        for shape in [(3001,), (7,)]:
            for bad in ("nan", "inf"):
                key = f"{spec}|{shape[0]}|{bad}"
                name = f"nf.{key}"
                state = {}
                rec = {}
                try:
                    param = param_for(0, shape, torch.float32)
                    x1 = x_for(R, 1, shape)
                    reduce_once(codec, x1, name, state, param=param)
                    before = {k: v.clone() for k, v in state.items() if torch.is_tensor(v)}
                    x2 = x_for(R, 2, shape)
                    if R == N - 1:
                        # far from the largest entries, so a sparsifier would not pick it by itself
                        x2[-1] = float(bad)
                    o2, ctx = reduce_once(codec, x2, name, state, param=param)
                    rec["output_nonfinite"] = not bool(torch.isfinite(o2).all())
                    rec["ctx_nonfinite"] = ctx.nonfinite
                    rec["dtype_device_ok"] = o2.dtype == x2.dtype and o2.device == x2.device
                    after = {k: v for k, v in state.items() if torch.is_tensor(v)}
                    rec["state_unchanged"] = (before.keys() == after.keys()
                                              and all(torch.equal(before[k], after[k]) for k in before))
                    rec["had_residual"] = "residual" in before
                    # the next, finite step reduces normally
                    x3 = x_for(R, 3, shape)
                    o3, ctx3 = reduce_once(codec, x3, name, state, param=param)
                    rec["next_finite"] = bool(torch.isfinite(o3).all()) and not ctx3.nonfinite
                except Exception as e:  # noqa: BLE001
                    rec["error"] = err(e)
                    traceback.print_exc()
                out[key] = rec
    return out


# ------------------------------------------------------------------------------------------------ join
def join_checks():
    out = {"horovod": {}, "codecs": {}, "throw": {}}
    J = N - 1            # the rank that joins
    if R == J:
        out["join_returned"] = hvd.join()
        return out
    active = [r for r in range(N) if r != J]
    shapes = [(3001,), (7,)]
    # What Horovod itself does with a joined rank
    x = torch.tensor([float(R + 1), -(R + 1.0), 10.0 * (R + 1)])
    h = out["horovod"]
    h["sum"] = hvd.allreduce(x.clone(), name="j.h.sum", op=hvd.Sum).tolist()
    h["average"] = hvd.allreduce(x.clone(), name="j.h.avg", op=hvd.Average).tolist()
    h["max"] = hvd.allreduce(x.clone(), name="j.h.max", op=hvd.Max).tolist()
    h["min"] = hvd.allreduce(x.clone(), name="j.h.min", op=hvd.Min).tolist()
    h["active_sum"] = sum(torch.tensor([float(r + 1), -(r + 1.0), 10.0 * (r + 1)]) for r in active).tolist()
    for kind, fn in (("allgather", lambda: hvd.allgather(x.clone(), name="j.h.ag")),
                     ("alltoall", lambda: hvd.alltoall(torch.zeros(N), name="j.h.a2a")),
                     ("broadcast", lambda: hvd.broadcast(x.clone(), 0, name="j.h.bc"))):
        try:
            fn()
            h[kind] = "ok"
        except HorovodInternalError as e:
            h[kind] = err(e)
    for spec in SPECS:
        codec = codec_for(spec)
        for op_name, op in (("average", hvd.Average), ("sum", hvd.Sum)):
            for shape in shapes:
                key = f"{spec}|{op_name}|{shape[0]}"
                name = f"j.{key}"
                xr = x_for(R, 5, shape)
                rec = {}
                try:
                    plain = hvd.allreduce(xr.clone(), name=name + ".plain", op=op)
                    if spec == "fp16":
                        expected = hvd.allreduce(xr.half(), name=name + ".plain16", op=op).float()
                    else:
                        expected = plain
                    state = {}
                    o = run(spec, codec, xr.clone(), name, state, op=op,
                            param=param_for(0, shape, torch.float32))
                    rec["ran"] = True
                    if spec.startswith("global_qsgd"):
                        m = packing.levels_for(codec.bits, N)
                        s = max(float(x_for(r, 5, shape).abs().max()) for r in active)
                        bound = len(active) * s / m / (N if op == hvd.Average else 1)
                        rec["err_over_bound"] = float((o - expected).abs().max()) / bound
                    elif spec.startswith("random_block"):
                        idx = codec.block(name, 0, xr.numel())
                        mask = torch.zeros(xr.numel(), dtype=torch.bool)
                        mask[idx] = True
                        rec["exact"] = (torch.equal(o.reshape(-1)[mask], expected.reshape(-1)[mask])
                                        and bool((o.reshape(-1)[~mask] == 0).all()))
                    else:
                        rec["exact"] = torch.equal(o, expected)
                except Exception as e:  # noqa: BLE001
                    rec["ran"] = False
                    rec["error"] = err(e)
                    rec["error_type"] = type(e).__name__
                out["codecs"][key] = rec
    # A codec's own message, once the scheduler passes Horovod's error into its generator.
    for spec in ("bf16", "topk0.05"):
        codec = codec_for(spec)
        for shape in shapes:
            comm = _comms.setdefault(id(hvd.global_process_set), Communicator(hvd.global_process_set))
            ctx = ReduceContext(name=f"j.throw.{spec}.{shape[0]}", state={}, comm=comm, op=hvd.Average)
            gen = codec.reduce(x_for(R, 6, shape), ctx)
            handle = next(gen)
            rec = {}
            try:
                Communicator.wait(handle)
                rec["outcome"] = "no error"
            except HorovodInternalError as e:
                try:
                    gen.throw(e)
                    rec["outcome"] = "codec swallowed the error"
                except JoinNotSupportedError as je:
                    rec["outcome"] = "JoinNotSupportedError"
                    rec["message"] = str(je)
                except BaseException as other:  # noqa: BLE001
                    rec["outcome"] = err(other)
            out["throw"][f"{spec}|{shape[0]}"] = rec
    # after the errors, ordinary collectives still work
    out["after_ok"] = hvd.allreduce(torch.ones(1), name="j.after", op=hvd.Sum).tolist() == [float(len(active))]
    out["join_returned"] = hvd.join()
    return out


def topk_exact(members, shape, seed, ratio, op):
    total = torch.zeros(shape, dtype=torch.float32).reshape(-1)
    for r in members:
        x = x_for(r, seed, shape).reshape(-1)
        k = min(x.numel(), max(1, math.ceil(ratio * x.numel())))
        idx = torch.topk(x.abs(), k).indices
        total.index_add_(0, idx, x[idx])
    if op == hvd.Average:
        total /= len(members)
    return total.reshape(shape)


def pset_checks():
    members = [1, 2]
    ps = hvd.add_process_set(members)
    out = {}
    if ps.included():
        out["ps_rank"], out["ps_size"] = ps.rank(), ps.size()
        n = ps.size()
        for spec in SPECS:
            codec = codec_for(spec)
            for op_name, op in (("average", hvd.Average), ("sum", hvd.Sum)):
                for shape in [(3001,), (7,)]:
                    key = f"{spec}|{op_name}|{shape[0]}"
                    name = f"ps.{key}"
                    xr = x_for(R, 8, shape)
                    xs = [x_for(r, 8, shape) for r in members]
                    exact = sum(x.double() for x in xs) / (n if op == hvd.Average else 1)
                    rec = {}
                    try:
                        plain = hvd.allreduce(xr.clone(), name=name + ".plain", op=op, process_set=ps)
                        o = run(spec, codec, xr.clone(), name, {}, op=op, process_set=ps,
                                param=param_for(0, shape, torch.float32))
                        rec["dtype_ok"] = o.dtype == xr.dtype and o.shape == xr.shape
                        if spec == "none":
                            rec["exact"] = torch.equal(o, plain)
                        elif spec == "fp16":
                            rec["exact"] = torch.equal(o, hvd.allreduce(xr.half(), name=name + ".p16", op=op,
                                                                        process_set=ps).float())
                        elif spec == "bf16":
                            # each input and the result rounded once to bf16 (unit roundoff 2**-8)
                            scale = 1 / n if op == hvd.Average else 1
                            bound = 2 ** -8 * (sum(x.double().abs() for x in xs) * scale + exact.abs()) * 1.01 + 1e-12
                            rec["exact"] = bool(((o.double() - exact).abs() <= bound).all())
                        elif spec.startswith("global_qsgd"):
                            m = packing.levels_for(codec.bits, n)
                            s = max(float(x.abs().max()) for x in xs)
                            bound = n * s / m / (n if op == hvd.Average else 1)
                            rec["err_over_bound"] = float((o.double() - exact).abs().max()) / bound
                        elif spec.startswith("topk"):
                            if spec.endswith("-imp"):
                                rec["exact"] = bool(torch.isfinite(o).all())   # ranking depends on the parameter
                            else:
                                rec["exact"] = bool(torch.allclose(o, topk_exact(members, shape, 8, 0.05, op),
                                                                   rtol=1e-6, atol=1e-7))
                        elif spec.startswith("random_block"):
                            idx = codec.block(name, 0, xr.numel())
                            mask = torch.zeros(xr.numel(), dtype=torch.bool)
                            mask[idx] = True
                            rec["exact"] = (torch.equal(o.reshape(-1)[mask], plain.reshape(-1)[mask])
                                            and bool((o.reshape(-1)[~mask] == 0).all()))
                        elif spec.startswith("powersgd"):
                            rec["exact"] = torch.equal(o, plain)       # 1-D tensors go as a plain allreduce
                    except Exception as e:  # noqa: BLE001
                        rec["error"] = err(e)
                        traceback.print_exc()
                    out[key] = rec
    hvd.allreduce(torch.zeros(1), name="ps.done")       # nobody leaves while the others still reduce
    hvd.remove_process_set(ps)
    return out


if MODE == "basic":
    report["meta"] = meta_checks()
    report["nonfinite"] = nonfinite_checks()
elif MODE == "join":
    report["join"] = join_checks()
    report["pset"] = pset_checks()
else:
    raise SystemExit(f"unknown mode {MODE!r}")
hvd.allreduce(torch.zeros(1), name="end")
emit(report)
