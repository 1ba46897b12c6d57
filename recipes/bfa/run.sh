#!/usr/bin/env bash
# BFA recipe: numbered stages as in ESPnet/WeNet.
#   0 prep       synthesize the offline corpus (asr-prep synth) and its far-field test set
#   1 tokenizer  sentencepiece word pieces and feature statistics (asr-prep tokenizer, stats)
#   2 train      horovodrun training through horovod_ext (compression and pipelining from the config)
#   3 eval       WER of every epoch's checkpoint on the clean and far-field test sets (asr-eval --run-dir),
#                attention decoder and CTC best path
#
# Usage: recipes/bfa/run.sh [--stage N] [--stop-stage N] [--conf recipes/bfa/conf/cpu-small.yaml]
#          [--size tiny|small|full] [--limit N] [--workers 2] [--hosts localhost:2] [--exp exp/NAME]
#          [--vocab 500] [--seed 0] [-- key=value ...]        (overrides after -- go to asr.train)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${HX_VENV:-$ROOT/.venv}
PATH="$VENV/bin:$PATH"

stage=0; stop_stage=3; conf=$ROOT/recipes/bfa/conf/cpu-small.yaml; size=small; limit=""
workers=2; hosts=""; exp=""; vocab=500; seed=0; overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --stage) stage=$2; shift 2 ;;
    --stop-stage|--stop_stage) stop_stage=$2; shift 2 ;;
    --conf) conf=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --exp) exp=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    --) shift; overrides=("$@"); break ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
hosts=${hosts:-localhost:$workers}
corpus=$ROOT/exp/corpus_${size}${limit:+_$limit}_seed$seed
exp=${exp:-$ROOT/exp/bfa_$(basename "$conf" .yaml)_${size}${limit:+_$limit}}
log() { printf '\n[run.sh] %s  %s\n' "$(date +%H:%M:%S)" "$*"; }

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  log "stage 0: corpus ($size${limit:+, first $limit}) -> $corpus"
  asr-prep synth --out "$corpus" --size "$size" --seed "$seed" ${limit:+--limit $limit}
  asr-prep far --manifest "$corpus/test.jsonl" --out "$corpus" --seed "$seed"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "stage 1: tokenizer ($vocab pieces) and feature statistics"
  asr-prep tokenizer --manifest "$corpus/train.jsonl" --vocab-size "$vocab" --out "$corpus/tokenizer"
  asr-prep stats --manifest "$corpus/train.jsonl" --out "$corpus/stats"
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  log "stage 2: training on $workers workers ($hosts) -> $exp"
  resume=""; [ -f "$exp/checkpoints/last.pt" ] && resume=--resume
  horovodrun -np "$workers" -H "$hosts" --gloo python -m asr.train --config "$conf" $resume \
    data.train="$corpus/train.jsonl" data.dev="$corpus/dev.jsonl" \
    data.tokenizer="$corpus/tokenizer/tokenizer.model" data.stats="$corpus/stats/feature_stats.json" \
    train.out_dir="$exp" train.seed="$seed" "${overrides[@]}"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  log "stage 3: WER per epoch on the clean and far-field test sets"
  manifests=(--manifest "$corpus/test.jsonl")
  [ -f "$corpus/test_far.jsonl" ] && manifests+=(--manifest "$corpus/test_far.jsonl")
  asr-eval --run-dir "$exp" "${manifests[@]}"
  # The CTC head's best path as a second curve (it reads the audio well before the decoder stops looping).
  asr-eval --run-dir "$exp" "${manifests[@]}" --method ctc || log "CTC best path skipped (see the message above)"
  log "done: $exp/wer_per_epoch.json and $exp/wer_per_epoch.png"
fi
