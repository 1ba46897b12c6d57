"""Experiment: how much energy WPE removes from each utterance of some manifests (asr.frontend.dereverb.wpe).

    python scripts/wpe_gate_probe.py --manifest exp/corpus/dev.jsonl --manifest exp/corpus/test_far.jsonl \
        --json exp/wpe_gate_probe.json [--limit 200]

Why: WPE before decoding takes about 3 points off far-field WER but adds up to about 1 on clean speech
(recipes/bfa/RESULTS.md, 2026-12-05 ninth session). If dry speech loses little energy to WPE and reverberant speech
loses much, a threshold on the removed energy can leave dry speech as it was (tried at 0.5 dB and not kept:
RESULTS.md, 2026-12-05 tenth session). Prints the removed energy's percentiles per manifest and, where rows name
their room (``t60_band``, asr-prep far), per T60 band; the JSON holds every utterance's figure. One process, numpy on
one thread (as asr-eval's WPE runs).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from tqdm import tqdm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", action="append", required=True)
    p.add_argument("--json", required=True, help="where to write every utterance's removed energy")
    p.add_argument("--limit", type=int, default=None, help="the first N utterances of each manifest")
    args = p.parse_args(argv)
    from asr.data.manifest import audio_path, read_manifest
    from asr.frontend import load_wave
    from asr.frontend.dereverb import describe, wpe

    out = {"dereverb": describe("wpe"), "manifests": {}}
    for m in args.manifest:
        m = Path(m)
        rows = read_manifest(m)[:args.limit]
        per = []
        for e in tqdm(rows, desc=f"wpe {m.name}", file=sys.stderr, dynamic_ncols=True):
            removed = wpe(load_wave(audio_path(e, m)))[1]
            per.append({"id": e["id"], "removed_db": round(removed, 3), "t60": e.get("t60"),
                        "t60_band": e.get("t60_band"), "speaker": e.get("speaker")})
        out["manifests"][str(m)] = per
        groups = defaultdict(list)
        for r in per:
            groups["all"].append(r["removed_db"])
            if r["t60_band"]:
                groups[r["t60_band"]].append(r["removed_db"])
        print(f"{m}: removed energy (dB), percentiles 5 / 25 / 50 / 75 / 95 / 99")
        for name, vals in groups.items():
            q = np.percentile(vals, [5, 25, 50, 75, 95, 99])
            print(f"  {name:>12} ({len(vals):4d}): " + " / ".join(f"{v:.2f}" for v in q))
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"-> {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
