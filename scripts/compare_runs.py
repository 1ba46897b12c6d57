"""Compare training runs by their logs: dev WER and training loss against training minutes.

The 60-minute benchmark compares runs at equal wall-clock budget, not at equal epochs (a codec that
costs CPU fits fewer epochs), so the x axis is cumulative training time (`train_s` of each epoch).
Reads RUN/train_log.jsonl of each run (the last record of an epoch wins, so resumed runs are fine);
writes one PNG with three panels and a JSON with the per-epoch series.

    .venv/bin/python scripts/compare_runs.py exp/b60fv_fp32 exp/b60fv_qsgd8b512_pipe --out out/compare
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def epoch_records(run: Path) -> list[dict]:
    log = run / "train_log.jsonl"
    if not log.is_file():
        raise SystemExit(f"compare_runs: {log} not found (expected a run directory written by asr.train)")
    by_epoch = {}
    for n, line in enumerate(log.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"compare_runs: {log}:{n} is not JSON ({e})")
        if rec.get("event") == "epoch":
            by_epoch[rec["epoch"]] = rec
    if not by_epoch:
        raise SystemExit(f"compare_runs: {log} has no epoch records (has the first epoch finished?)")
    rows, minutes = [], 0.0
    for epoch in sorted(by_epoch):
        rec = by_epoch[epoch]
        minutes += rec["train_s"] / 60
        rows.append({"epoch": epoch, "minutes": round(minutes, 2), "dev_wer_ctc": rec.get("dev_wer_ctc"),
                     "dev_wer_att": rec.get("dev_wer_greedy"), "train_ctc_loss": rec.get("train_ctc_loss"),
                     "train_att_loss": rec.get("train_att_loss"), "bits_per_element": rec.get("bits_per_element")})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (each with train_log.jsonl)")
    ap.add_argument("--out", type=Path, default=Path("out/compare"), help="writes OUT.png and OUT.json")
    args = ap.parse_args(argv)
    series = {str(run): epoch_records(run) for run in args.runs}

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [("dev_wer_ctc", "dev WER, CTC best path (%)", 100), ("dev_wer_att", "dev WER, attention greedy (%)", 100),
              ("train_ctc_loss", "training CTC loss", 1)]
    for ax, (key, title, scale) in zip(axes, panels):
        for name, rows in series.items():
            pts = [(r["minutes"], scale * r[key]) for r in rows if r[key] is not None]
            if pts:
                ax.plot(*zip(*pts), "-o", ms=3, label=Path(name).name)
        ax.set_title(title)
        ax.set_xlabel("training minutes")
        ax.grid(alpha=0.3)
    axes[1].set_ylim(top=min(axes[1].get_ylim()[1], 130))
    axes[0].legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    args.out.with_suffix(".json").write_text(json.dumps(series, indent=1))
    for name, rows in series.items():
        last = rows[-1]
        print(f"{name}: {len(rows)} epochs in {last['minutes']:.1f} min, last dev WER CTC "
              f"{100 * (last['dev_wer_ctc'] or float('nan')):.1f}% / attention "
              f"{100 * (last['dev_wer_att'] or float('nan')):.1f}%",
              file=sys.stderr)
    print(f"compare_runs: wrote {args.out.with_suffix('.png')} and {args.out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
