"""Issue 14: hx.DistributedOptimizer checkpoints resume bit-exactly at 2 and 4 workers, codec state
included (error-feedback residuals, DEF's synchronized copy, dither counter, step and warm-up
counters, pipelined gradients in flight), and load at another worker count by the stated rule."""
import pytest

from tests.horovod_harness import run_horovod
from tests.workers.resume_checks import SCENARIOS

pytestmark = pytest.mark.horovod


@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4"])
def reports(request):
    return run_horovod("workers/resume_checks.py", np=request.param, timeout=600,
                       env={"HOROVOD_FUSION_THRESHOLD": "0"})


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_losses_after_resume_equal_the_uninterrupted_run(reports, scenario):
    for rep in reports:
        r = rep[scenario]
        assert "error" not in r, r
        assert r["equal"], (rep["rank"], r["losses"], r["resumed"])
        assert r["param_max_diff"] == 0.0 and r["steps_restored"]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_codec_state_is_in_the_checkpoint_and_reshards_by_the_rule(reports, scenario):
    for rep in reports:
        r = rep[scenario]
        assert r["has_residual"] == ("topk" in scenario or "random_block" in scenario)
        assert r["has_synced"] == ("-def" in scenario)
        assert r["has_dither"] == ("global_qsgd" in scenario)
        assert r["reshard_warned"] and r["reshard_mean_ok"]
