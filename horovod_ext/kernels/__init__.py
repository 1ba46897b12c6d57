"""Native codec kernels: one small C++ library, compiled once per machine and loaded with ctypes.

Why ctypes and not a torch C++ extension: the kernels only need raw pointers, so the library
includes no torch or Python headers and compiles in about a second with the system C++ compiler;
ctypes releases the GIL during every call, so a kernel on the driver thread runs beside the
training thread. ``make setup`` builds it (``python -m horovod_ext.kernels``); otherwise the first
use does. The binary lives under ``$HX_CACHE/native`` (default ``~/.cache/horovod_ext/native``),
named by a digest of the source, the flags and the compiler, so an edit or another compiler
rebuilds it, and concurrent workers building at once each write a temporary file and rename it.

Every kernel has a pure-torch reference with the same arithmetic (:mod:`.reference`); it runs
where the native one cannot (CUDA tensors, float64, no compiler, ``HX_NATIVE=0``), and the two
give bit-identical results (tests/test_kernels.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("qsgd.cpp")
FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]
ABI_VERSION = 1

_lock = threading.Lock()
_lib = None
_tried = False
_error: str | None = None


def cache_dir() -> Path:
    return Path(os.environ.get("HX_CACHE", Path.home() / ".cache" / "horovod_ext")) / "native"


def _compiler() -> str | None:
    for cand in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def library_path(cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS + version).encode()).hexdigest()[:16]
    return cache_dir() / f"hx_codec-{digest}.so"


def build(verbose: bool = False) -> Path:
    """Compile the library if this source, these flags and this compiler have not been built; return its path."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (tried $CXX, c++, g++, clang++); Debian: apt-get install g++")
    path = library_path(cxx)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".so.tmp", dir=path.parent)
    os.close(fd)
    cmd = [cxx, *FLAGS, str(SOURCE), "-o", tmp]
    if verbose:
        print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"compiling {SOURCE} failed ({' '.join(cmd)}):\n{proc.stderr.strip()[-2000:]}")
    os.replace(tmp, path)
    return path


def _bind(lib) -> None:
    c = ctypes
    i64, i32, u32, vp = c.c_int64, c.c_int32, c.c_uint32, c.c_void_p
    lib.hx_abi_version.restype = c.c_int
    lib.hx_bucket_amax.argtypes = [vp, i64, i64, vp]
    lib.hx_qsgd_encode.argtypes = [vp, i64, i64, vp, i32, i32, u32, u32, vp]
    lib.hx_qsgd_decode.argtypes = [vp, i64, i64, vp, i32, i32, vp]
    for f in (lib.hx_bucket_amax, lib.hx_qsgd_encode, lib.hx_qsgd_decode):
        f.restype = None


_forced_off = False


@contextlib.contextmanager
def reference_only():
    """Run the torch reference even where the native kernels apply (benchmarks, tests)."""
    global _forced_off
    old, _forced_off = _forced_off, True
    try:
        yield
    finally:
        _forced_off = old


def native():
    """The loaded library, or None (then the torch reference runs), with one warning saying why."""
    global _lib, _tried, _error
    if _forced_off:
        return None
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        if os.environ.get("HX_NATIVE", "1") == "0":
            _error = "disabled by HX_NATIVE=0"
        else:
            try:
                lib = ctypes.CDLL(str(build()))
                _bind(lib)
                if lib.hx_abi_version() != ABI_VERSION:
                    raise RuntimeError(f"ABI version {lib.hx_abi_version()} != {ABI_VERSION}")
                _lib = lib
            except (OSError, RuntimeError) as err:
                _error = str(err)
                warnings.warn(f"horovod_ext: native codec kernels unavailable, using the torch reference path "
                              f"(same results, slower): {err}", stacklevel=2)
        _tried = True
    return _lib


def status() -> str:
    """One line for logs and benchmark JSON: which path the codecs run."""
    return "native" if native() is not None else f"reference ({_error})"

