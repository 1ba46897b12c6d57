#!/usr/bin/env bash
# Experiment: arms of the BFA recipe that differ only in config overrides, one after the other, each with the same
# budget of optimizer steps (train.max_steps; the cosine runs to that step), on one corpus. Each arm is scored by
# the joint search without LM on the clean test set, on 400 random training utterances (does the model fit what
# it trained on?) and on the far-field test set where the corpus has one (asr-prep far), and by CTC best path on
# the test set.
#   [CORPUS_ARGS='--size small --train 20000 --vocab 300' CORPUS=exp/corpus_small_train20000_seed0] STEPS=4000 bash scripts/arm_pair.sh NAME 'OVERRIDES' [NAME 'OVERRIDES' ...]
# e.g. STEPS=4000 bash scripts/arm_pair.sh l3 '' l5 'model.enc_layers=5'
# MINUTES=7 instead of STEPS gives each arm the same training time (train.max_minutes; the cosine runs to the
# budget's end), for changes that alter the cost of a step.
# Runs go to exp/arm_NAME (logs exp/arm_NAME.log); a summary line per arm is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# CORPUS_ARGS: run.sh's corpus flags, CORPUS the folder they name (the defaults: the 60-minute benchmark's corpus).
corpus_args=${CORPUS_ARGS:---size small --train 20000 --vocab 300}
corpus=${CORPUS:-exp/corpus_small_train20000_seed0}
steps=${STEPS:-4000}
minutes=${MINUTES:-}
if [ -n "$minutes" ]; then budget="train.max_minutes=$minutes"; else budget="train.max_steps=$steps train.max_minutes=0"; fi
export PATH=$PWD/.venv/bin:$PATH
[ $# -ge 2 ] && [ $(( $# % 2 )) -eq 0 ] || { echo "usage: STEPS=N CORPUS=DIR $0 NAME 'OVERRIDES' [NAME 'OVERRIDES' ...]" >&2; exit 2; }
[ -f "$corpus/train.jsonl" ] || { echo "no corpus at $corpus (run.sh stages 0-1 make one)" >&2; exit 2; }
python - "$corpus" <<'PY'
import random, sys
c = sys.argv[1]
lines = open(f"{c}/train.jsonl").readlines()
random.Random(0).shuffle(lines)
open(f"{c}/train_sample400.jsonl", "w").writelines(lines[:400])
PY
names=()
while [ $# -gt 0 ]; do
  name=$1 over=$2; shift 2; names+=("$name")
  exp=exp/arm_$name
  rm -rf "$exp"
  # shellcheck disable=SC2086
  recipes/bfa/run.sh --stage 2 --stop-stage 2 $corpus_args --exp "$exp" -- \
    $over $budget data.dev_subset=100 > "$exp.log" 2>&1
  asr-eval --checkpoint "$exp/checkpoints/last.pt" --manifest "$corpus/test.jsonl" \
    --manifest "$corpus/train_sample400.jsonl" --json "$exp/test_joint.json" --json "$exp/train400_joint.json" \
    --method joint --jobs "$(nproc)" > "$exp.eval.log" 2>&1
  if [ -f "$corpus/test_far.jsonl" ]; then
    asr-eval --checkpoint "$exp/checkpoints/last.pt" --manifest "$corpus/test_far.jsonl" --json "$exp/far_joint.json" \
      --method joint --jobs "$(nproc)" >> "$exp.eval.log" 2>&1
  fi
  asr-eval --checkpoint "$exp/checkpoints/last.pt" --manifest "$corpus/test.jsonl" --json "$exp/test_ctc.json" \
    --method ctc >> "$exp.eval.log" 2>&1
done
python - "${names[@]}" <<'PY'
import json, os, sys
for name in sys.argv[1:]:
    e = f"exp/arm_{name}"
    recs = [json.loads(l) for l in open(f"{e}/train_log.jsonl")]
    ep = [r for r in recs if r["event"] == "epoch"]
    cores = next(r for r in recs if r["event"] == "start")["cores"]
    train_s = sum(r["train_s"] for r in ep)
    j = {k: json.load(open(f"{e}/{k}.json")) for k in ("test_joint", "train400_joint", "test_ctc")}
    far = json.load(open(f"{e}/far_joint.json")) if os.path.exists(f"{e}/far_joint.json") else None
    dom = lambda d, k: 100 * d["per_domain"][k]["wer"]
    print(f"[{name}] steps {ep[-1]['step']}, {train_s / 60:.1f} train min ({1000 * train_s / ep[-1]['step']:.0f} ms/step), "
          f"audio s per core-s {sum(r['audio_s'] for r in ep) / train_s / cores:.1f}, loss {ep[-1]['train_loss']:.3f}, "
          f"dev CTC {100 * ep[-1]['dev_wer_ctc']:.1f}% | test joint {100 * j['test_joint']['wer']:.1f}% "
          f"(commands {dom(j['test_joint'], 'command'):.1f}, open {dom(j['test_joint'], 'open'):.1f}), "
          + (f"far-field joint {100 * far['wer']:.1f}%, " if far else "") + f"CTC {100 * j['test_ctc']['wer']:.1f}% | train400 joint {100 * j['train400_joint']['wer']:.1f}% "
          f"(commands {dom(j['train400_joint'], 'command'):.1f}, open {dom(j['train400_joint'], 'open'):.1f})")
PY
