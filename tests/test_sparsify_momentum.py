"""DEF under momentum and Adam (the perturbation in the wrapped optimizer's units), and top-k selection
by a sampled threshold: single-process unit tests with a stand-in communicator, and 2-worker checks
under real horovodrun (tests/workers/momentum_checks.py)."""
from __future__ import annotations

import io
import math
from types import SimpleNamespace

import pytest
import torch
import horovod.torch as hvd

from horovod_ext import state as codec_state_io
from horovod_ext.compression import sparsify
from horovod_ext.compression.base import ReduceContext
from horovod_ext.compression.sparsify import RandomBlock, TopK, topk_indices
from tests.horovod_harness import run_horovod


# ---- a one-worker stand-in for the communicator ------------------------------------------------------------
class _Stats:
    def __getattr__(self, name):
        return 0.0


def _comm():
    return SimpleNamespace(size=1, stats=_Stats(), allgather=lambda t, name: t.clone(),
                           allreduce_=lambda t, name, op: t)


def reduce_once(codec, grad, state, param=None):
    """Run ``codec.reduce`` to its end on one worker (the collectives return their input)."""
    ctx = ReduceContext(name="w", state=state, comm=_comm(), op=hvd.Average, param=param)
    gen = codec.reduce(grad, ctx)
    handle = next(gen)
    try:
        while True:
            handle = gen.send(handle)
    except StopIteration as stop:
        return stop.value


def train(codec, grads, group, p0):
    """Each step as the optimizer runs it: reduce, before_step, a plain SGD step of lr, after_step."""
    state, p = {}, p0.clone()
    for g in grads:
        p.grad = reduce_once(codec, g, state, p)
        codec.before_step(p, state, group)
        p.data.add_(p.grad, alpha=-group["lr"])
        codec.after_step(p, state, group)
    return p, state


def gradients(steps, n=4000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen) * (1 + t) for t in range(steps)]


SGD = {"lr": 0.1, "momentum": 0, "dampening": 0, "weight_decay": 0, "nesterov": False}
SGD_M = {"lr": 0.05, "momentum": 0.9, "dampening": 0.2, "weight_decay": 0, "nesterov": False}
ADAM = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0, "amsgrad": False}
RMSPROP = {"lr": 1e-2, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0, "momentum": 0.5, "centered": False}
ADAGRAD = {"lr": 1e-2, "lr_decay": 0, "weight_decay": 0, "initial_accumulator_value": 0, "eps": 1e-10}
CODECS = {"topk-def": lambda: TopK(0.05, detached=True), "random_block-def": lambda: RandomBlock(0.05)}


# ---- top-k selection ------------------------------------------------------------------------------------------
def _inputs(n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen)
    return {"gaussian": x.abs(), "heavy_tailed": (x * torch.exp(2 * torch.randn(n, generator=gen))).abs(),
            "uniform": torch.rand(n, generator=gen), "sorted": torch.linspace(0, 1, n),
            "mostly_zero": torch.where(torch.rand(n, generator=gen) < 0.97, torch.zeros(n), x.abs())}


@pytest.mark.parametrize("n,ratio", [(70_000, 1 / 16), (300_000, 0.01), (1_000_003, 0.01), (1_000_003, 0.005),
                                     (2_000_000, 0.05)])
@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_selection_is_torch_topk_set(n, ratio, seed):
    k = sparsify._count(n, ratio)
    for tag, score in _inputs(n, seed).items():
        ref = torch.topk(score, k, sorted=False)
        for method in ("sample", "auto"):
            idx = topk_indices(score, k, method)
            assert idx.numel() == k and idx.unique().numel() == k, (tag, method)
            if tag == "mostly_zero" and k > int((score > 0).sum()):
                # ties at zero: any k - nnz zeros will do; the nonzero ones must all be there
                assert bool((score[idx] > 0).sum() == (score > 0).sum()), tag
                continue
            # the same set (ties aside: the same multiset of values, and every value above the k-th)
            assert torch.equal(torch.sort(score[idx]).values, torch.sort(ref.values).values), (tag, method)
            if tag not in ("mostly_zero",):
                assert torch.equal(torch.sort(idx).values, torch.sort(ref.indices).values), (tag, method)


