"""Atomic file writes, written once: a crash, a kill or a full disk leaves the last good file, never half a new one.

``atomic_path(path)`` yields a temporary path in the destination's folder (so the rename stays on one file
system); when the block ends without an error the file is flushed to disk and renamed over ``path``
(``os.replace``), and the folder entry is made durable; on an error the temporary file is removed. Concurrent
writers of one path each use their own temporary name.
"""
from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path, suffix: str = ""):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp{suffix}")
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:                                           # make the rename itself durable (POSIX; best effort)
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
