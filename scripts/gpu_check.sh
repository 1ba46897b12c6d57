#!/usr/bin/env bash
# A prepared check for one GPU machine (e.g. one H200): at most ~8 minutes, no internet, no venv, the
# repository tree copied there. Phases, each with its own time limit and a PASS/FAIL/SKIP line:
#
#   python  find a Python that imports torch (PYTHON, .venv/bin/python, python3, python, conda); report GPU
#   build   make Horovod 0.28.1 importable: already importable -> nothing to do; otherwise build it from
#           its source with NCCL (HOROVOD_GPU_OPERATIONS=NCCL) when nvcc and NCCL are there, with CUDA
#           but no NCCL when only nvcc is, CPU-only otherwise (CUDA tensors then go through host memory).
#           scripts/setup.sh cannot be reused here: it makes a venv and pip-installs pinned packages and
#           the Horovod source from PyPI (network). This phase applies setup.sh's patches (C++20 for
#           recent torch headers; the CPU-only FindPytorch patch) to a local source tarball
#           (HX_HOROVOD_SDIST, .cache/gpu_check/, shared/ or ~/.cache/horovod_ext/; `--prepare` fetches it
#           where there is a network) and installs into a scratch folder on PYTHONPATH.
#   codecs  every hx codec (none, fp16, bf16, Global-QSGD 8/4/2 with buckets and -tensor, top-k,
#           top-k importance, random block EF/DEF) on CUDA tensors of 4 dtypes and 3 shapes through the
#           library's reduction machinery (one worker: hvd.init() without horovodrun), against the same
#           codec on the CPU; NaN input; host syncs per reduction; ms per reduction of 16M elements
#   train   the gpu-full BFA config (recipes/bfa/conf/gpu-full.yaml) on one GPU, bf16 autocast, random
#           features (a pool of 4 batches, cycled, so the loss must fall), hx.DistributedOptimizer with
#           the config's codec when Horovod imports: steps/s, loss at start and end, peak memory
#
# Usage:
#   scripts/gpu_check.sh                 the GPU check
#   scripts/gpu_check.sh --cpu-dry-run   the same phases on the CPU in seconds (no build, tiny model)
#   scripts/gpu_check.sh --prepare       with a network: put the Horovod source and the pure-Python
#                                        wheels it needs into .cache/gpu_check/ (travels with the tree)
#   scripts/gpu_check.sh --no-build      skip the build phase
# Environment: OUT (results: $OUT/gpu_check.json and the phase logs), HX_GPU_CHECK_BUDGET (seconds for
#   everything, default 450), PYTHON, HX_HOROVOD_SDIST, HX_TRAIN_STEPS (300), HX_TRAIN_BATCH (32),
#   HX_TRAIN_FRAMES (600), HX_GPU_CHECK_WORK (scratch, default /tmp/hx-gpu-check).
# Exit status: 0 when no phase failed (a skipped build is not a failure; the codec phase then fails).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=gpu
NOBUILD=0
for arg in "$@"; do
  case "$arg" in
    --cpu-dry-run) MODE=dry ;;
    --prepare) MODE=prepare ;;
    --no-build) NOBUILD=1 ;;
    -h|--help) sed -n '2,37p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

HVD_VERSION=0.28.1
CACHE_DIR=$ROOT/.cache/gpu_check
WORK=${HX_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/hx-gpu-check}
RES=$WORK/results
SITE=$WORK/site
mkdir -p "$RES" "$SITE"
T0=$(date +%s)
BUDGET=${HX_GPU_CHECK_BUDGET:-450}
SUMMARY=$WORK/summary.tsv
: > "$SUMMARY"

