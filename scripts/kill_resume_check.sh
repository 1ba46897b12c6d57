#!/usr/bin/env bash
# Stop and --resume as a user meets it: the recipe's stage 2 on 2 Horovod workers is killed (SIGKILL, every
# worker) a few seconds into an epoch, run again (run.sh resumes from checkpoints/last.pt), and its logged
# losses after the resume are compared with an uninterrupted run of the same settings. Horovod's tensor fusion
# is off in both, so their sums are deterministic and the losses should be equal to the last bit.
#
# Usage: scripts/kill_resume_check.sh NAME [key=value ...]      (overrides go to asr.train, after cpu-small's)
#   Env: CORPUS_ARGS (default: the demo corpus, '--size small --limit 2500 --vocab 300'), STEPS (default 300),
#        KILL_AFTER_EPOCH (default 1: killed once epochNNN.pt of that epoch exists, plus KILL_DELAY=15 s).
# Writes exp/kr_NAME_{full,part}/ and prints the comparison (also as exp/kr_NAME.json).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
name=${1:?usage: scripts/kill_resume_check.sh NAME [key=value ...]}; shift
read -r -a corpus_args <<< "${CORPUS_ARGS:---size small --limit 2500 --vocab 300}"
steps=${STEPS:-300}; after=$(printf %03d "${KILL_AFTER_EPOCH:-1}"); delay=${KILL_DELAY:-15}
export HOROVOD_FUSION_THRESHOLD=0
over=(train.max_steps="$steps" data.dev_subset=20 "$@")
full=exp/kr_${name}_full; part=exp/kr_${name}_part
rm -rf "$full" "$part"
run() { recipes/bfa/run.sh --stage 2 --stop-stage 2 "${corpus_args[@]}" --exp "$1" -- "${over[@]}"; }

echo "[kill-resume] $part: started; killed ${delay} s after checkpoints/epoch$after.pt appears"
run "$part" > "$part.log1" 2>&1 &
for _ in $(seq 1 600); do [ -f "$part/checkpoints/epoch$after.pt" ] && break; sleep 1; done
sleep "$delay"
pkill -KILL -f "asr.train.*$part" || true; sleep 1; pkill -KILL -f "horovodrun.*$part" || true
wait || true
echo "[kill-resume] $part: killed after $(grep -c '"event": "step"' "$part/train_log.jsonl") logged steps; resuming"
run "$part" > "$part.log2" 2>&1
echo "[kill-resume] $full: the uninterrupted run"
run "$full" > "$full.log" 2>&1
.venv/bin/python - "$part" "$full" "exp/kr_$name.json" <<'EOF'
import json, sys
part, full, out = sys.argv[1:]
recs = lambda d: [json.loads(x) for x in open(f"{d}/train_log.jsonl")]
p, f = recs(part), recs(full)
i = next(k for k, r in enumerate(p) if r["event"] == "resume")
want = {r["step"]: r["loss"] for r in f if r["event"] == "step"}
got = [(r["step"], r["loss"]) for r in p[i:] if r["event"] == "step"]
diff = [(s, l, want.get(s)) for s, l in got if want.get(s) != l]
res = {"resumed_at_step": p[i]["step"], "steps_compared": len(got), "steps_different": len(diff),
       "first_differences": diff[:5], "max_abs_difference": max((abs(l - w) for _, l, w in diff if w is not None), default=0.0)}
json.dump(res, open(out, "w"), indent=1)
print(f"[kill-resume] resumed at step {res['resumed_at_step']}: {len(got)} logged losses after it, "
      f"{len(diff)} differ from the uninterrupted run (largest difference {res['max_abs_difference']:.3g}) -> {out}")
EOF
