"""PowerSGD: unit tests in one process (Horovod of size 1), then one real 2-worker horovodrun job whose
every step is recomputed here by a one-process reference implementation from both workers' gradients."""
import math
import warnings

import pytest
import torch
import horovod.torch as hvd

import horovod_ext as hx
from horovod_ext import state as codec_state_io
from horovod_ext.communicator import Communicator
from horovod_ext.compression import ReduceContext
from horovod_ext.compression.base import stable_hash
from horovod_ext.compression.powersgd import PowerSGD
from horovod_ext.reduction import Reduction, complete
from tests.horovod_harness import run_horovod

C = hx.Compression


@pytest.fixture(scope="module", autouse=True)
def horovod_single():
    hvd.init()
    yield


# ---- the reference: PowerSGD in one process, in float64, from every worker's gradient ---------------------------
def gram_schmidt(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning x's (modified Gram-Schmidt, twice; a zero column stays zero)."""
    x = x.clone()
    for _ in range(2):
        for i in range(x.shape[1]):
            for j in range(i):
                x[:, i] -= (x[:, j] @ x[:, i]) * x[:, j]
            norm = x[:, i].norm()
            if norm > 0:
                x[:, i] /= norm
    return x


def first_q(name: str, m: int, r: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + stable_hash(name)) % (2**63))
    return torch.randn(m, r, generator=gen, dtype=torch.float32)


def reference(steps, name, rank=4, seed=0, average=True, ef=True, slots=False, active=None):
    """``steps[t][w]``: worker w's gradient at step t. Returns per step the averaged (or summed) result, every
    worker's residual and the new Q. ``slots``: step t continues the state of step t-2 (pipelining);
    ``active[t][w]`` False: worker w has joined (adds zeros, keeps its state)."""
    workers = len(steps[0])
    shape = steps[0][0].shape
    n = shape[0]
    m = math.prod(shape) // n
    r = min(n, m, rank)
    chains, out = {}, []
    for t, grads in enumerate(steps):
        on = active[t] if active else [True] * workers
        key = t % 2 if slots else 0
        residuals, q = chains.get(key, ([torch.zeros(n, m, dtype=torch.float64)] * workers, None))
        if q is None:
            q = first_q(name, m, r, seed).double()
        ms = [g.double().reshape(n, m) + (residuals[w] if ef else 0) for w, g in enumerate(grads)]
        qh = gram_schmidt(q)
        p = gram_schmidt(sum(ms[w] @ qh for w in range(workers) if on[w]))
        q = sum(ms[w].T @ p for w in range(workers) if on[w])
        if average:
            q = q / workers
        approx = p @ q.T
        residuals = [ms[w] - approx if on[w] else residuals[w] for w in range(workers)]
        chains[key] = (residuals, q)
        out.append({"out": approx.reshape(shape), "residuals": [e.reshape(-1) for e in residuals], "q": q})
    return out


def kept(state):
    """The codec state a checkpoint keeps (keys starting with "_" are scratch buffers)."""
    return {k: v for k, v in state.items() if not k.startswith("_")}


def rel(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64).reshape(-1), torch.as_tensor(b, dtype=torch.float64).reshape(-1)
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / (scale if scale > 0 else 1.0) if b.numel() else 0.0


def q_rel(q, q_ref) -> float:
    """Q up to the sign of each column (QR and Gram-Schmidt may differ in it; the span is what matters)."""
    q = torch.tensor(q, dtype=torch.float64).reshape(q_ref.shape)
    sign = torch.sign((q * q_ref).sum(0))
    return rel(q, q_ref * sign)


# ---- one process -------------------------------------------------------------------------------------------------
def reduce(codec, grad, state, name="w", op=hvd.Average, slot=None):
    red = Reduction(codec, grad, ReduceContext(name=name, state=state, comm=Communicator(), op=op, slot=slot))
    complete([red])
    return red.result


