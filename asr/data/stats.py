"""Feature normalization statistics and a duration histogram (``asr-prep stats``).

Per-dimension mean and variance of the 40-dim features (asr.features.compute_features) over every frame of a
manifest, accumulated in float64 per utterance and summed, so the result does not depend on the number of workers.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from ..features import N_MELS, HOP_S, WIN_S, compute_features
from .audio import SAMPLE_RATE, AudioError, load_checked
from .manifest import audio_path, read_manifest, write_json
from .pool import parallel_map


class StatsError(RuntimeError):
    pass


def _utt_sums(job: tuple[str, str]) -> tuple:
    path, compression = job
    try:
        data, sr = load_checked(path)
    except AudioError as e:
        return (None, str(e))
    if sr != SAMPLE_RATE or data.shape[1] != 1:
        return (None, f"{path}: expected 16 kHz mono, got {sr} Hz, {data.shape[1]} channel(s)")
    with torch.no_grad():
        f = compute_features(torch.from_numpy(data[:, 0]), sr, compression).double()
    return (f.shape[0], f.sum(0).numpy(), (f * f).sum(0).numpy())


def duration_histogram(durations: list[float], width: int = 50) -> tuple[str, np.ndarray, np.ndarray]:
    """A text histogram of durations in 1-second bins (plus the counts and edges, for the plot)."""
    d = np.asarray(durations, dtype=float)
    edges = np.arange(0, max(1.0, float(np.ceil(d.max()))) + 1.0, 1.0)
    counts, edges = np.histogram(d, bins=edges)
    top = max(int(counts.max()), 1)
    lines = [f"durations: {len(d)} utterances, {d.sum() / 3600:.3f} h, mean {d.mean():.2f} s, "
             f"min {d.min():.2f} s, max {d.max():.2f} s"]
    for lo, hi, c in zip(edges[:-1], edges[1:], counts):
        lines.append(f"{f'{lo:.0f}-{hi:.0f} s':>9} {c:7d} {'#' * round(width * c / top)}")
    return "\n".join(lines) + "\n", counts, edges


def compute_stats(manifest, out_dir, compression: str = "power", jobs: int | None = None) -> dict:
    """Write feature_stats.json/.pt, durations.txt and durations.png in out_dir; return the stats dict."""
    entries = read_manifest(manifest)
    if not entries:
        raise StatsError(f"{manifest}: no utterances")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs_in = [(str(audio_path(e, manifest)), compression) for e in entries]
    results = parallel_map(_utt_sums, jobs_in, jobs, desc="stats", unit="utt")
    bad = [r[1] for r in results if r[0] is None]
    if bad:
        raise StatsError(f"{manifest}: {len(bad)} unusable audio file(s); first: {bad[0]}")
    frames = sum(r[0] for r in results)
    s = np.sum([r[1] for r in results], axis=0)
    ss = np.sum([r[2] for r in results], axis=0)
    mean = s / frames
    var = np.maximum(ss / frames - mean * mean, 0.0)
    stats = {"manifest": str(manifest), "utterances": len(entries), "frames": int(frames), "n_mels": N_MELS,
             "sample_rate": SAMPLE_RATE, "window_ms": WIN_S * 1000, "hop_ms": HOP_S * 1000,
             "compression": compression, "mean": mean.tolist(), "var": var.tolist(), "std": np.sqrt(var).tolist()}
    write_json(out / "feature_stats.json", stats)
    from ..checkpoint import atomic_save
    atomic_save({"mean": torch.tensor(mean, dtype=torch.float32), "var": torch.tensor(var, dtype=torch.float32),
                 "std": torch.tensor(np.sqrt(var), dtype=torch.float32), "compression": compression},
                out / "feature_stats.pt")

    text, counts, edges = duration_histogram([e["duration"] for e in entries])
    print(text, end="")
    (out / "durations.txt").write_text(text, encoding="utf-8")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", edgecolor="black", linewidth=0.5)
    ax.set_xlabel("duration (s)")
    ax.set_ylabel("utterances")
    hours = sum(e["duration"] for e in entries) / 3600
    ax.set_title(f"{Path(manifest).name}: {len(entries)} utterances, {hours:.2f} h")
    fig.tight_layout()
    fig.savefig(out / "durations.png", dpi=100)
    plt.close(fig)
    print(f"asr-prep stats: {frames} frames -> {out / 'feature_stats.json'}, {out / 'durations.png'}",
          file=sys.stderr)
    return stats
