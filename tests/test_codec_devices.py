"""Every codec under real horovodrun: devices/dtypes (meta default device), non-finite values,
hvd.join() and process sets. Worker: tests/workers/codec_device_checks.py."""
import pytest

from tests.horovod_harness import run_horovod

pytestmark = pytest.mark.horovod

ENV = {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
SPECS = ["none", "fp16", "bf16", "global_qsgd8", "global_qsgd8-tensor", "global_qsgd8-b64", "global_qsgd4",
         "topk0.05", "topk0.05-imp", "topk0.05-sar", "random_block0.05", "random_block0.05-ef", "powersgd4"]
JOIN_OK = {"none", "fp16", "global_qsgd8", "global_qsgd8-tensor", "global_qsgd8-b64", "global_qsgd4",
           "random_block0.05", "random_block0.05-ef", "powersgd4"}


@pytest.fixture(scope="module")
def basic():
    return run_horovod("workers/codec_device_checks.py", np=2, args=["basic"], timeout=900, env=ENV)


@pytest.fixture(scope="module")
def join():
    return run_horovod("workers/codec_device_checks.py", np=3, args=["join"], timeout=900, env=ENV)


def test_every_codec_allocates_on_the_gradients_device(basic):
    """With torch.set_default_device("meta"), a tensor made without a device would land on meta."""
    for rep in basic:
        cases = rep["meta"]
        assert len(cases) == len(SPECS) * 4 * 3 + (len(SPECS) + 2) * 2 * 2
        for key, res in cases.items():
            spec, dtype, _ = key.split("|")
            if spec == "none" and dtype == "bfloat16":
                # Horovod's own allreduce has no bf16; `none` is exactly Horovod's call
                assert "not supported" in res.get("cpu_error", "") and "not supported" in res.get("meta_error", ""), res
                continue
            assert "meta_error" not in res and "cpu_error" not in res, (rep["rank"], key, res)
            assert res["identical"], (rep["rank"], key, res)
            assert res["dtype_device_ok"], (rep["rank"], key, res)
            assert res["finite"], (rep["rank"], key, res)
            assert res.get("residual_identical", True), (rep["rank"], key, res)
        assert "single:global_qsgd2|float32|3001" in cases


@pytest.mark.parametrize("spec", SPECS)
def test_nonfinite_on_one_rank_reaches_every_rank_and_spares_the_state(basic, spec):
    for rep in basic:
        for shape in ("3001", "7"):
            for bad in ("nan", "inf"):
                rec = rep["nonfinite"][f"{spec}|{shape}|{bad}"]
                assert "error" not in rec, (rep["rank"], rec)
                assert rec["output_nonfinite"], (rep["rank"], shape, bad, rec)
                assert rec["state_unchanged"], (rep["rank"], shape, bad, rec)
                assert rec["dtype_device_ok"] and rec["next_finite"], (rep["rank"], shape, bad, rec)
                if spec.startswith("global_qsgd"):
                    assert rec["ctx_nonfinite"], rec
                if spec.startswith(("topk", "random_block")):
                    assert rec["had_residual"], rec


def test_what_horovod_does_under_join(join):
    """Measured facts the codecs rely on (3 ranks, rank 2 joined)."""
    h = join[0]["join"]["horovod"]
    assert h["sum"] == h["active_sum"]                          # the joined rank adds zeros
    assert h["average"] == pytest.approx([v / 3 for v in h["active_sum"]])   # Average divides by all 3
    assert h["max"] == [2.0, 0.0, 20.0] and h["min"] == [0.0, -2.0, 0.0]     # zeros in Max and Min too
    for kind in ("allgather", "alltoall", "broadcast"):
        assert "not supported with Join" in h[kind], h[kind]
    assert all(rep["join"]["join_returned"] in (0, 1) for rep in join)


@pytest.mark.parametrize("spec", SPECS)
def test_codecs_under_join(join, spec):
    for rep in join[:2]:                 # the active ranks
        j = rep["join"]
        assert j["after_ok"]
        for op in ("average", "sum"):
            for shape in ("3001", "7"):
                rec = j["codecs"][f"{spec}|{op}|{shape}"]
                if spec in JOIN_OK:
                    assert rec["ran"], (rep["rank"], op, shape, rec)
                    if spec.startswith("global_qsgd"):
                        assert rec["err_over_bound"] <= 1.0 + 1e-5, (rep["rank"], op, shape, rec)
                    else:
                        assert rec["exact"], (rep["rank"], op, shape, rec)
                else:
                    assert not rec["ran"] and "Join" in rec["error"], rec
                    # the codec's own message (hx.allreduce shows it once the scheduler passes
                    # Horovod's error into the codec; the scheduler lives in horovod_ext/reduction.py)
                    if rec["error_type"] == "JoinNotSupportedError":
                        assert f"compression '{spec}" in rec["error"], rec


@pytest.mark.parametrize("spec", ["bf16", "topk0.05"])
def test_codecs_that_cannot_join_name_themselves(join, spec):
    for rep in join[:2]:
        for shape in ("3001", "7"):
            rec = rep["join"]["throw"][f"{spec}|{shape}"]
            assert rec["outcome"] == "JoinNotSupportedError", rec
            assert f"compression '{spec}" in rec["message"] and "hvd.join()" in rec["message"], rec
            assert "global_qsgd" in rec["message"], rec


@pytest.mark.parametrize("spec", SPECS)
def test_codecs_on_a_process_set_of_two_out_of_three(join, spec):
    assert "ps_rank" not in join[0]["pset"]
    assert [join[1]["pset"]["ps_rank"], join[2]["pset"]["ps_rank"]] == [0, 1]
    for rep in join[1:]:
        for op in ("average", "sum"):
            for shape in ("3001", "7"):
                rec = rep["pset"][f"{spec}|{op}|{shape}"]
                assert "error" not in rec, (rep["rank"], rec)
                assert rec["dtype_ok"], rec
                if spec.startswith("global_qsgd"):
                    assert rec["err_over_bound"] <= 1.0 + 1e-5, rec
                else:
                    assert rec["exact"], (rep["rank"], op, shape, rec)
