#!/usr/bin/env bash
# Experiment (issue 19): the BFA recipe on the demo corpus, the same training budget, one run after the other:
# every-step Global-QSGD 8-bit + pipelining (the recipe's default) against SlowMo (local Adam steps, an exact
# average every 4, slow momentum 0.5 at slow lr 0.5) and SGP gossip. Prints each run's CTC best-path and joint
# WER on the first 200 clean test utterances. Needs the demo corpus (make demo, or run.sh stages 0-1 with
# --size small --limit 2500). Further arms split what differs: fp32 (plain allreduce, no pipelining), qsgd_nopipe
# (Global-QSGD without pipelining), fp32_pipe (fp32 with pipelining), qsgd_warm (plain synchronous fp32 for the
# first $WARMUP_STEPS steps, default 600, then Global-QSGD + pipelining), qsgd_lr (the default at learning rate
# $QSGD_LR per worker, default 0.002 against cpu-small's 0.003), drop0 (the default without dropout).
# STEPS=N gives every arm a budget of N optimizer steps instead of MINUTES (train.max_steps; the cosine then runs
# to step N), so arms that change the model, not the step's cost, compare at equal steps whatever the host's speed.
#   bash scripts/slowmo_recipe_pair.sh [MINUTES [ARM ...]]     (default 8 minutes; arms qsgd slowmo gossip)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-8}
corpus=exp/corpus_small_2500_seed0
export PATH=$PWD/.venv/bin:$PATH
declare -A variant=(
  [qsgd]="train.compression=global_qsgd8 train.pipeline=true"
  [slowmo]="train.slowmo=slowmo4-m0.5-a0.5 train.compression=none train.pipeline=false"
  [gossip]="train.gossip=gossip-exp train.compression=none train.pipeline=false"
  [fp32]="train.compression=none train.pipeline=false"
  [fp32_pipe]="train.compression=none train.pipeline=true"
  [qsgd_nopipe]="train.compression=global_qsgd8 train.pipeline=false"
  [qsgd_lr]="train.compression=global_qsgd8 train.pipeline=true train.lr=${QSGD_LR:-0.002}"
  [drop0]="train.compression=global_qsgd8 train.pipeline=true model.dropout=0"
  [qsgd_warm]="train.compression=global_qsgd8 train.pipeline=true train.comm_warmup_steps=${WARMUP_STEPS:-600}"
)
shift || true
arms=("$@")
[ ${#arms[@]} -gt 0 ] || arms=(qsgd slowmo gossip)
for name in "${arms[@]}"; do
  [ -n "${variant[$name]:-}" ] || { echo "unknown arm '$name' (known: ${!variant[*]})" >&2; exit 2; }
done
if [ -n "${STEPS:-}" ]; then budget="train.max_steps=$STEPS train.max_minutes=0"; else budget="train.max_minutes=$minutes"; fi
for name in "${arms[@]}"; do
  exp=exp/s18_pair_$name
  rm -rf "$exp"
  # shellcheck disable=SC2086
  recipes/bfa/run.sh --stage 2 --stop-stage 2 --size small --limit 2500 --exp "$exp" -- \
    ${variant[$name]} $budget data.dev_subset=100 > "$exp.log" 2>&1
  for method in ctc joint; do
    asr-eval --checkpoint "$exp/checkpoints/last.pt" --manifest "$corpus/test.jsonl" --limit 200 --method "$method" \
      --json "$exp/test_$method.json" 2>&1 | grep -m1 -E "WER" | sed "s/^/[$name $method] /"
  done
  python - "$exp" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(f"{sys.argv[1]}/train_log.jsonl")]
ep = [r for r in recs if r["event"] == "epoch"]
cores = next(r for r in recs if r["event"] == "start")["cores"]
print(f"[{sys.argv[1]}] epochs {len(ep)}, steps {ep[-1]['step']}, train loss {ep[-1]['train_loss']:.3f}, "
      f"dev CTC {ep[-1].get('dev_wer_ctc')}, bits/element {ep[-1]['bits_per_element']:.2f}, "
      f"audio s per core-s {sum(e['audio_s'] for e in ep) / sum(e['train_s'] for e in ep) / cores:.1f}")
PY
done
