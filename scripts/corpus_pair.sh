#!/usr/bin/env bash
# Experiment (issue 15): the BFA recipe's default (cpu-small, 2 workers, Global-QSGD 8-bit + pipelining) trained
# the same number of optimizer steps on each of several corpora that differ only in their training audio (for
# example other training voices), one run after the other, each scored on the same clean and far-field test sets
# (the first corpus's), with per-voice and per-domain WER. The tokenizer is the first corpus's for every arm, so
# the arms differ in nothing but the audio they train on.
#   STEPS=2000 bash scripts/corpus_pair.sh NAME=CORPUS_DIR [NAME=CORPUS_DIR ...] [-- key=value ...]
# Example (the demo corpus against a copy rebuilt with more voices by asr-prep synth):
#   STEPS=2000 bash scripts/corpus_pair.sh base=exp/corpus_small_2500_seed0 pico=exp/corpus_small_2500_seed0_pico
# Writes exp/corpus_pair_NAME/ (the run, test_{clean,far}_{ctc,joint}.json) and prints one summary line per arm.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
steps=${STEPS:-2000}
arms=(); overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; overrides=("$@"); break ;;
    *=*) arms+=("$1"); shift ;;
    *) echo "corpus_pair.sh: expected NAME=CORPUS_DIR, got '$1'" >&2; exit 2 ;;
  esac
done
[ ${#arms[@]} -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
first=${arms[0]#*=}
for arm in "${arms[@]}"; do
  c=${arm#*=}
  for f in train.jsonl dev.jsonl; do [ -f "$c/$f" ] || { echo "corpus_pair.sh: $c/$f missing" >&2; exit 2; }; done
done
for arm in "${arms[@]}"; do
  name=${arm%%=*}; corpus=${arm#*=}; exp=exp/corpus_pair_$name
  rm -rf "$exp"
  echo "[$name] training $steps steps on $corpus -> $exp ($(date +%H:%M:%S))"
  horovodrun -np 2 -H localhost:2 python -m asr.train --config recipes/bfa/conf/cpu-small.yaml \
    data.train="$corpus/train.jsonl" data.dev="$corpus/dev.jsonl" \
    data.tokenizer="$first/tokenizer/tokenizer.model" data.stats="$corpus/stats/feature_stats.json" \
    train.out_dir="$exp" train.max_steps="$steps" train.max_minutes=0 data.dev_subset=100 \
    "${overrides[@]}" > "$exp.log" 2>&1
  for set in clean far; do
    m=$first/test.jsonl; [ $set = far ] && m=$first/test_far.jsonl
    for method in ctc joint; do
      asr-eval --checkpoint "$exp/checkpoints/last.pt" --manifest "$m" --method "$method" \
        --json "$exp/test_${set}_$method.json" > /dev/null 2>&1
    done
  done
  python - "$exp" "$name" <<'PY'
import json, sys
exp, name = sys.argv[1:]
recs = [json.loads(l) for l in open(f"{exp}/train_log.jsonl")]
ep = [r for r in recs if r["event"] == "epoch"]
print(f"[{name}] steps {ep[-1]['step']}, train loss {ep[-2 if len(ep) > 1 else -1]['train_loss']:.3f} "
      f"(last full epoch), dev CTC {ep[-1].get('dev_wer_ctc')}")
for s in ("clean", "far"):
    for m in ("ctc", "joint"):
        d = json.load(open(f"{exp}/test_{s}_{m}.json"))
        spk = " / ".join(f"{k.split(':')[1][:12]} {100 * v['wer']:.1f}" for k, v in sorted(d["per_speaker"].items()))
        dom = " / ".join(f"{k} {100 * v['wer']:.1f}" for k, v in sorted(d["per_domain"].items()))
        print(f"[{name}] {s:5s} {m:5s} WER {100 * d['wer']:.1f}%  ({spk}; {dom}; {d['utterances']} utts)")
PY
done