@pytest.mark.parametrize("codec", [C.powersgd(), C.powersgd(1), C.powersgd(8, min_compression_rate=0.0),
                                   C.powersgd(4, min_compression_rate=1.5, seed=7), C.powersgd(2, error_feedback=False),
                                   C.powersgd(3, min_compression_rate=1e-5, seed=12, error_feedback=False)],
                         ids=lambda c: c.label)
def test_every_label_parses_back_to_the_same_codec(codec):
    again = C.from_spec(codec.label)
    assert type(again) is PowerSGD and vars(again) == vars(codec)


def test_labels_and_defaults():
    assert C.powersgd().label == "powersgd4" and C.from_spec("powersgd").label == "powersgd4"
    assert C.from_spec("PowerSGD2-s3").label == "powersgd2-s3"
    assert C.powersgd(min_compression_rate=1e-5).label == "powersgd4-mcr0.00001"
    assert C.from_spec("powersgd4-mcr0").min_compression_rate == 0.0


@pytest.mark.parametrize("spec,message", [
    ("powersgd4-x", "unknown option -x in compression 'powersgd4-x'; valid options: -mcrVALUE, -sVALUE, -noef"),
    ("powersgd4-mcr", "unknown option -mcr"), ("powersgd4-mcrx", "'x' is not a valid value"),
    ("powersgd4-s1.5", "'1.5' is not a valid value"), ("powersgd2.5", "'2.5' is not a valid rank"),
    ("powersgd0", "rank must be an int >= 1"), ("powersgdx", "expected -OPTION"),
    ("powersgd4-s-1", "unknown option -s in"), ("zip", "powersgdRANK[-mcrX][-sN][-noef]")])
def test_every_option_is_checked(spec, message):
    with pytest.raises(ValueError) as err:
        C.from_spec(spec)
    assert message in str(err.value)


def test_bad_arguments_are_named():
    for kwargs, message in [({"rank": 0}, "rank"), ({"rank": 2.0}, "rank"), ({"seed": -1}, "seed"),
                            ({"min_compression_rate": -1}, "min_compression_rate"),
                            ({"min_compression_rate": float("inf")}, "min_compression_rate")]:
        with pytest.raises(ValueError, match=message):
            C.powersgd(**kwargs)
    with pytest.raises(TypeError, match="floating dtype"):
        reduce(C.powersgd(), torch.ones(8, 8, dtype=torch.int64), {})


@pytest.mark.parametrize("shape,rate,expected", [
    ((24, 40), 2, (24, 40, 4)), ((16, 4, 3, 3), 2, (16, 36, 4)), ((15,), 2, None), ((), 2, None),
    ((0, 5), 2, None), ((3, 4), 2, None), ((3, 4), 0, (3, 4, 3)), ((1, 1000), 2, None),
    ((16, 16), 2, None),            # (16 + 16) * 4 * 2 = 256: not < 256
    ((17, 16), 2, (17, 16, 4))])
def test_which_tensors_are_compressed(shape, rate, expected):
    assert C.powersgd(4, min_compression_rate=rate).matrix_shape(shape) == expected


def test_first_q_is_seeded_by_name_and_seed():
    codec = C.powersgd(seed=3)
    q = codec.initial_q("layer.weight", 10, 4)
    assert q.dtype == torch.float32 and q.shape == (10, 4)
    assert torch.equal(q, first_q("layer.weight", 10, 4, seed=3))
    assert torch.equal(q, C.powersgd(seed=3).initial_q("layer.weight", 10, 4))
    assert not torch.equal(q, codec.initial_q("layer.bias", 10, 4))
    assert not torch.equal(q, C.powersgd(seed=4).initial_q("layer.weight", 10, 4))


def test_one_worker_matches_the_reference_and_keeps_state():
    codec = C.powersgd()
    state = {}
    grads = [torch.randn(24, 40, generator=torch.Generator().manual_seed(t)) for t in range(5)]
    ref = reference([[g] for g in grads], "w")
    for t, g in enumerate(grads):
        out = reduce(codec, g.clone(), state)
        assert out.shape == g.shape and out.dtype == g.dtype
        assert sorted(kept(state)) == ["q", "residual"]
        assert state["residual"].shape == (960,) and state["residual"].dtype == torch.float32
        assert state["q"].shape == (40, 4)
        assert rel(out, ref[t]["out"]) < 1e-5 and rel(state["residual"], ref[t]["residuals"][0]) < 1e-5
        assert q_rel(state["q"].tolist(), ref[t]["q"]) < 1e-5


