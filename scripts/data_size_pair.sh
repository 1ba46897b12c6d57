#!/usr/bin/env bash
# Paired runs of the BFA recipe on more or less training data: the same corpus folder (so the same dev/test sets,
# tokenizer, statistics and rooms), the first N training utterances against all of them, the same minutes, one
# run after the other; then joint search and CTC best path on the clean and far-field test sets.
#
#   scripts/data_size_pair.sh CORPUS MINUTES N [N ...]    e.g. scripts/data_size_pair.sh \
#       exp/corpus_small_train20000_seed0 15 20000 4000
#
# CORPUS from `recipes/bfa/run.sh --stage 0 --stop-stage 1 --size small --train 20000 --vocab 300`. Runs go to
# exp/pair_<N>, scores to out/pair_<N>_<set>_<method>.json. Extra training overrides: PAIR_OVERRIDES="k=v ...".
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
C=${1:?corpus folder}; MIN=${2:?minutes}; shift 2
mkdir -p out
for n in "$@"; do
  tr=$C/train.jsonl
  if [ "$n" -lt "$(wc -l < "$C/train.jsonl")" ]; then
    tr=$C/train_first$n.jsonl
    head -n "$n" "$C/train.jsonl" > "$tr"
  fi
  rm -rf "exp/pair_$n"
  # --stage 2 only: run.sh's corpus path is not used (data.* below point at CORPUS)
  HX_VENV=${HX_VENV:-$ROOT/.venv} bash recipes/bfa/run.sh --stage 2 --stop-stage 2 --exp "exp/pair_$n" -- \
    data.train="$tr" data.dev="$C/dev.jsonl" data.tokenizer="$C/tokenizer/tokenizer.model" \
    data.stats="$C/stats/feature_stats.json" data.dev_subset=100 decode.beam=1 train.max_minutes="$MIN" \
    ${PAIR_OVERRIDES:-} > "out/pair_${n}_train.log" 2>&1
  for m in test test_far; do
    for meth in joint ctc; do
      .venv/bin/asr-eval --checkpoint "exp/pair_$n/checkpoints/last.pt" --manifest "$C/$m.jsonl" --method "$meth" \
        --json "out/pair_${n}_${m}_${meth}.json" > "out/pair_${n}_${m}_${meth}.log" 2>&1
    done
  done
done
