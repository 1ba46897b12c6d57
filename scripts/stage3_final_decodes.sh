#!/usr/bin/env bash
# Experiment: stage 3's three final decodes of a finished run again, with other test-time warps, into a folder of
# their own (the run's final_*.json stay): the joint search with the word-piece LM and the lexicon decoder, each
# tuned on dev, then both pooled and reranked at the settings they chose, tuned on up to 500 dev utterances.
#   [RUN_ROOT=/tmp/bench63] [C=exp/corpus_...] E=exp/RUN O=OUT_DIR W=0.9,0.95,1,1.05,1.1 bash scripts/stage3_final_decodes.sh
# W=, decodes without warps (an empty W takes the default 5). Prints the seconds after each decode and the WER of
# each result file. Used for the warps pairs in recipes/bfa/RESULTS.md (2026-12-05, eleventh session).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "${RUN_ROOT:-$ROOT}"
export PATH=${HX_VENV:-$ROOT/.venv}/bin:$PATH
C=${C:-exp/corpus_small_train20000_seed0}; E=${E:?E=exp/RUN: the run folder}; O=${O:?O=OUT_DIR}
W=${W:-0.9,0.95,1,1.05,1.1}
mkdir -p "$O"
t0=$(date +%s)
sets=(--manifest "$C/test.jsonl" --manifest "$C/test_far.jsonl")
asr-eval --checkpoint "$E/checkpoints/last.pt" "${sets[@]}" --json "$O/final_test.json" \
  --json "$O/final_test_far.json" --method joint --lm "$C/lm/lm.pt" --tune-on "$C/dev.jsonl" --jobs 2 \
  --warps "$W" > "$O/joint.log" 2>&1
echo "joint $(( $(date +%s) - t0 )) s"
asr-eval --checkpoint "$E/checkpoints/last.pt" "${sets[@]}" --json "$O/final_lexicon_test.json" \
  --json "$O/final_lexicon_test_far.json" --method lexicon --tune-on "$C/dev.jsonl" --jobs 2 --warps "$W" \
  > "$O/lexicon.log" 2>&1
echo "lexicon $(( $(date +%s) - t0 )) s"
chosen=$(python -c 'import json, sys
j, x = (json.load(open(f))["tuned_on"]["chosen"] for f in sys.argv[1:])
print("--ctc-weight %(ctc_weight)s --lm-weight %(lm_weight)s --length-bonus %(length_bonus)s" % j,
      "--word-score %(word_score)s --blank-penalty %(blank_penalty)s" % x)' "$O/final_test.json" "$O/final_lexicon_test.json")
echo "chosen: $chosen"
# shellcheck disable=SC2086
asr-eval --checkpoint "$E/checkpoints/last.pt" "${sets[@]}" --json "$O/final_combine_test.json" \
  --json "$O/final_combine_test_far.json" --method combine --lm "$C/lm/lm.pt" $chosen --tune-on "$C/dev.jsonl" \
  --tune-limit 500 --jobs 2 --warps "$W" > "$O/combine.log" 2>&1
echo "combine $(( $(date +%s) - t0 )) s"
for f in final_test final_test_far final_lexicon_test final_lexicon_test_far final_combine_test final_combine_test_far; do
  python -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], "%.2f" % (100 * r["wer"]), {k: round(100 * v["wer"], 1) for k, v in r.get("per_domain", {}).items()})' \
    "$O/$f.json" "$f"
done
