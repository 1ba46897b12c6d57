"""Re-launch a module under horovodrun when it is started as a plain command."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def under_horovod() -> bool:
    return "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ


def horovodrun() -> str:
    local = Path(sys.executable).parent / "horovodrun"
    found = str(local) if local.exists() else shutil.which("horovodrun")
    if not found:
        sys.exit("horovodrun was not found next to this Python or on PATH; run `make setup` first")
    return found


def relaunch(module: str, workers: int, argv: list[str], hosts: str | None = None, env: dict | None = None) -> int:
    """Run ``python -m module argv`` on ``workers`` Gloo workers (localhost unless ``hosts``)."""
    cmd = [horovodrun(), "-np", str(workers), "-H", hosts or f"localhost:{workers}", "--gloo",
           sys.executable, "-m", module, *argv]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=dict(os.environ, **(env or {})))
