#!/usr/bin/env bash
# One-step, idempotent set-up: a venv, the pinned Python packages, the Debian packages the
# project uses, and Horovod 0.28.1 built from its PyPI source with the C++20 patch.
# Both README commands (`make demo`, `make test`) run this first; a second run takes seconds.
#
# Environment knobs:
#   HX_VENV                 venv folder (default: .venv in the repo root)
#   HX_CACHE                cache folder outside the clone (default: ~/.cache/horovod_ext)
#   HOROVOD_GPU_OPERATIONS  NCCL for a GPU cluster build (needs a CUDA toolkit); unset = CPU-only build
#   HOROVOD_WITH_MPI=1      also build the MPI controller (needs mpicxx)
#   HX_SKIP_APT=1           do not touch Debian packages (the speech synthesizers)
set -euo pipefail

T0=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HX_VENV:-$ROOT/.venv}
CACHE=${HX_CACHE:-$HOME/.cache/horovod_ext}
HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.14.1
GPU_OPS=${HOROVOD_GPU_OPERATIONS:-}
WITH_MPI=${HOROVOD_WITH_MPI:-0}
APT_PACKAGES="espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts sox fortunes-min fortunes bible-kjv bible-kjv-text"
# KenLM's n-gram estimator (lmplz, built below from its PyPI source) needs Boost.
APT_PACKAGES="$APT_PACKAGES libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev"
KENLM_VERSION=0.3.0

say()  { printf '[setup] %s\n' "$*"; }
die()  { printf '\n[setup] ERROR: %s\n' "$1" >&2; shift; for l in "$@"; do printf '[setup]   %s\n' "$l" >&2; done; exit 1; }
need_cmd() { command -v "$1" >/dev/null 2>&1 || die "'$1' was not found on PATH." "$2"; }
free_gb() { local d=$1; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; df -Pk "$d" | awk 'NR==2{printf "%d", $4/1048576}'; }

# ---------------------------------------------------------------- prerequisites
PY=${PYTHON:-python3}
need_cmd "$PY" "Install Python 3.10 or newer (Debian: apt-get install python3 python3-venv python3-dev)."
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PY" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else 1)' \
  || die "Python $PYVER found; this project needs Python 3.10 to 3.13 (torch $TORCH_VERSION wheels)." \
         "Install one (Debian: apt-get install python3.11 python3.11-venv) and run: PYTHON=python3.11 make setup"
"$PY" -c 'import venv, ensurepip' 2>/dev/null \
  || die "Python $PYVER has no venv/ensurepip module." "Debian: apt-get install python3-venv"

# Layout: the third-party packages (torch alone is about 6 GB with its CUDA libraries) are installed once per machine
# into a shared environment, $CACHE/envs/<key>, keyed by the pinned requirements of setup.cfg. Each clone's venv is
# thin (well under 1 MB): its own interpreter link, this project installed editable, a .pth that adds the shared
# site-packages, and the shared console scripts (horovodrun, pytest, ...) re-pointed at it. A second clone, or CI in
# a clean clone on a machine that has the cache, costs seconds and no disk.
LAYOUT=3   # bump when what goes into the shared environment changes without setup.cfg changing
REQS=$("$PY" - "$ROOT/setup.cfg" <<'PYEOF'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
lines = cfg["options"]["install_requires"].splitlines()
for extra in ("asr", "bench", "test"):
    lines += cfg["options.extras_require"][extra].splitlines()
print("\n".join(sorted({line.split("#")[0].strip() for line in lines} - {""})))
PYEOF
) || die "could not read the requirements from $ROOT/setup.cfg"
ENV_KEY=$(printf '%s\n' "$REQS" "layout $LAYOUT" "horovod $HOROVOD_VERSION" | sha256sum | cut -c1-12)-py$PYVER-gpu${GPU_OPS:-none}-mpi$WITH_MPI
SHARED=$CACHE/envs/$ENV_KEY
STAMP_KEY=$ENV_KEY-$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh" | sha256sum | cut -c1-12)
STAMP=$VENV/.hx-setup-stamp

