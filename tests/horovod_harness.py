"""Launch real multi-process Horovod jobs from pytest.

``run_horovod("workers/smoke.py", np=2)`` runs ``horovodrun -np 2 -H localhost:2 --gloo`` on a
worker script, which reports with :func:`tests.workers.common.emit`; it returns every rank's
report. When the job fails, times out or a rank reports nothing, the assertion message holds
every rank's stdout and stderr (from horovodrun's ``--output-filename``), so the failing rank
is visible without re-running. The job's folder (logs, reports) is removed when the job passes and kept, named in
the message, when it fails: a test run leaves nothing in /tmp but what explains a failure.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
HOROVODRUN = Path(sys.executable).parent / "horovodrun"


def _tail(path: Path, lines: int = 60) -> str:
    if not path.exists():
        return "<no output>"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def run_horovod(script: str, np: int = 2, args=(), timeout: float = 300, env: dict | None = None,
                expect_failure: bool = False):
    """Run ``tests/<script>`` on ``np`` local Gloo workers; return the list of per-rank reports
    (or, with ``expect_failure``, the CompletedProcess and the per-rank logs)."""
    out = Path(tempfile.mkdtemp(prefix="hx-test-"))
    logs = out / "logs"
    cmd = [str(HOROVODRUN), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
           "--output-filename", str(logs), sys.executable, str(TESTS / script), *map(str, args)]
    full_env = dict(os.environ, HX_TEST_OUT=str(out), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
                    PYTHONUNBUFFERED="1")
    full_env.update(env or {})

    def rank_logs() -> str:
        parts = []
        for r in range(np):
            d = logs / f"rank.{r}"
            parts.append(f"----- rank {r} stdout -----\n{_tail(d / 'stdout')}\n"
                         f"----- rank {r} stderr -----\n{_tail(d / 'stderr')}")
        return "\n".join(parts)

    try:
        proc = subprocess.run(cmd, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"horovodrun timed out after {timeout} s: {' '.join(cmd)}\n"
                             f"(job folder kept: {out})\n{rank_logs()}") from e
    if expect_failure:
        result = proc, rank_logs()
        shutil.rmtree(out, ignore_errors=True)
        return result
    reports = []
    for r in range(np):
        f = out / f"rank{r}.json"
        reports.append(json.loads(f.read_text()) if f.exists() else None)
    if proc.returncode != 0 or any(rep is None for rep in reports):
        missing = [r for r, rep in enumerate(reports) if rep is None]
        raise AssertionError(
            f"horovodrun exited with {proc.returncode}; ranks without a report: {missing}\n"
            f"command: {' '.join(cmd)}\n(job folder kept: {out})\n"
            f"----- horovodrun -----\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{rank_logs()}")
    shutil.rmtree(out, ignore_errors=True)
    return reports