def test_error_feedback_conserves_the_gradient_sum():
    codec = C.powersgd(2)
    state, applied, raw = {}, torch.zeros(16, 3, 5, dtype=torch.float64), torch.zeros(16, 3, 5, dtype=torch.float64)
    for t in range(8):
        g = torch.randn(16, 3, 5, generator=torch.Generator().manual_seed(50 + t))
        raw += g.double()
        applied += reduce(codec, g.clone(), state).double()
    assert rel(applied + state["residual"].double().view(16, 3, 5), raw) < 1e-5


def test_low_rank_gradient_is_exact():
    u, v = torch.randn(64, 1), torch.randn(1, 50)        # a Linear gradient from one sample: rank 1
    state = {}
    out = reduce(C.powersgd(4), u @ v, state)
    assert rel(out, u @ v) < 1e-5
    assert float(state["residual"].abs().max()) < 1e-5 * float((u @ v).abs().max())


def test_dtypes():
    g = torch.randn(24, 40, dtype=torch.float64)
    state = {}
    out = reduce(C.powersgd(), g.clone(), state)
    assert out.dtype == torch.float64 and state["residual"].dtype == torch.float64 and state["q"].dtype == torch.float64
    assert rel(out, reference([[g]], "w")[0]["out"]) < 1e-12
    out = reduce(C.powersgd(), torch.randn(24, 40).bfloat16(), {})
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())


def test_zero_gradient_gives_zeros():
    state = {}
    out = reduce(C.powersgd(), torch.zeros(24, 40), state)
    assert torch.equal(out, torch.zeros(24, 40)) and sorted(kept(state)) == ["q", "residual"]
    out = reduce(C.powersgd(), torch.zeros(24, 40), state)         # warm start from a zero Q
    assert torch.equal(out, torch.zeros(24, 40))


def test_nonfinite_gives_nan_and_keeps_state():
    codec = C.powersgd()
    state = {}
    reduce(codec, torch.randn(24, 40), state)
    before = {k: v.clone() for k, v in kept(state).items()}
    for bad in (float("nan"), float("inf")):
        g = torch.randn(24, 40)
        g[3, 7] = bad
        out = reduce(codec, g, state)
        assert bool(torch.isnan(out).all())
        assert sorted(kept(state)) == sorted(before) and all(torch.equal(state[k], before[k]) for k in before)
    with pytest.raises(hx.NonFiniteGradientError):
        hx.allreduce(torch.full((24, 40), float("nan")), name="w.raise", compression=codec, state={})
    fresh = {}                                   # a first step that is skipped: no residual, the first Q
    out = reduce(codec, torch.full((24, 40), float("inf")), fresh)
    assert bool(torch.isnan(out).all()) and torch.equal(fresh["residual"], torch.zeros(960))
    assert torch.equal(fresh["q"], codec.initial_q("w", 40, 4))


def test_plain_tensors_are_an_allreduce_that_takes_any_residual():
    codec = C.powersgd()
    g = torch.randn(15)
    state = {}
    out = reduce(codec, g.clone(), state)
    assert torch.equal(out, g) and state == {}
    state = {"residual": torch.ones(15)}
    assert torch.equal(reduce(codec, g.clone(), state), g + 1) and state == {}
    out = reduce(codec, g.clone(), {}, op=hvd.Sum)
    assert torch.equal(out, g)


