"""Experiment (issue 15): which LM-fusion settings of the joint CTC/attention search pay, tuned on dev.

Decodes the first N utterances of a manifest (the dev set: the test sets stay unseen) with every combination of
CTC weight, LM weight and length bonus given, the settings spread over one single-thread process per core, and
prints WER per setting (best first) against the same search without the LM; writes the table as JSON.

    .venv/bin/python scripts/lm_fusion_grid.py --checkpoint exp/b60_pico/checkpoints/last.pt \\
        --lm exp/corpus_small_train20000_seed0/lm/lm.pt --manifest exp/corpus_small_train20000_seed0/dev.jsonl \\
        --limit 200 --ctc-weights 0.5,0.7 --lm-weights 0,0.2,0.4,0.6 --length-bonuses 0,1,2,3 --json out/lm_grid.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def decode(job):
    """One setting on the manifest, through asr-eval's own worker (the checkpoint and LM loaded once per process)."""
    from asr.evaluate import _decode_job
    args, (cw, lw, lb) = job
    res = _decode_job((args.checkpoint, args.lm, args.manifest, args.limit,
                       dict(method="joint", beam=args.beam, ctc_weight=cw, lm_weight=lw, length_bonus=lb,
                            max_ratio=1.0, desc=f"cw {cw} lw {lw} lb {lb}")))
    return {"ctc_weight": cw, "lm_weight": lw, "length_bonus": lb, "wer": res["wer"], "ser": res["ser"],
            "per_domain": {d: x["wer"] for d, x in res.get("per_domain", {}).items()},
            "seconds_per_utterance": res["seconds_per_utterance"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--lm", required=True)
    p.add_argument("--manifest", required=True, help="tune on dev, never on a test set")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--beam", type=int, default=8)
    p.add_argument("--ctc-weights", type=floats, default=[0.5, 0.7])
    p.add_argument("--lm-weights", type=floats, default=[0.0, 0.2, 0.4, 0.6])
    p.add_argument("--length-bonuses", type=floats, default=[0.0, 1.0, 2.0, 3.0])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json")
    args = p.parse_args()
    # without the LM the length bonus is not used by asr-eval (0): one setting per CTC weight
    grid = sorted({(cw, lw, lb if lw > 0 else 0.0)
                   for cw, lw, lb in itertools.product(args.ctc_weights, args.lm_weights, args.length_bonuses)})
    from asr.evaluate import _map
    rows = _map(decode, [(args, g) for g in grid], args.jobs)     # single-thread spawned processes
    rows.sort(key=lambda r: r["wer"])
    print(f"{'ctc w':>6} {'LM w':>5} {'bonus':>5} {'WER %':>6}  per domain")
    for r in rows:
        dom = " ".join(f"{d} {100 * w:.1f}" for d, w in sorted(r["per_domain"].items()))
        print(f"{r['ctc_weight']:6.2f} {r['lm_weight']:5.2f} {r['length_bonus']:5.1f} {100 * r['wer']:6.2f}  {dom}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
