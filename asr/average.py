"""Average the model parameters of a run's last epoch checkpoints, for decoding (as ESPnet's averaging).

    python -m asr.average --run-dir exp/run --last 3            # -> exp/run/checkpoints/avg_last3.pt
    asr-eval --checkpoint exp/run/checkpoints/avg_last3.pt --manifest exp/corpus/test.jsonl --method ctc

The average holds no optimizer state (it is for decoding, not for resuming); ``--resume`` never reads it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m asr.average", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="a training run folder (checkpoints/epochNNN.pt)")
    p.add_argument("--last", type=int, default=3, help="how many of the last epoch checkpoints to average (3)")
    p.add_argument("--out", help="where to write it (default RUN/checkpoints/avg_lastN.pt)")
    args = p.parse_args(argv)
    from .checkpoint import CheckpointError, average_checkpoints
    ckpts = sorted((Path(args.run_dir) / "checkpoints").glob("epoch[0-9][0-9][0-9].pt"))
    if args.last < 1 or len(ckpts) < args.last:
        print(f"asr.average: {args.run_dir} has {len(ckpts)} epoch checkpoint(s); --last {args.last} needs "
              f"at least that many (and >= 1)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(args.run_dir) / "checkpoints" / f"avg_last{args.last}.pt"
    try:
        avg = average_checkpoints(ckpts[-args.last:])
    except CheckpointError as e:
        print(f"asr.average: {e}", file=sys.stderr)
        return 2
    avg.save(out)
    print(f"asr.average: {', '.join(c.name for c in ckpts[-args.last:])} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