def test_release_and_slots():
    codec = C.powersgd()
    assert codec.per_worker_averaged == ("residual", "residual@1") and codec.per_worker_fresh == ()
    state = {"residual": torch.ones(4), "residual@1": torch.full((4,), 2.0), "q": torch.ones(2, 1)}
    assert torch.equal(codec.release(state), torch.full((4,), 3.0)) and sorted(kept(state)) == ["q"]
    assert codec.release(state) is None
    # each pipeline slot has its own chain; without pipelining, slot 1's is folded into slot 0's
    state = {}
    g = [torch.randn(24, 40, generator=torch.Generator().manual_seed(t)) for t in range(3)]
    reduce(codec, g[0].clone(), state, slot=0)
    reduce(codec, g[1].clone(), state, slot=1)
    assert sorted(kept(state)) == ["q", "q@1", "residual", "residual@1"]
    held = state["residual"] + state["residual@1"]
    out = reduce(codec, g[2].clone(), state)
    assert sorted(kept(state)) == ["q", "residual"]
    assert rel(out.reshape(-1) + state["residual"], g[2].reshape(-1) + held) < 1e-6


def test_abandoned_reduction_puts_the_residual_back():
    codec = C.powersgd()
    state = {}
    reduce(codec, torch.randn(24, 40), state)
    residual = state["residual"]
    red = Reduction(codec, torch.randn(24, 40), ReduceContext(name="w", state=state, comm=Communicator(),
                                                              op=hvd.Average))
    assert "residual" not in state                 # taken while in flight
    hvd.synchronize(red.handle)
    red.gen.close()
    assert state["residual"] is residual