say() { printf '[gpu_check %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
record() {   # name status detail
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$SUMMARY"
  printf '%s %s: %s\n' "$2" "$1" "$3"
}
remaining() { echo $(( BUDGET - ($(date +%s) - T0) )); }
limit_for() {   # wanted seconds, seconds to keep for the later phases
  local want=$1 keep=$2 left
  left=$(( $(remaining) - keep ))
  (( left < want )) && want=$left
  echo "$want"
}
run_limited() {   # name limit logfile cmd...: runs cmd under timeout, output to the terminal and the log
  local name=$1 lim=$2 log=$3; shift 3
  say "phase $name (limit ${lim}s): $*"
  timeout -k 10 "$lim" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "phase $name ran out of its ${lim}s"
  fi
  return "$rc"
}

# ------------------------------------------------------------------------------------------- prepare
if [ "$MODE" = prepare ]; then
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  [ -x "$PY" ] || PY=python3
  mkdir -p "$CACHE_DIR"
  say "downloading the Horovod $HVD_VERSION source and pure-Python wheels into $CACHE_DIR"
  "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HVD_VERSION" -d "$CACHE_DIR" || exit 1
  # pure-Python wheels (any Python 3): Horovod imports cloudpickle, its setup.py needs packaging
  "$PY" -m pip download -q --no-deps --only-binary :all: cloudpickle packaging -d "$CACHE_DIR" || exit 1
  ls -la "$CACHE_DIR"
  say "done: $CACHE_DIR travels with the tree (untracked, not ignored); delete it when no longer needed"
  exit 0
fi

# ------------------------------------------------------------------------------------------- python
find_python() {
  local c
  for c in "${PYTHON:-}" "$ROOT/.venv/bin/python" python3 python /usr/bin/python3 /opt/conda/bin/python \
           /usr/local/bin/python3; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import torch' >/dev/null 2>&1; then echo "$c"; return 0; fi
  done
  return 1
}
if ! PY=$(find_python); then
  record python FAIL "no Python that imports torch (tried \$PYTHON, .venv/bin/python, python3, python, /opt/conda/bin/python); install torch or set PYTHON=/path/to/python"
  echo '{"ok": false, "error": "no python with torch"}' > "$WORK/gpu_check.json"
  [ -n "${OUT:-}" ] && cp "$WORK/gpu_check.json" "$SUMMARY" "$OUT"/ 2>/dev/null
  exit 1
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
ENV_ARGS=()
[ "$MODE" = gpu ] && ENV_ARGS=(--require-cuda)
if run_limited python 60 "$WORK/python.log" "$PY" "$ROOT/scripts/gpu_check.py" env "${ENV_ARGS[@]}" --json "$RES/env.json"; then
  record python PASS "$PY ($("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
else
  record python FAIL "$PY: see $WORK/python.log"
fi
CAP=$("$PY" -c 'import torch; c = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None; print(f"{c[0]}{c[1]}" if c else "")' 2>/dev/null)

# ------------------------------------------------------------------------------------------- build
# Extract the pure-Python wheels that travelled in .cache/gpu_check/ when this Python lacks them.
for mod in cloudpickle packaging; do
  if ! "$PY" -c "import $mod" >/dev/null 2>&1; then
    whl=$(ls "$CACHE_DIR"/"$mod"-*-py3-none-any.whl 2>/dev/null | head -1)
    if [ -n "$whl" ]; then
      "$PY" -m zipfile -e "$whl" "$SITE" && say "$mod: extracted $(basename "$whl") into $SITE"
    else
      say "$mod: not importable and no wheel in $CACHE_DIR"
    fi
  fi
done

horovod_ok() { "$PY" -c 'import horovod.torch' >/dev/null 2>&1; }
horovod_desc() { "$PY" -c 'import horovod, horovod.torch as h; print(f"horovod {horovod.__version__}: nccl_built={bool(h.nccl_built())} cuda_built={bool(h.cuda_built())} gloo_built={bool(h.gloo_built())}")' 2>&1 | tail -1; }

build_horovod() {   # runs under timeout; builds into $WORK/build, installs into $SITE
  set -e
  local src=$1 ops=$2 b=$WORK/build
  rm -rf "$b" && mkdir -p "$b"
  tar -xzf "$src" -C "$b"
  local s=$b/horovod-$HVD_VERSION
  local gccmaj; gccmaj=$(g++ -dumpversion | cut -d. -f1)
  # setup.sh's patch: PyTorch >= 2.14 headers need C++20 (Horovod forces C++14); C++17 for older g++
  local std=20; [ "$gccmaj" -ge 10 ] || std=17
  sed -i "s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD $std)/" "$s/CMakeLists.txt" "$s/horovod/torch/CMakeLists.txt"
  # recent CUDA toolkits (12.x/13.x headers) no longer compile as C++11
  sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$s/horovod/common/ops/cuda/CMakeLists.txt"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
  case "$ops" in
    NCCL) export HOROVOD_GPU_OPERATIONS=NCCL ;;
    CUDA) export HOROVOD_CPU_OPERATIONS=gloo ;;    # CUDA support (ready events) but Gloo for the reductions
    CPU)  export HOROVOD_CPU_OPERATIONS=gloo
          # setup.sh's CPU-only patch: do not look for cudart with a CUDA build of torch
          sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' \
            "$s/cmake/Modules/FindPytorch.cmake" ;;
  esac
  [ -n "$CAP" ] && export HOROVOD_BUILD_CUDA_CC_LIST=$CAP     # only this GPU's architecture: a faster build
  export MAKEFLAGS=-j$(nproc)
  cd "$s"
  if "$PY" -m pip --version >/dev/null 2>&1 && "$PY" -c 'import wheel' >/dev/null 2>&1; then
    "$PY" -m pip wheel --no-build-isolation --no-deps --no-index -w "$b/dist" .
    "$PY" -m zipfile -e "$(ls "$b"/dist/horovod-*.whl | head -1)" "$SITE"
  else
    "$PY" setup.py build
    cp -r build/lib*/horovod "$SITE"/
  fi
}

