#!/usr/bin/env bash
# Paired runs of the BFA recipe: arms that differ only in training overrides, on one corpus folder (the same dev and
# test sets, tokenizer, lexicon, n-gram, LM, statistics and rooms), the same minutes, one training after the other
# with nothing else running; then stage 3 of every run side by side (its WER does not depend on how long it takes).
#
#   scripts/recipe_pair.sh MINUTES NAME 'OVERRIDES' [NAME 'OVERRIDES' ...]
#   e.g. SEEDS='0 1' scripts/recipe_pair.sh 45 w128 '' w192 'model.enc_hidden=192'
#
# OVERRIDES are asr.train's key=value settings, separated by spaces (so no space inside a value: [0.9,1.1]).
# SEEDS='0 1' runs every arm once per training seed (train.seed), seed by seed: the same run repeated a day apart
# moved by up to 2 points far-field and 1 clean (recipes/bfa/RESULTS.md, nineteenth session), so one pair does not
# separate a change smaller than that, and a second seed shows the spread. For a seed other than the corpus's, or
# an arm that overrides augment.* settings, the rooms of its first --room-epochs epochs are built first with its
# overrides (asr-prep rooms, as run.sh's stage 1 does for the corpus's seed; rooms already built are kept), so that
# no arm's trainers wait for rooms.
# CORPUS_ARGS (default '--size small --train 20000 --vocab 1000', the 60-minute benchmark's corpus) are run.sh's
# corpus options, and --conf / --room-epochs where they differ from run.sh's; build that corpus first with
# `recipes/bfa/run.sh --stage 0 --stop-stage 1 $CORPUS_ARGS`.
# Runs go to exp/pair_NAME, or exp/pair_NAME_sS with SEEDS (logs: <run>.train.log, <run>.stage3.log). Prints the
# combined decode's clean / far-field WER of every run at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PATH="${HX_VENV:-$ROOT/.venv}/bin:$PATH"
usage="usage: [SEEDS='0 1'] [CORPUS_ARGS='...'] $0 MINUTES NAME 'OVERRIDES' [NAME 'OVERRIDES' ...]"
[ $# -ge 3 ] && [ $(( ($# - 1) % 2 )) -eq 0 ] || { echo "$usage" >&2; exit 2; }
MIN=$1; shift
[[ "$MIN" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "$0: MINUTES must be a number, got '$MIN'" >&2; echo "$usage" >&2; exit 2; }
# shellcheck source=lib/corpus_args.sh
source scripts/lib/corpus_args.sh '--size small --train 20000 --vocab 1000'
[ -f "$C/train.jsonl" ] && [ -f "$C/lm/lm.pt" ] || {
  echo "$0: $C has no train.jsonl or lm/lm.pt: build it with recipes/bfa/run.sh --stage 0 --stop-stage 1 ${corpus_args[*]}" >&2
  exit 2; }
names=(); arm_overrides=()
while [ $# -gt 0 ]; do
  [[ "$1" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "$0: arm name '$1' must be letters, digits, '.', '_' or '-'" >&2; exit 2; }
  names+=("$1"); arm_overrides+=("$2"); shift 2
done
seeds=(${SEEDS:-})
runs=()
for s in "${seeds[@]:-}"; do
  for i in "${!names[@]}"; do
    run=exp/pair_${names[i]}${s:+_s$s}
    read -r -a extra <<< "${arm_overrides[i]}"
    [ -z "$s" ] || extra+=(train.seed="$s")
    if [ "$room_epochs" -gt 0 ] && { [ "${s:-$seed}" != "$seed" ] || [[ " ${extra[*]} " == *" augment."* ]]; }; then
      echo "[recipe_pair] $(date +%T) rooms of epochs 0-$((room_epochs - 1)) for $run (its seed or augment settings)"
      asr-prep rooms --config "$conf" --epochs "$room_epochs" data.train="$C/train.jsonl" train.seed="${s:-$seed}" \
        "${extra[@]}"
    fi
    echo "[recipe_pair] $(date +%T) training ${names[i]}${s:+ (seed $s)} for $MIN minutes -> $run"
    bash recipes/bfa/run.sh --stage 2 --stop-stage 2 "${corpus_args[@]}" --exp "$run" -- \
      train.max_minutes="$MIN" "${extra[@]}" > "$run.train.log" 2>&1 || {
      echo "$0: training $run failed (see $run.train.log)" >&2; exit 1; }
    runs+=("$run")
  done
done
echo "[recipe_pair] $(date +%T) stage 3 of every run"
pids=()
for run in "${runs[@]}"; do
  bash recipes/bfa/run.sh --stage 3 "${corpus_args[@]}" --exp "$run" > "$run.stage3.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || { echo "$0: a stage 3 failed (see exp/pair_*.stage3.log)" >&2; exit 1; }
echo "[recipe_pair] $(date +%T) done; combined decode, clean / far-field WER:"
python - "${runs[@]}" <<'PY'
import json, sys
for run in sys.argv[1:]:
    wer = [json.load(open(f"{run}/final_combine_{s}.json"))["wer"] for s in ("test", "test_far")]
    print(f"  {run}: {100 * wer[0]:.2f} / {100 * wer[1]:.2f}")
PY