def test_auto_samples_only_where_it_pays(monkeypatch):
    big, small = torch.rand(1 << 20), torch.rand(1000)
    calls = []
    real = sparsify._at_or_above
    monkeypatch.setattr(sparsify, "_at_or_above", lambda *a: calls.append(1) or real(*a))
    topk_indices(big, 10_000)                  # sampled: k >= 4096, k and the sample <= n / 16
    assert calls
    calls.clear()
    for score, k in ((big, 100), (big, (1 << 20) // 8), (small, 10)):
        topk_indices(score, k)
    assert not calls


def test_candidates_are_the_same_with_numpy_and_torch():
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.float64, torch.float16):
        score = torch.randn(50_000, generator=g).abs().to(dtype)
        t = score[17]
        want = torch.nonzero(score >= t).squeeze(1)
        assert torch.equal(sparsify._at_or_above(score, t), want)
        assert torch.equal(sparsify._at_or_above(score[::2], t), torch.nonzero(score[::2] >= t).squeeze(1))


def test_too_few_candidates_falls_back_to_the_full_topk(monkeypatch):
    monkeypatch.setattr(sparsify, "_SAMPLE_SIGMAS", -40.0)     # a threshold far too high
    score = torch.rand(500_000, generator=torch.Generator().manual_seed(3))
    k = 5000
    idx = topk_indices(score, k, "sample")
    assert torch.equal(torch.sort(idx).values, torch.sort(torch.topk(score, k).indices).values)


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="method"):
        topk_indices(torch.rand(10), 2, "guess")


@pytest.mark.parametrize("importance", [False, True])
def test_codec_result_and_residual_equal_the_full_topk(importance):
    grads = gradients(4, n=200_000)
    p = torch.randn(200_000)
    states, outs = {}, {}
    for select in ("full", "auto"):
        codec = TopK(0.05, importance=importance)
        codec._select = select
        st, out = {}, []
        for g in grads:
            out.append(reduce_once(codec, g, st, p))
        states[select], outs[select] = st, out
    assert all(torch.equal(a, b) for a, b in zip(outs["full"], outs["auto"]))
    assert torch.equal(states["full"]["residual"], states["auto"]["residual"])


def test_nonfinite_input_selects_as_torch_topk():
    g = torch.randn(100_000)
    g[[5, 70_000]] = float("nan")
    codec, ref = TopK(0.05), TopK(0.05)
    ref._select = "full"
    a, b = reduce_once(codec, g, {}), reduce_once(ref, g, {})
    assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num())


# ---- DEF in the optimizer's units ------------------------------------------------------------------------
def test_labels():
    assert TopK(0.01).label == "topk0.01" and TopK(0.01).detached             # DEF by default
    assert TopK(0.01, coeff=0.5).label == "topk0.01-c0.5"
    assert TopK(0.01, detached=False).label == "topk0.01-ef" and not TopK(0.01, detached=False).detached
    assert TopK(0.01, error_feedback=False).label == "topk0.01-noef" and not TopK(0.01, error_feedback=False).detached
    assert TopK(0.01, detached=True, error_feedback=False).error_feedback      # DEF is error feedback


def test_benchmark_builds_topk_def():
    from horovod_ext import Compression
    c = Compression.from_spec("topk0.01-imp-c0.5")
    assert isinstance(c, TopK) and c.detached and c.importance and c.coeff == 0.5
    assert vars(Compression.from_spec("topk0.01-imp-def-c0.5")) == vars(c)     # -def: the default, still accepted
    ef = Compression.from_spec("topk0.01-ef")
    assert not ef.detached and ef.error_feedback and ef.label == "topk0.01-ef"
    with pytest.raises(ValueError):
        Compression.from_spec("topk0.01-bogus")


