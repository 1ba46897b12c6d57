"""Helpers for worker scripts launched by tests/horovod_harness.py."""
from __future__ import annotations

import json
import os

import horovod.torch as hvd


def emit(report: dict, rank: int | None = None) -> None:
    """Write this rank's report where the harness collects it (``rank``: after ``hvd.shutdown()``)."""
    out = os.environ["HX_TEST_OUT"]
    path = os.path.join(out, f"rank{hvd.rank() if rank is None else rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)
