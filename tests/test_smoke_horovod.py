"""Issue 2: a real Horovod job across 2 and 4 processes (Gloo on localhost)."""
import re
import tempfile
from pathlib import Path

import pytest

from tests.horovod_harness import run_horovod


@pytest.mark.horovod
@pytest.mark.parametrize("np_", [2, 4])
def test_allreduce_and_optimizer_step(np_):
    reports = run_horovod("workers/smoke.py", np=np_)
    n = np_
    for rep in reports:
        assert rep["size"] == n
        assert rep["sum"] == [n * (n + 1) / 2, 2.0 * n * (n - 1) / 2]
        assert rep["max"] == [n - 1.0, 0.0]
        assert rep["update"] == pytest.approx([(n + 1) / 2] * 4)


def test_harness_shows_every_rank_on_failure(tmp_path):
    proc, logs = run_horovod("workers/fail_on_rank1.py", np=2, expect_failure=True, timeout=120)
    assert proc.returncode != 0
    assert "rank 1 stderr" in logs and "deliberate failure on rank 1" in logs
    assert "rank 0 stdout" in logs


@pytest.mark.horovod
def test_harness_removes_a_passing_jobs_folder_and_keeps_a_failing_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_horovod("workers/smoke.py", np=2)
    assert not list(tmp_path.glob("hx-test-*")), "a passing job left its folder behind"
    with pytest.raises(AssertionError) as failed:
        run_horovod("workers/fail_on_rank1.py", np=2, timeout=120)
    kept = re.search(r"job folder kept: (\S+)\)", str(failed.value))
    assert kept, failed.value
    folder = Path(kept.group(1))
    assert folder.parent == tmp_path and (folder / "logs" / "rank.1" / "stderr").is_file()
