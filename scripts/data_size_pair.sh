#!/usr/bin/env bash
# Paired runs of the BFA recipe on more or less training data: one corpus folder (so the same dev and test sets,
# tokenizer, lexicon, n-gram, LM, statistics and rooms), its first N training utterances against all of them, the
# same minutes, one training after the other with nothing else running; then stage 3 of every arm side by side
# (its WER does not depend on how long it takes).
#
#   scripts/data_size_pair.sh MINUTES N [N ...]       e.g. scripts/data_size_pair.sh 45 40000 20000
#
# CORPUS_ARGS (default '--size small --train 40000 --vocab 1000', the 40,000-utterance benchmark corpus) are
# run.sh's corpus options; build that corpus first with `recipes/bfa/run.sh --stage 0 --stop-stage 1 $CORPUS_ARGS`.
# Arms go to exp/pair_<N> (logs: exp/pair_<N>.train.log, exp/pair_<N>.stage3.log); extra training overrides:
# PAIR_OVERRIDES="k=v ...". The eighteenth session's pair (recipes/bfa/RESULTS.md): `scripts/data_size_pair.sh 45
# 40000 20000`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MIN=${1:?minutes of training per arm}; shift
[ $# -ge 1 ] || { echo "usage: $0 MINUTES N [N ...]" >&2; exit 2; }
read -r -a corpus_args <<< "${CORPUS_ARGS:---size small --train 40000 --vocab 1000}"
size=small; limit=""; train=""; seed=0
for ((i = 0; i < ${#corpus_args[@]}; i++)); do
  case "${corpus_args[i]}" in
    --size) size=${corpus_args[i + 1]} ;; --limit) limit=${corpus_args[i + 1]} ;;
    --train) train=${corpus_args[i + 1]} ;; --seed) seed=${corpus_args[i + 1]} ;;
  esac
done
C=$ROOT/exp/corpus_${size}${limit:+_$limit}${train:+_train$train}_seed$seed   # run.sh's name for it
[ -f "$C/train.jsonl" ] && [ -f "$C/lm/lm.pt" ] || {
  echo "$0: $C has no train.jsonl or lm/lm.pt: build it with recipes/bfa/run.sh --stage 0 --stop-stage 1 ${corpus_args[*]}" >&2
  exit 2; }
have=$(wc -l < "$C/train.jsonl")
for n in "$@"; do
  [ "$n" -le "$have" ] || { echo "$0: $C/train.jsonl has $have utterances, not $n" >&2; exit 2; }
done
for n in "$@"; do
  extra=()
  if [ "$n" -lt "$have" ]; then
    head -n "$n" "$C/train.jsonl" > "$C/train_first$n.jsonl"
    extra=(data.train="$C/train_first$n.jsonl")
  fi
  echo "[data_size_pair] $(date +%T) training on $n utterances for $MIN minutes -> exp/pair_$n"
  # shellcheck disable=SC2086
  bash recipes/bfa/run.sh --stage 2 --stop-stage 2 "${corpus_args[@]}" --exp "exp/pair_$n" -- \
    train.max_minutes="$MIN" "${extra[@]}" ${PAIR_OVERRIDES:-} > "exp/pair_$n.train.log" 2>&1
done
echo "[data_size_pair] $(date +%T) stage 3 of every arm"
pids=()
for n in "$@"; do
  bash recipes/bfa/run.sh --stage 3 "${corpus_args[@]}" --exp "exp/pair_$n" > "exp/pair_$n.stage3.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || { echo "$0: a stage 3 failed (see exp/pair_*.stage3.log)" >&2; exit 1; }
echo "[data_size_pair] $(date +%T) done: exp/pair_<N>/final_combine_test.json, final_combine_test_far.json"
