#!/usr/bin/env bash
# The measured points of hx-bench predict's cost model (issue 18): 2, 3 and 4 workers, each at 100 Mbit/s,
# 1 Gbit/s and 10 Gbit/s, Horovod fp32/fp16 and each of our codecs with the adaptive rule off (each codec's own
# speed), then the fit, the per-point check and the predictions. About 50 minutes on 2 cores with STEPS 6
# (hx-bench also times compute alone beside every method); needs root.
#   bash scripts/cost_model_runs.sh [OUT_DIR (default out/cost-model)] [STEPS (default 4)]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PATH="${HX_VENV:-$ROOT/.venv}/bin:$PATH"
out=${1:-$ROOT/out/cost-model}; steps=${2:-4}
methods=hvd_fp32,hvd_fp16,hx_fp16,hx_bf16,hx_global_qsgd8,hx_global_qsgd8+pipe,hx_global_qsgd4,hx_topk0.01,hx_random_block0.01,hx_powersgd4,hx_powersgd4+pipe
mkdir -p "$out"
for n in 2 3 4; do
  [ -f "$out/w$n.json" ] && { echo "[cost-model] $out/w$n.json exists, kept"; continue; }
  hx-bench --workers "$n" --bandwidth 100mbit,1gbit,10gbit --steps "$steps" --warmup 2 --no-adaptive \
    --methods "$methods" --json "$out/w$n.json"     # written at the end: a file here is a finished run
done
hx-bench predict "$out"/w2.json "$out"/w3.json "$out"/w4.json --json "$out/predict-bfa.json" \
  --label "BFA-sized model (22.2M parameters), CPU compute as measured here"