def test_checkpoint_keys():
    codec = C.powersgd()
    saved = codec_state_io.save_codec_states({"w": {"residual": torch.ones(6), "residual@1": torch.zeros(6),
                                                    "q": torch.ones(3, 2), "q@1": torch.ones(3, 2)}})
    assert sorted(codec_state_io.replicated(codec, saved)["w"]) == ["q", "q@1"]
    other = codec_state_io.save_codec_states({"w": {"residual": torch.full((6,), 3.0), "residual@1": torch.ones(6),
                                                    "q": torch.ones(3, 2), "q@1": torch.ones(3, 2)}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = codec_state_io.reshard(codec, [saved, other], 2, 3)["w"]
    assert torch.equal(merged["residual"], torch.full((6,), 2.0))
    assert torch.equal(merged["residual@1"], torch.full((6,), 0.5))
    assert torch.equal(merged["q"], torch.ones(3, 2))


# ---- two workers under horovodrun --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reports():
    reps = run_horovod("workers/powersgd_checks.py", np=2, timeout=300)
    return {rep["rank"]: rep for rep in reps}


SHAPES = {"a": (24, 40), "conv": (16, 4, 3, 3), "bias": (15,), "small": (3, 4)}     # as in the worker


def grads_of(reports, tag, name):
    """[step][worker] gradients as both workers reported them."""
    workers = sorted(reports)
    rows = [reports[w][tag][name] if tag != "nan" else reports[w]["nan"]["rows"][name] for w in workers]
    shape = SHAPES[name]
    return [[torch.tensor(rows[w][t]["grad"], dtype=torch.float64).reshape(shape) for w in workers]
            for t in range(len(rows[0]))]


def check_rows(rows_by_worker, ref, tol, ef=True):
    for w, rows in rows_by_worker.items():
        assert len(rows) == len(ref)
        for t, (row, exp) in enumerate(zip(rows, ref)):
            assert rel(row["out"], exp["out"]) < tol, (w, t, rel(row["out"], exp["out"]))
            if ef:
                err = rel(row["residual"], exp["residuals"][w])
                assert err < tol, (w, t, err)
            else:
                assert row["residual"] is None
            assert q_rel(row["q"], exp["q"]) < tol, (w, t, q_rel(row["q"], exp["q"]))
    outs = [[row["out"] for row in rows] for rows in rows_by_worker.values()]
    assert all(o == outs[0] for o in outs), "the workers' results differ"


@pytest.mark.horovod
@pytest.mark.parametrize("tag,name,kwargs,tol", [
    ("avg", "a", {}, 1e-5), ("avg", "conv", {}, 1e-5), ("sum", "a", {"rank": 2, "seed": 3, "average": False}, 1e-5),
    ("f64", "a", {}, 1e-10), ("noef", "a", {"ef": False}, 1e-5)])
def test_two_workers_match_the_reference_at_every_step(reports, tag, name, kwargs, tol):
    ref = reference(grads_of(reports, tag, name), f"{tag}.{name}", **kwargs)
    check_rows({w: rep[tag][name] for w, rep in reports.items()}, ref, tol, ef=kwargs.get("ef", True))
    for rep in reports.values():
        assert rep[tag][name][-1]["keys"] == (["q", "residual"] if kwargs.get("ef", True) else ["q"])


@pytest.mark.horovod
@pytest.mark.parametrize("name", ["bias", "small"])
def test_two_workers_plain_tensors_are_averaged(reports, name):
    steps = grads_of(reports, "avg", name)
    for rep in reports.values():
        for t, row in enumerate(rep["avg"][name]):
            assert rel(row["out"], sum(steps[t]) / 2) < 1e-6
            assert row["residual"] is None and row["q"] is None and row["keys"] == []


@pytest.mark.horovod
def test_two_workers_nonfinite_step_is_nan_everywhere_and_leaves_state(reports):
    for rep in reports.values():
        info = rep["nan"]["info"]
        assert info["a"]["all_nan"] and info["a"]["state_unchanged"]
        assert info["bias"]["any_nan"] and info["bias"]["state_unchanged"]
        assert rep["nan"]["raised"]
    # the skipped step 2 leaves no trace: steps 0, 1, 3, 4 are those of a run without it
    ref = reference(grads_of(reports, "nan", "a"), "nan.a")
    check_rows({w: rep["nan"]["rows"]["a"] for w, rep in reports.items()}, ref, 1e-5)


@pytest.mark.horovod
def test_two_workers_pipelined_slots_are_two_chains(reports):
    rows = {w: rep["pipe"]["rows"] for w, rep in reports.items()}
    steps = [[torch.tensor(rows[w][t]["grad"], dtype=torch.float64).reshape(24, 40) for w in sorted(rows)]
             for t in range(len(rows[0]))]
    check_rows(rows, reference(steps, "pipe.a", slots=True), 1e-5)
    for rep in reports.values():
        assert rep["pipe"]["keys"] == ["q", "q@1", "residual", "residual@1"]


@pytest.mark.horovod
def test_two_workers_join(reports):
    # rank 1 joins; rank 0 reduces one more step, in which rank 1 adds zeros (Average still divides by 2)
    rows0, rows1 = reports[0]["join"], reports[1]["join"]
    assert len(rows0) == 2 and len(rows1) == 1
    g = [[torch.tensor(r[t]["grad"], dtype=torch.float64).reshape(24, 40) for r in (rows0, rows1)] for t in range(1)]
    g.append([torch.tensor(rows0[1]["grad"], dtype=torch.float64).reshape(24, 40), torch.zeros(24, 40)])
    ref = reference(g, "join.a", active=[[True, True], [True, False]])
    check_rows({0: rows0}, ref, 1e-5)
    check_rows({1: rows1}, ref[:1], 1e-5)


@pytest.mark.horovod
@pytest.mark.parametrize("mode", ["plain", "pipeline"])
def test_two_workers_train_and_round_trip_state(reports, mode):
    for rep in reports.values():
        tr = rep["train"][mode]
        assert tr["eval_after"] < 0.5 * tr["eval_before"], tr
        assert sum(tr["last"]) < 0.5 * sum(tr["first"]), tr
        assert tr["bits"] < 10, tr                      # 5508 gradient elements, 1220 handed to Horovod
        slot_keys = ["q", "q@1", "residual", "residual@1"] if mode == "pipeline" else ["q", "residual"]
        assert tr["keys"]["0.weight"] == slot_keys and tr["keys"]["2.weight"] == slot_keys
        assert tr["keys"]["4.weight"] == [] and tr["keys"]["0.bias"] == []
        assert tr["state_equal"] and tr["continue_equal"], tr
