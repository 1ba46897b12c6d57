"""Issue 3: compressed allreduce under real horovodrun with 2 and 4 processes."""
import pytest

from tests.horovod_harness import run_horovod


@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4"])
def reports(request):
    # Tensor fusion packs whichever gradients are ready in the same cycle into one buffer, so the
    # ring's summation order (and the last bit of a 4-worker fp32 sum) depends on timing: Horovod's
    # own optimizer is not bit-reproducible run to run with fusion on (seen: 3 of 4 runs differed).
    # With fusion off both optimizers are deterministic, and so can be compared bit for bit.
    return run_horovod("workers/compression_checks.py", np=request.param, timeout=600,
                       env={"HOROVOD_FUSION_THRESHOLD": "0"})


pytestmark = pytest.mark.horovod


def test_none_is_bit_identical_to_horovod(reports):
    for rep in reports:
        assert rep["none_identical"], f"rank {rep['rank']}: max |diff| {rep['none_max_abs_diff']}"


def test_fp16_bf16_error_within_format_precision(reports):
    for rep in reports:
        assert rep["fp16_rel_err"] <= 2 ** -10, rep["fp16_rel_err"]    # fp16: 10 mantissa bits
        assert rep["bf16_rel_err"] <= 2 ** -7, rep["bf16_rel_err"]     # bf16: 7 mantissa bits


def test_global_qsgd_uses_one_allreduce_path_and_bounded_error(reports):
    for rep in reports:
        for bits, q in rep["qsgd"].items():
            if q["capacity_error"]:
                continue
            assert q["allgather_calls"] == 0
            assert q["allreduce_calls"] == 2           # the global scale (Max) and the payload (Sum)
            assert q["max_err_over_bound"] <= 1.0 + 1e-5, (bits, q["max_err_over_bound"])


def test_global_qsgd_is_unbiased(reports):
    q = reports[0]["qsgd"]["8"]
    assert q["frac_within_3se"] >= 0.99, q
    assert q["max_z"] <= 5.0, q


def test_global_qsgd_edge_cases(reports):
    for rep in reports:
        for bits, q in rep["qsgd"].items():
            if q["capacity_error"]:
                continue
            for tag, e in q["edge"].items():
                assert e["finite"], (bits, tag)
                assert e["err_over_bound"] <= 1.0 + 1e-5 or tag == "zeros" and e["err_over_bound"] == 0, (bits, tag, e)


def test_global_qsgd_buckets_bound_the_error_by_their_own_scale(reports):
    for rep in reports:
        b = rep["qsgd_buckets"]
        assert b["global_qsgd8"]["quiet_err_over_bucket_bound"] <= 1.0 + 1e-5, b
        assert b["global_qsgd8"]["quiet_rel_err"] < 0.05, b
        # one scale per tensor: quiet elements 1e-6 of the scale round to 0 or to +-scale/m (unbiased, but no
        # signal left in one sample)
        assert b["global_qsgd8-tensor"]["quiet_rel_err"] >= 0.9, b


def test_nonfinite_gradient_is_agreed_by_every_worker(reports):
    for rep in reports:
        assert rep["nan_raise"]["outcome"] == "raised"
        assert rep["nan_raise"]["unchanged"]
        assert rep["nan_skip"]["outcome"] == "applied" and rep["nan_skip"]["unchanged"]
        assert rep["nan_skip"]["skipped"] == 1
        assert rep["nan_raise"]["finite_after"] and rep["nan_skip"]["finite_after"]


@pytest.mark.parametrize("kind", ["topk", "topk_importance", "random_block_ef", "random_block_def"])
def test_error_feedback_conserves_the_gradient_sum(reports, kind):
    for rep in reports:
        ef = rep["ef"][kind]
        assert ef["residual_survives_zero_grad"]
        assert ef["rel_err"] < 1e-5, ef


def test_random_block_is_shared(reports):
    assert all(rep["random_block_shared"] for rep in reports)


def test_bits_per_element(reports):
    rep = reports[0]
    b = rep["bits"]
    assert b["none"] == pytest.approx(32.0)
    assert b["fp16"] == pytest.approx(16.0) and b["bf16"] == pytest.approx(16.0, abs=0.01)
    assert b["global_qsgd8"] <= 9.0
    assert b["topk0.01"] <= 1.5
    if rep["size"] <= 7:
        assert b["global_qsgd4"] <= 5.5


def test_adaptive_rule_measures_the_backends_float16_sum(reports):
    # The probe is a collective that every worker runs and agrees on (Max), so the verdicts match.
    for spec in ("fp16", "fp16+pipe", "global_qsgd8"):
        verdicts = {(r["adaptive_backend"][spec]["compress"], r["adaptive_backend"][spec]["backend_s_per_element"])
                    for r in reports}
        assert len(verdicts) == 1, (spec, verdicts)
    for spec in ("fp16", "fp16+pipe"):          # pipelined: probed after the gradients in flight arrived
        fp16 = reports[0]["adaptive_backend"][spec]
        assert fp16["decided"] and fp16["backend_s_per_element"] >= 0.0
    assert reports[0]["adaptive_backend"]["global_qsgd8"]["backend_s_per_element"] == 0.0   # nothing to measure


def test_adaptive_sends_small_tensors_uncompressed(reports):
    b = reports[0]["bits_adaptive_default"]
    # the 2.1M weights are compressed; the 2,560 bias elements go as fp32
    assert 16.0 < b["fp16"] < 16.1
    assert b["global_qsgd8"] < 9.0