# ---------------------------------------------------------------- Debian packages
if [ "${HX_SKIP_APT:-0}" != 1 ]; then
  missing=""
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    command -v apt-get >/dev/null 2>&1 || die "Debian packages missing:$missing, and apt-get is not available." \
      "Install the speech synthesizers by hand, or set HX_SKIP_APT=1 to skip them (corpus synthesis will not work)."
    say "installing Debian packages:$missing"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing; } \
      >"${TMPDIR:-/tmp}/hx-apt.log" 2>&1 \
      || { tail -n 20 "${TMPDIR:-/tmp}/hx-apt.log" >&2; die "apt-get install failed (log: ${TMPDIR:-/tmp}/hx-apt.log)." \
           "Run as root or with sudo, or set HX_SKIP_APT=1."; }
  fi
fi

# ---------------------------------------------------------------- fast path
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_KEY" ] \
   && "$VENV/bin/python" -c 'import horovod.torch, horovod_ext, asr' 2>/dev/null; then
  say "venv $VENV is up to date (packages in $SHARED)"
  touch "$SHARED/.complete"   # its mtime says when a clone last used it: the pruning below keeps the recent ones
else
  # ------------------------------------------------------------ shared environment: pinned packages + Horovod
  if [ ! -f "$SHARED/.complete" ]; then
    KEY="horovod-$HOROVOD_VERSION-torch-$TORCH_VERSION-py$PYVER-gpu-${GPU_OPS:-none}-mpi-$WITH_MPI"
    WHEELDIR="$CACHE/wheels/$KEY"
    NEED=6; ls "$WHEELDIR"/horovod-*.whl >/dev/null 2>&1 || NEED=7
    mkdir -p "$CACHE/envs"
    [ "$(free_gb "$CACHE")" -ge $NEED ] || die "Only $(free_gb "$CACHE") GB free under $CACHE; the packages (torch with its CUDA libraries) need about $NEED GB there, once per machine." \
      "Free some disk space, or put the cache on a larger disk: HX_CACHE=/bigdisk/horovod_ext make setup"
    rm -rf "$SHARED"
    say "creating the shared environment $SHARED (python $PYVER; once per machine and set of pinned packages)"
    "$PY" -m venv "$SHARED"
    SPIP="$SHARED/bin/python -m pip"
    $SPIP install -q --upgrade pip setuptools wheel packaging
    say "installing pinned packages (torch $TORCH_VERSION is large: a few minutes the first time)"
    printf '%s\n' "$REQS" > "$SHARED/requirements.txt"
    # Resolved first, then installed without re-resolving: a CPU-only set-up leaves out Triton (0.9 GB of GPU
    # kernels for torch.compile, which nothing here uses and torch imports only when asked for).
    $SPIP install -q --dry-run --report "$SHARED/resolved.json" -r "$SHARED/requirements.txt" \
      || die "pip could not resolve the project's pinned packages (see pip's message above)." \
             "Check the network/package mirror, then run make setup again."
    "$SHARED/bin/python" - "$SHARED/resolved.json" "${GPU_OPS:-}" > "$SHARED/resolved.txt" <<'PYEOF'
