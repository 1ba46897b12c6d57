#!/usr/bin/env bash
# Paired runs of the BFA recipe on more or less training data: one corpus folder (so the same dev and test sets,
# tokenizer, lexicon, n-gram, LM, statistics and rooms), its first N training utterances against all of them, the
# same minutes, one training after the other with nothing else running; then stage 3 of every arm side by side
# (its WER does not depend on how long it takes). The arms run through scripts/recipe_pair.sh (SEEDS='0 1' repeats
# each per training seed).
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
[ $# -ge 2 ] || { echo "usage: $0 MINUTES N [N ...]" >&2; exit 2; }
MIN=$1; shift
export CORPUS_ARGS=${CORPUS_ARGS:---size small --train 40000 --vocab 1000}
# shellcheck source=lib/corpus_args.sh
source scripts/lib/corpus_args.sh
[ -f "$C/train.jsonl" ] || {
  echo "$0: $C has no train.jsonl: build it with recipes/bfa/run.sh --stage 0 --stop-stage 1 $CORPUS_ARGS" >&2; exit 2; }
have=$(wc -l < "$C/train.jsonl")
arms=()
for n in "$@"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -le "$have" ] || { echo "$0: $C/train.jsonl has $have utterances, not '$n'" >&2; exit 2; }
  overrides=${PAIR_OVERRIDES:-}
  if [ "$n" -lt "$have" ]; then
    head -n "$n" "$C/train.jsonl" > "$C/train_first$n.jsonl"
    overrides="data.train=$C/train_first$n.jsonl $overrides"
  fi
  arms+=("$n" "$overrides")
done
exec bash scripts/recipe_pair.sh "$MIN" "${arms[@]}"