@pytest.mark.parametrize("kind", list(CODECS))
def test_plain_sgd_perturbation_is_defs_original_rule(kind):
    """Without momentum, x = x~ - coeff * lr * e exactly as before (bit for bit)."""
    codec = CODECS[kind]()
    p, st = train(codec, gradients(5), SGD, torch.randn(4000))
    expected = st["synced"].clone().add_(st["residual"], alpha=-codec.coeff * SGD["lr"])
    assert torch.equal(p, expected)
    assert "grad_sq" not in st and "grad_sq_norm" not in st


@pytest.mark.parametrize("kind", list(CODECS))
def test_momentum_scales_the_perturbation(kind):
    codec = CODECS[kind]()
    p, st = train(codec, gradients(5), SGD_M, torch.randn(4000))
    scale = SGD_M["lr"] * (1 - SGD_M["dampening"]) / (1 - SGD_M["momentum"])
    assert torch.allclose(p, st["synced"] - codec.coeff * scale * st["residual"], rtol=0, atol=1e-6)
    assert "grad_sq" not in st


def _bias_corrected_mean(grads, decay=0.999):
    s = torch.zeros_like(grads[0], dtype=torch.float64)
    for g in grads:
        s = decay * s + (1 - decay) * g.double() ** 2
    return s / (1 - decay ** len(grads))


@pytest.mark.parametrize("kind", list(CODECS))
@pytest.mark.parametrize("group", [ADAM, RMSPROP], ids=["adam", "rmsprop"])
def test_adaptive_optimizer_perturbation_in_its_units(kind, group):
    codec = CODECS[kind]()
    grads = gradients(6)
    p, st = train(codec, grads, group, torch.randn(4000))
    assert set(st) >= {"residual", "synced", "grad_sq", "grad_sq_norm"}
    assert torch.allclose(st["grad_sq"].double(), _bias_corrected_mean(grads), rtol=1e-5)
    assert math.isclose(float(st["grad_sq_norm"]), 1 - 0.999 ** 6, rel_tol=1e-5)
    den = st["grad_sq"].double().sqrt() + group["eps"]
    scale = codec.coeff * group["lr"] / (1 - group.get("momentum", 0))
    expected = st["synced"].double() - scale * st["residual"].double() / den
    assert torch.allclose(p.double(), expected, rtol=0, atol=1e-6)
    assert not torch.equal(p, st["synced"])


def test_other_optimizers_use_lr():
    codec = RandomBlock(0.05)
    p, st = train(codec, gradients(4), ADAGRAD, torch.randn(4000))
    assert torch.equal(p, st["synced"].clone().add_(st["residual"], alpha=-codec.coeff * ADAGRAD["lr"]))


def test_float16_parameters_stay_finite_under_adam():
    codec = TopK(0.05, detached=True)
    grads = [g.half() * 1e-3 for g in gradients(4)]
    p, st = train(codec, grads, ADAM, torch.randn(4000).half())
    assert p.dtype == torch.float16 and bool(torch.isfinite(p).all())


@pytest.mark.parametrize("kind", list(CODECS))
def test_nonfinite_gradient_leaves_the_running_mean(kind):
    codec = CODECS[kind]()
    group, p = ADAM, torch.randn(4000)
    # a non-finite first sample: no estimate yet, so no perturbation and nothing non-finite
    st = {}
    bad = gradients(1)[0]
    bad[7] = float("inf")
    out = reduce_once(codec, bad, st, p)
    assert not bool(torch.isfinite(out).all())       # the step is skipped: no hooks run
    assert float(st["grad_sq_norm"]) == 0.0 and not bool(st["grad_sq"].any())
    grads = gradients(3, seed=1)
    for g in grads:
        p.grad = reduce_once(codec, g, st, p)
        codec.before_step(p, st, group)
        p.data.add_(p.grad, alpha=-group["lr"])
        codec.after_step(p, st, group)
    assert bool(torch.isfinite(p).all())
    assert torch.allclose(st["grad_sq"].double(), _bias_corrected_mean(grads), rtol=1e-5)
    # a non-finite later sample: the step is skipped everywhere and the mean is as it was
    before = st["grad_sq"].clone(), st["grad_sq_norm"].clone()
    g = gradients(1, seed=2)[0]
    g[0] = float("nan")
    reduce_once(codec, g, st, p)
    assert torch.equal(st["grad_sq"], before[0]) and torch.equal(st["grad_sq_norm"], before[1])


