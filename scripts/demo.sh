#!/usr/bin/env bash
# The main job. The end-to-end BFA speech recipe (prep, horovodrun training with compression,
# WER each epoch) is not built yet; until it is, this runs the smallest real thing that exists:
# a 2-worker horovodrun job that trains one small model with every gradient codec and compares
# final losses against fp32 (table, JSON and a PNG of the loss curves under out/convergence).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HX_VENV:-$ROOT/.venv}
cd "$ROOT"
echo "[demo] the BFA speech recipe is not built yet; running the compressed-allreduce convergence benchmark"
"$VENV/bin/python" -m horovod_ext.bench.convergence --out out/convergence "$@"
