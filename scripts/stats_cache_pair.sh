#!/usr/bin/env bash
# Experiment (issue 15): what filling the feature cache in `asr-prep stats` saves in the first training epoch.
# Two copies of a corpus without a feature cache (hard links, so nothing is rewritten), one after the other:
# stats with --feature-cache off then N training steps (epoch 0: clean features), against stats filling the
# cache then the same N steps. Prints the stats time, epoch 0's training seconds and audio seconds per core-second.
#   bash scripts/stats_cache_pair.sh [CORPUS (default exp/corpus_small_2500_seed0)] [STEPS (default 150)]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
src=${1:-exp/corpus_small_2500_seed0}; steps=${2:-150}
for a in cold warm; do
  c=exp/sc_$a; rm -rf "$c" "exp/sc_run_$a"; mkdir -p "$c"
  for f in audio train.jsonl dev.jsonl tokenizer rir_cache; do cp -al "$src/$f" "$c/"; done
  fc=auto; [ $a = cold ] && fc=off
  t0=$(date +%s.%N)
  asr-prep stats --manifest "$c/train.jsonl" --out "$c/stats" --feature-cache $fc > /dev/null 2>&1
  t1=$(date +%s.%N)
  horovodrun -np 2 -H localhost:2 python -m asr.train --config recipes/bfa/conf/cpu-small.yaml \
    data.train="$c/train.jsonl" data.dev="$c/dev.jsonl" data.tokenizer="$c/tokenizer/tokenizer.model" \
    data.stats="$c/stats/feature_stats.json" train.out_dir="exp/sc_run_$a" train.max_steps="$steps" \
    train.max_minutes=0 data.dev_subset=100 > "exp/sc_run_$a.log" 2>&1
  t2=$(date +%s.%N)
  python3 - "$a" "$t0" "$t1" "$t2" <<'PY'
import json, sys
a, t0, t1, t2 = sys.argv[1], *map(float, sys.argv[2:])
r = next(json.loads(l) for l in open(f"exp/sc_run_{a}/train_log.jsonl") if '"event": "epoch"' in l)
print(f"{a}: stats {t1 - t0:.1f} s, epoch 0 {r['train_s']:.1f} s ({r['step']} steps, "
      f"{r['audio_per_core_s']:.1f} audio s per core-s), stats + training {t2 - t0:.1f} s wall")
PY
done