@pytest.mark.parametrize("kind", list(CODECS))
def test_state_round_trip_and_on_load(kind):
    codec = CODECS[kind]()
    p, st = train(codec, gradients(5), ADAM, torch.randn(4000))
    assert {"grad_sq", "grad_sq_norm", "residual"} <= set(codec.per_worker_averaged)
    for key, value in st.items():
        assert isinstance(value, torch.Tensor) or (key == "step" and isinstance(value, int)), key
    replicated = codec_state_io.replicated(codec, codec_state_io.save_codec_states({"w": st}))["w"]
    assert set(replicated) == ({"synced", "step"} & set(st))
    buf = io.BytesIO()
    torch.save(codec_state_io.save_codec_states({"w": st}), buf)
    loaded = codec_state_io.load_codec_states(torch.load(io.BytesIO(buf.getvalue()), weights_only=True),
                                              {"w": torch.device("cpu")})["w"]
    q = torch.zeros_like(p)                       # another init; on_load re-derives this worker's x
    codec.on_load(q, loaded, ADAM)
    assert torch.equal(q, p)
    # resharding to another worker count averages the running means with the residuals
    with pytest.warns(UserWarning, match="loading codec state written by 2 workers into 3"):
        merged = codec_state_io.reshard(codec, [codec_state_io.save_codec_states({"w": st})] * 2, 2, 3)["w"]
    assert torch.equal(merged["grad_sq"], st["grad_sq"]) and torch.equal(merged["grad_sq_norm"], st["grad_sq_norm"])


# ---- 2 workers under horovodrun -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reports():
    return run_horovod("workers/momentum_checks.py", np=2, timeout=600)


@pytest.mark.horovod
@pytest.mark.parametrize("kind", list(CODECS))
@pytest.mark.parametrize("opt", ["sgd", "sgd_momentum", "adam"])
def test_workers_def(reports, kind, opt):
    for rep in reports:
        r = rep["def"][f"{kind}/{opt}"]
        assert r["synced_equal_across_workers"], r
        assert r["params_differ_across_workers"], r
        assert r["param_is_synced_minus_coeff_d"] <= 1e-6, r
        assert r["conservation_rel_err"] < 1e-5, r
        assert r["keys"] == sorted({"residual", "synced"} | ({"step"} if kind == "random_block-def" else set())
                                   | ({"grad_sq", "grad_sq_norm"} if opt == "adam" else set())), r
        if opt == "adam":
            assert r["grad_sq_rel_err"] < 1e-5, r


@pytest.mark.horovod
@pytest.mark.parametrize("kind", list(CODECS))
def test_workers_checkpoint_resumes_exactly(reports, kind):
    for rep in reports:
        r = rep["resume"][kind]
        assert r["params_rederived_equal"] and r["next_step_equal"], r


@pytest.mark.horovod
@pytest.mark.parametrize("kind", list(CODECS))
def test_workers_nonfinite_skip_leaves_state(reports, kind):
    for rep in reports:
        r = rep["nonfinite"][kind]
        assert r["skipped"] == 1 and r["params_unchanged"] and r["grad_sq_unchanged"], r
        assert r["residual_unchanged"] and r["finite_after"], r


@pytest.mark.horovod
@pytest.mark.parametrize("kind", list(CODECS))
def test_workers_pipelined(reports, kind):
    for rep in reports:
        r = rep["pipeline"][kind]
        assert r["finite"] and r["moved"] and r["synced_equal_across_workers"], r
        assert r["param_is_synced_minus_coeff_d"] <= 1e-6, r


@pytest.mark.horovod
def test_workers_sampled_topk_is_exact(reports):
    for rep in reports:
        assert rep["sampled_topk"]["equal_to_exact"], rep["sampled_topk"]
        assert rep["sampled_topk"]["used_sampling"], rep["sampled_topk"]