if [ "$MODE" = dry ] || [ "$NOBUILD" = 1 ]; then
  if horovod_ok; then record build SKIP "not asked to build; $(horovod_desc)"
  else record build SKIP "not asked to build; Horovod does not import"; fi
elif horovod_ok; then
  record build PASS "nothing to build: $(horovod_desc)"
else
  SDIST=""
  for c in "${HX_HOROVOD_SDIST:-}" "$CACHE_DIR/horovod-$HVD_VERSION.tar.gz" "$ROOT/shared/horovod-$HVD_VERSION.tar.gz" \
           "$HOME/.cache/horovod_ext/horovod-$HVD_VERSION.tar.gz"; do
    [ -n "$c" ] && [ -f "$c" ] && { SDIST=$c; break; }
  done
  missing=""
  [ -n "$SDIST" ] || missing="$missing the Horovod $HVD_VERSION source (no internet here: run scripts/gpu_check.sh --prepare where there is one, or set HX_HOROVOD_SDIST);"
  command -v cmake >/dev/null 2>&1 || "$PY" -c 'import cmake' >/dev/null 2>&1 || missing="$missing cmake;"
  command -v g++ >/dev/null 2>&1 || missing="$missing g++;"
  command -v make >/dev/null 2>&1 || missing="$missing make;"
  "$PY" -c 'import sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
    || missing="$missing Python.h (python3-dev);"
  for mod in setuptools packaging cloudpickle; do "$PY" -c "import $mod" >/dev/null 2>&1 || missing="$missing python module $mod;"; done
  if [ -n "$missing" ]; then
    record build SKIP "cannot build Horovod here, missing:$missing"
  else
    command -v cmake >/dev/null 2>&1 || export HOROVOD_CMAKE=$("$PY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
    NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
    [ -n "$NVCC" ] && export PATH="$(dirname "$NVCC"):$PATH"
    # NCCL: system headers and library, or the nvidia-nccl wheel that came with torch
    NCCL_H=$(ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null | head -1)
    if [ -z "$NCCL_H" ]; then
      NCCL_H=$("$PY" - <<'PYEOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for h in glob.glob(os.path.join(r, "nvidia", "**", "nccl.h"), recursive=True):
        print(h); sys.exit(0)
PYEOF
)
    fi
    OPS=CPU
    if [ -n "$NVCC" ] && [ -n "$NCCL_H" ]; then
      OPS=NCCL
      inc=$(dirname "$NCCL_H")
      lib=$(ls -d "$inc"/../lib 2>/dev/null || true)
      if [ -n "$lib" ] && ! ls "$lib"/libnccl.so >/dev/null 2>&1 && ls "$lib"/libnccl.so.* >/dev/null 2>&1; then
        # the wheel ships libnccl.so.2 only; CMake's find_library wants libnccl.so
        mkdir -p "$WORK/nccl-lib" && ln -sf "$(ls "$lib"/libnccl.so.* | head -1)" "$WORK/nccl-lib/libnccl.so"
        lib=$WORK/nccl-lib
        export LD_LIBRARY_PATH="$(dirname "$(readlink -f "$WORK/nccl-lib/libnccl.so")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      fi
      export HOROVOD_NCCL_INCLUDE=$inc HOROVOD_NCCL_LINK=SHARED
      [ -n "$lib" ] && export HOROVOD_NCCL_LIB=$lib
    elif [ -n "$NVCC" ]; then
      OPS=CUDA
    fi
    say "building Horovod with ${OPS} (nvcc: ${NVCC:-none}; nccl.h: ${NCCL_H:-none}; arch: ${CAP:-?}) from $SDIST"
    LIM=$(limit_for 240 170)
    if (( LIM < 60 )); then
      record build SKIP "no time left in the ${BUDGET}s budget"
    elif run_limited build "$LIM" "$WORK/build.log" bash -c "$(declare -f build_horovod); HVD_VERSION=$HVD_VERSION WORK='$WORK' SITE='$SITE' PY='$PY' CAP='$CAP' build_horovod '$SDIST' $OPS" >/dev/null \
         && horovod_ok; then
      note=""; [ "$OPS" = CPU ] && note=" (no CUDA toolkit: CUDA tensors are staged through host memory by Horovod)"
      record build PASS "built with $OPS in $SITE: $(horovod_desc)$note"
    else
      grep -E -m 12 'error|Error' "$WORK/build.log" | sed 's/^/    /'
      record build FAIL "Horovod build with $OPS failed or ran out of time (log: $WORK/build.log)"
    fi
  fi
fi

# ------------------------------------------------------------------------------------------- codecs
if horovod_ok; then
  if [ "$MODE" = dry ]; then
    CODEC_ARGS=(--device cpu --bench-numel 100000 --bench-reps 2); LIM=$(limit_for 120 30)
  else
    CODEC_ARGS=(--device cuda --bench-numel 16777216 --bench-reps 5); LIM=$(limit_for 90 120)
  fi
  if (( LIM < 20 )); then
    record codecs SKIP "no time left in the ${BUDGET}s budget"
  elif run_limited codecs "$LIM" "$WORK/codecs.log" "$PY" "$ROOT/scripts/gpu_check.py" codecs "${CODEC_ARGS[@]}" --json "$RES/codecs.json"; then
    record codecs PASS "$(grep -m1 '^PASS codecs' "$WORK/codecs.log" | cut -d: -f2-)"
  else
    record codecs FAIL "$(grep -m1 -E '^FAIL' "$WORK/codecs.log" | cut -c1-300) (log: $WORK/codecs.log)"
  fi
else
  record codecs FAIL "Horovod does not import with $PY (see the build phase); the codecs need it"
fi

# ------------------------------------------------------------------------------------------- train
if [ "$MODE" = dry ]; then
  LIM=$(limit_for 120 0)
  TRAIN_ARGS=(--device cpu --tiny --steps 24 --min-steps 24 --batch 2 --frames 64 --tokens 6 --vocab 50 --lr 3e-3 --seconds 60)
else
  LIM=$(limit_for 180 0)
  SECS=$(( LIM - 60 )); (( SECS < 20 )) && SECS=20      # model build, cuDNN warm-up and the summary need the rest
  TRAIN_ARGS=(--device cuda --steps "${HX_TRAIN_STEPS:-300}" --min-steps 100 --batch "${HX_TRAIN_BATCH:-32}"
              --frames "${HX_TRAIN_FRAMES:-600}" --tokens 40 --vocab 1000 --seconds "$SECS")
fi
if (( LIM < 30 )); then
  record train SKIP "no time left in the ${BUDGET}s budget"
elif run_limited train "$LIM" "$WORK/train.log" "$PY" "$ROOT/scripts/gpu_check.py" train "${TRAIN_ARGS[@]}" --json "$RES/train.json"; then
  record train PASS "$(grep -E '^PASS train.(loss_falls|steps)' "$WORK/train.log" | cut -d' ' -f2- | paste -sd ';')"
else
  record train FAIL "$(grep -m2 -E '^FAIL' "$WORK/train.log" | paste -sd ';' | cut -c1-300) (log: $WORK/train.log)"
fi

# ------------------------------------------------------------------------------------------- summary
"$PY" - "$WORK" "$SUMMARY" "$MODE" "$(( $(date +%s) - T0 ))" <<'PYEOF'
import json, sys
from pathlib import Path
work, summary, mode, secs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
out = {"mode": mode, "seconds": secs, "phases": {}}
for line in summary.read_text().splitlines():
    name, status, detail = (line.split("\t") + ["", ""])[:3]
    out["phases"][name] = {"status": status, "detail": detail}
for f in sorted((work / "results").glob("*.json")):
    try:
        out[f.stem] = json.loads(f.read_text())
    except ValueError:
        out[f.stem] = {"unreadable": f.name}
out["ok"] = all(p["status"] != "FAIL" for p in out["phases"].values())
(work / "gpu_check.json").write_text(json.dumps(out, indent=1, default=str))
PYEOF
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp "$WORK/gpu_check.json" "$OUT/gpu_check.json"
  for f in python build codecs train; do [ -f "$WORK/$f.log" ] && tail -c 200000 "$WORK/$f.log" > "$OUT/$f.log"; done
fi
echo "---------------------------------------------------------------- summary ($(( $(date +%s) - T0 )) s)"
column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
echo "results: $WORK/gpu_check.json${OUT:+ and $OUT/gpu_check.json}"
! grep -q $'\tFAIL\t' "$SUMMARY"
