"""Issue 4: pipelined allreduce (Pipe-SGD) under real horovodrun."""
import time

import pytest

from tests.horovod_harness import run_horovod

pytestmark = pytest.mark.horovod


@pytest.fixture(scope="module")
def reports():
    return run_horovod("workers/pipeline_checks.py", np=2, timeout=600)


@pytest.mark.parametrize("momentum", ["0.0", "0.9"])
def test_trajectory_equals_one_step_stale_simulation(reports, momentum):
    for rep in reports:
        tr = rep[f"trajectory_m{momentum}"]
        assert tr["exact"], tr
        assert tr["flush_changed"], "flush() must apply the last step's gradients"


@pytest.mark.parametrize("optimizer", ["sgd_m0.9", "adam"])
def test_weight_prediction_equals_its_one_process_simulation(reports, optimizer):
    for rep in reports:
        p = rep[f"predicted_{optimizer}"]
        # bit for bit: the parameters each step leaves (the prediction) and the true weights behind them
        assert p["seen_diff"] == 0.0 and p["truth_diff"] == 0.0, p
        assert p["predicted_somewhere"] and p["flag"], p
        assert p["context_restores_prediction"], p      # true_parameters() puts the prediction back exactly
        if p["differs_from_plain_pipeline"] is not None:
            assert p["differs_from_plain_pipeline"], p


def test_weight_prediction_keeps_a_parameter_set_from_outside_and_needs_pipeline(reports):
    for rep in reports:
        assert rep["outside_change_kept"], rep      # the restore does not undo a load between steps
        assert "needs pipeline=True" in rep["needs_pipeline"], rep["needs_pipeline"]


def test_weight_prediction_elastic_commit_holds_the_true_weights(reports):
    for rep in reports:
        # TorchState saved inside true_parameters(); two predicted steps later restore() brings back exactly
        # the true weights of the commit, the prediction is dropped, and training goes on
        assert rep["elastic_restore"] == {"true_weights": True, "prediction_dropped": True, "steps_after": True}, rep


def test_warmup_steps_are_plain_synchronous_then_pipelined_and_compressed(reports):
    for rep in reports:
        w = rep["warmup"]
        assert w["exact"], w  # 4 synchronous steps, step 4 applies nothing, then one step stale, flush
        # with Global-QSGD the first trajectory point that differs from plain fp32 is after the step that
        # applies the first compressed gradient (step 5 applies step 4's): steps 0-4 are bit-identical
        assert w["compressed_equal_until"] == 5 and w["compressed_max_diff"] > 0, w


def test_hundred_steps_without_duplicate_names(reports):
    for rep in reports:
        for spec in ("none", "global_qsgd8"):
            assert rep[f"long_{spec}"]["ok"], rep[f"long_{spec}"]
            assert rep[f"long_{spec}"]["steps"] == 100


def test_every_codec_works_pipelined_with_accumulation(reports):
    for rep in reports:
        for spec, res in rep["codecs"].items():
            assert res["ok"], (spec, res)


def test_dead_worker_fails_the_job_instead_of_hanging():
    t0 = time.time()
    proc, logs = run_horovod("workers/die_mid_step.py", np=2, expect_failure=True, timeout=180)
    assert proc.returncode != 0
    assert time.time() - t0 < 170
    assert "rank 1: dying now" in logs
    assert "which it should not have" not in logs
    # Either rank 0 raised Horovod's clear error first, or horovodrun stopped it, saying why.
    launcher = proc.stdout + proc.stderr
    assert ("Horovod has been shut down" in logs
            or "Terminating remaining workers after failure of Process 1" in launcher), launcher[-2000:]
