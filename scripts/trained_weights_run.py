"""The twin of a run trained with ``train.ema_decay``: the same checkpoints with the optimizer's own weights in
``model``, so ``asr-eval --run-dir TWIN`` (and ``--checkpoint TWIN/checkpoints/last.pt``) decodes the weights that
were trained instead of their EMA: the pair that says what the EMA buys, from one training run.

    python scripts/trained_weights_run.py --run-dir exp/demo --out exp/demo_trained

Only the checkpoints (and the log, for the plot's record) are written; decoding settings and caches stay the run's.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path

from asr.checkpoint import TrainingCheckpoint


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="a run folder trained with train.ema_decay > 0")
    p.add_argument("--out", required=True, help="the twin run folder to write (its checkpoints/ is replaced)")
    a = p.parse_args(argv)
    src, out = Path(a.run_dir), Path(a.out)
    ckpts = sorted((src / "checkpoints").glob("*.pt"))
    if not ckpts:
        print(f"trained_weights_run: {src}/checkpoints holds no .pt files", file=sys.stderr)
        return 2
    if out.resolve() == src.resolve():
        print("trained_weights_run: --out must be another folder than --run-dir", file=sys.stderr)
        return 2
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    (out / "checkpoints").mkdir(parents=True)
    for ck in ckpts:
        rec = TrainingCheckpoint.load(ck)
        if rec.train_model is None:
            print(f"trained_weights_run: {ck} holds no trained weights beside its model (train.ema_decay was 0)",
                  file=sys.stderr)
            return 2
        dataclasses.replace(rec, model=rec.train_model, train_model=None, ema_updates=0).save(out / "checkpoints" / ck.name)
    for name in ("train_log.jsonl", "DONE"):
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    print(f"trained_weights_run: {len(ckpts)} checkpoints with their trained weights -> {out}/checkpoints")
    return 0


if __name__ == "__main__":
    sys.exit(main())
