"""Issue 14: one non-finite policy on every path, a GradScaler that backs off, and mismatched ranks
that fail fast; real 2-process Horovod jobs (tests/workers/fault_checks.py)."""
import pytest

from tests.horovod_harness import run_horovod
from tests.workers.fault_checks import BAD_STEP, CODECS

pytestmark = pytest.mark.horovod


@pytest.fixture(scope="module")
def nonfinite():
    return run_horovod("workers/fault_checks.py", np=2, args=["nonfinite"], timeout=600,
                       env={"HOROVOD_FUSION_THRESHOLD": "0"})


CASES = [f"{c}/{t}/skip" for c in CODECS for t in ("2.bias", "0.weight")] + \
        [f"{c}/0.weight/skip+pipe" for c in CODECS] + ["global_qsgd8/0.weight/skip+warmup"]


@pytest.mark.parametrize("case", CASES)
def test_nan_on_one_rank_is_skipped_by_every_rank(nonfinite, case):
    for rep in nonfinite:
        r = rep[case]
        assert r["raised"] == [] and r["skipped"] == 1 and r["changed_at_bad_step"] is False, (rep["rank"], r)
        assert r["finite"] and r["workers_equal"], (rep["rank"], r)


@pytest.mark.parametrize("codec", CODECS)
def test_nan_on_one_rank_raises_on_every_rank(nonfinite, codec):
    for rep in nonfinite:
        r = rep[f"{codec}/0.weight/raise"]
        assert [t for t, _ in r["raised"]] == [BAD_STEP], (rep["rank"], r)
        assert "0.weight" in r["raised"][0][1] and r["changed_at_bad_step"] is False


@pytest.mark.parametrize("codec", ["none", "global_qsgd8"])
def test_grad_scaler_sees_the_inf_and_backs_off_on_every_rank(nonfinite, codec):
    for rep in nonfinite:
        r = rep[f"scaler/{codec}"]
        assert r["scales"] == [1024.0, 1024.0, 512.0, 512.0, 512.0] and r["changed"][2] is False, r


@pytest.mark.parametrize("kind,needle", [("mismatch-shape", "Parameter '0.bias' has shape"),
                                         ("mismatch-codec", "Setting 'compression' is 'global_qsgd8'")])
def test_mismatched_ranks_fail_fast_with_a_clear_error(kind, needle):
    reports = run_horovod("workers/fault_checks.py", np=2, args=[kind], timeout=120)
    for rep in reports:
        assert rep[kind]["error"] and needle in rep[kind]["error"] and "workers disagree" in rep[kind]["error"]
        assert rep[kind]["seconds"] < 30
