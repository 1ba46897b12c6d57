#!/usr/bin/env bash
# The test suite: unit tests plus tests that launch real 2- and 4-process Horovod jobs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HX_VENV:-$ROOT/.venv}
cd "$ROOT"
T0=$(date +%s)
set +e
"$VENV/bin/python" -m pytest -q "$@"
rc=$?
set -e
echo "[test] pytest finished in $(( $(date +%s) - T0 )) s with exit code $rc"
exit $rc
