"""Horovod's shutdown with ops queued must not deadlock a thread that enqueues meanwhile: the elastic
lost-worker hang (docs/evidence/2026-12-03-elastic-hang-stacks.txt). Real 2-process Horovod jobs
(tests/workers/finalize_deadlock.py); the pinning is explained in horovod_ext/communicator.py."""
import pytest

from tests.horovod_harness import run_horovod

pytestmark = pytest.mark.horovod


def test_plain_horovod_deadlocks_there():
    """The reproduction is real: with plain ``hvd.allreduce_async_`` (torch 2.14, Horovod 0.28.1) the
    enqueueing rank stalls until faulthandler's watchdog ends it. If this starts passing, an upgrade
    fixed it upstream and the pinning may be dropped."""
    proc, logs = run_horovod("workers/finalize_deadlock.py", np=2, args=["plain"], expect_failure=True, timeout=180)
    assert proc.returncode != 0, logs
    assert "Timeout (0:00:20)!" in logs, logs
    assert "allreduce_async_" in logs, logs     # where the main thread was stuck


def test_pinned_ops_let_horovod_shut_down():
    reports = run_horovod("workers/finalize_deadlock.py", np=2, args=["pinned"], timeout=180)
    for rep in reports:
        assert rep["warm"] == [[2.0, 2.0, 2.0]] * 4
        assert rep["pins_after_warm"] == 0          # a successful op releases its pins
    one = reports[1]
    assert one["pins_queued"] == 200                # the queued ops are pinned
    assert one["shutdown_returned"], one
    assert one["error"] == "HorovodInternalError" and one["refused"] > 0, one