import json, sys
report, gpu = json.load(open(sys.argv[1])), sys.argv[2]
for item in report["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if gpu or name.lower() != "triton":
        print(f"{name}=={version}")
PYEOF
    $SPIP install -q --no-deps -r "$SHARED/resolved.txt" || die "pip could not install the project's pinned packages (see pip's message above)." \
      "Check the network/package mirror, then run make setup again."

    # ---------------------------------------------------------- Horovod wheel (cached outside the clone)
    if ! ls "$WHEELDIR"/horovod-*.whl >/dev/null 2>&1; then
      say "building Horovod $HOROVOD_VERSION from source (about 5 minutes on 2 cores; cached as $KEY)"
      need_cmd cmake "Install CMake >= 3.13 (Debian: apt-get install cmake; or: pip install cmake)."
      need_cmd gcc   "Install a C/C++ compiler with C++20 support (Debian: apt-get install build-essential)."
      need_cmd g++   "Install a C++ compiler with C++20 support (Debian: apt-get install g++)."
      need_cmd make  "Install make (Debian: apt-get install make)."
      gccmaj=$(g++ -dumpversion | cut -d. -f1)
      [ "$gccmaj" -ge 10 ] || die "g++ $gccmaj is too old: PyTorch $TORCH_VERSION headers need C++20 (g++ >= 10)." "Debian: apt-get install g++-12"
      "$SHARED/bin/python" -c 'import sysconfig,os,sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
        || die "Python.h not found: the Python development headers are missing." "Debian: apt-get install python3-dev"
      if [ -n "$GPU_OPS" ]; then need_cmd nvcc "HOROVOD_GPU_OPERATIONS=$GPU_OPS needs the CUDA toolkit (nvcc) and NCCL."; fi
      if [ "$WITH_MPI" = 1 ]; then need_cmd mpicxx "HOROVOD_WITH_MPI=1 needs an MPI implementation (Debian: apt-get install libopenmpi-dev)."; fi
      BUILD=$(mktemp -d "${TMPDIR:-/tmp}/hx-horovod-build.XXXXXX")
      LOG="$CACHE/build-$KEY.log"
      $SPIP install -q cloudpickle psutil pyyaml cffi
      ( cd "$BUILD" && $SPIP download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d . ) >"$LOG" 2>&1 \
        || die "could not download the Horovod $HOROVOD_VERSION source from PyPI (log: $LOG)."
      tar -xzf "$BUILD"/horovod-$HOROVOD_VERSION.tar.gz -C "$BUILD"
      SRC="$BUILD/horovod-$HOROVOD_VERSION"
      # The patch: PyTorch >= 2.14 headers need C++20 (Horovod forces C++14).
      sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
      grep -q 'set(CMAKE_CXX_STANDARD 20)' "$SRC/horovod/torch/CMakeLists.txt" || die "the C++20 patch did not apply to horovod/torch/CMakeLists.txt"
      if [ -z "$GPU_OPS" ]; then
        # CPU-only build with a CUDA build of torch: do not look for cudart.
        sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' \
          "$SRC/cmake/Modules/FindPytorch.cmake"
        grep -q 'print(False)' "$SRC/cmake/Modules/FindPytorch.cmake" || die "the CPU-only patch did not apply to FindPytorch.cmake"
      fi
      export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
      if [ "$WITH_MPI" = 1 ]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
      if [ -n "$GPU_OPS" ]; then export HOROVOD_GPU_OPERATIONS=$GPU_OPS; else export HOROVOD_CPU_OPERATIONS=gloo; fi
      export MAKEFLAGS=-j$(nproc)
      mkdir -p "$BUILD/dist"
      ( cd "$SRC" && $SPIP wheel --no-build-isolation --no-deps -w "$BUILD/dist" . ) >>"$LOG" 2>&1 \
        || { grep -E -m 15 'error|Error|CMake Error' "$LOG" >&2 || true
             die "building Horovod failed; the full log is $LOG (the first error lines are above)."; }
      mkdir -p "$WHEELDIR" && cp "$BUILD"/dist/horovod-*.whl "$WHEELDIR"/ && rm -rf "$BUILD"
      say "built and cached $(ls "$WHEELDIR")"
    else
      say "using cached Horovod wheel $WHEELDIR"
    fi
    $SPIP install -q --no-deps "$WHEELDIR"/horovod-*.whl     # its runtime packages are setup.cfg's pins
    touch "$SHARED/.complete"
    # Keep this environment and the one used most recently before it; older ones go (a clone still pointing at
    # one gets it rebuilt by its next make setup).
    for old in $(ls -1t "$CACHE"/envs/*/.complete 2>/dev/null | tail -n +3); do
      say "removing an older shared environment: $(dirname "$old")"; rm -rf "$(dirname "$old")"
    done
  fi

  # ------------------------------------------------------------ this clone's thin venv
  if [ -e "$VENV" ] && [ ! -f "$VENV/.hx-thin" ]; then
    [ -f "$STAMP" ] || die "$VENV exists and was not made by make setup." "Remove it, or choose another place: HX_VENV=/path/venv make setup"
    say "replacing the full venv of an older set-up in $VENV (its packages now live in $SHARED)"
  fi
  rm -rf "$VENV"
  "$PY" -m venv --without-pip "$VENV"
  touch "$VENV/.hx-thin"
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  SHARED_SITE=$("$SHARED/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # site.addsitedir (not a bare path line) so that the shared site-packages' own .pth files are read too.
  echo "import site; site.addsitedir('$SHARED_SITE')" > "$SITE/_hx_shared_env.pth"
  "$SHARED/bin/python" -m pip --python "$VENV/bin/python" install -q --no-deps --no-build-isolation -e "$ROOT" \
    || die "pip could not install the project editable into $VENV (see pip's message above)."
  # Data files that packages install beside the interpreter and find through sys.prefix (ttspico's voices in
  # languages/, man pages in share/): linked into this venv's prefix.
  for d in "$SHARED"/*/; do
    name=$(basename "$d")
    case "$name" in bin|include|lib|lib64) continue ;; esac
    ln -sfn "$SHARED/$name" "$VENV/$name"
  done
  # The shared console scripts (horovodrun, pytest, pip, ...), re-pointed at this venv's interpreter.
  for f in "$SHARED"/bin/*; do
    name=$(basename "$f")
    [ -f "$f" ] && [ ! -L "$f" ] && [ ! -e "$VENV/bin/$name" ] || continue
    head -n 3 "$f" | grep -qF "$SHARED/bin/python" || continue
    sed "1,3s|$SHARED/bin/python|$VENV/bin/python|" "$f" > "$VENV/bin/$name" && chmod +x "$VENV/bin/$name"
  done
  echo "$STAMP_KEY" > "$STAMP"
fi

# ---------------------------------------------------------------- KenLM's lmplz + build_binary (asr-prep ngram)
# No binary wheel carries KenLM's estimator: build the two tools from the kenlm sdist on PyPI, once per cache.
KENLM_BIN="$CACHE/kenlm-$KENLM_VERSION/bin"
if [ ! -x "$KENLM_BIN/lmplz" ] || [ ! -x "$KENLM_BIN/build_binary" ]; then
  say "building KenLM $KENLM_VERSION's lmplz and build_binary from source (about 2 minutes; cached in $KENLM_BIN)"
  need_cmd cmake "Install CMake (Debian: apt-get install cmake)."
  need_cmd g++ "Install a C++ compiler (Debian: apt-get install g++)."
  BUILD=$(mktemp -d "${TMPDIR:-/tmp}/hx-kenlm-build.XXXXXX")
  LOG="$CACHE/build-kenlm-$KENLM_VERSION.log"; mkdir -p "$CACHE"
  # The sdist itself, from PyPI's simple index (pip download would first compile the Python module to read its
  # metadata), checked against the sha256 the index lists.
  "$VENV/bin/python" - "$KENLM_VERSION" "$BUILD/kenlm-$KENLM_VERSION.tar.gz" >"$LOG" 2>&1 <<'PYEOF' \
    || die "could not download the KenLM $KENLM_VERSION source from PyPI (log: $LOG)."
import hashlib, re, sys, urllib.request
version, dest = sys.argv[1:3]
index = urllib.request.urlopen("https://pypi.org/simple/kenlm/", timeout=60).read().decode()
url, sha = re.search(rf'href="([^"#]*/kenlm-{re.escape(version)}\.tar\.gz)#sha256=([0-9a-f]+)"', index).groups()
data = urllib.request.urlopen(url, timeout=300).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"{url}: sha256 mismatch")
open(dest, "wb").write(data)
PYEOF
  tar -xzf "$BUILD"/kenlm-$KENLM_VERSION.tar.gz -C "$BUILD"
  { cmake -S "$BUILD/kenlm-$KENLM_VERSION" -B "$BUILD/build" -DCMAKE_BUILD_TYPE=Release \
      && make -C "$BUILD/build" -j"$(nproc)" lmplz build_binary; } >>"$LOG" 2>&1 \
    || { grep -E -m 15 'error|Error|Could NOT find' "$LOG" >&2 || true
         die "building KenLM failed; the full log is $LOG (it needs Boost: apt-get install libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev)."; }
  mkdir -p "$KENLM_BIN" && cp "$BUILD"/build/bin/lmplz "$BUILD"/build/bin/build_binary "$KENLM_BIN"/ && rm -rf "$BUILD"
fi
ln -sf "$KENLM_BIN/lmplz" "$KENLM_BIN/build_binary" "$VENV/bin/"

# ---------------------------------------------------------------- verify
CHECK=$("$VENV/bin/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed:" "$CHECK"
echo "$CHECK" | grep -q '\[X\] PyTorch' || die "Horovod was built without PyTorch support:" "$CHECK"
echo "$CHECK" | grep -q '\[X\] Gloo'    || die "Horovod was built without Gloo:" "$CHECK"
say "horovodrun --check-build: PyTorch and Gloo available"
# SVOX Pico finds its voices through sys.prefix (the data-file links above).
PICO=$("$VENV/bin/python" -c 'import ttspico; ttspico.TtsEngine("en-US")' 2>&1) \
  || die "SVOX Pico (ttspico) cannot start in $VENV; its voices should be in $VENV/languages:" "$PICO"
# The codecs' native kernels (a second, cached under $CACHE/native; the torch path runs without them).
HX_CACHE=$CACHE "$VENV/bin/python" -m horovod_ext.kernels
say "set-up took $(( $(date +%s) - T0 )) s (venv: $VENV)"
