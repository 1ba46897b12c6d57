"""Feature normalization statistics and a duration histogram (``asr-prep stats``).

Per-dimension mean and variance of the front end's features (asr.frontend.compute_features) over every frame of a
manifest, accumulated in float64 per utterance and summed, so the result does not depend on the number of workers.

feature_stats.json holds the feature settings they were computed with (``"features"``: FeatureSettings.to_dict());
:func:`read_stats` gives them back, and the loader computes features with exactly those. A file written before the
settings were stored gives the front end's defaults (with its ``"compression"`` as ``mel_compression``).

Stats read every training utterance and compute its spectrogram anyway, so with a feature cache (the default,
``feature_cache/`` next to the manifest, where training looks with ``data.feature_cache: auto``) they leave each
clean spectrogram there: the first training epoch then reads them instead of computing them while the trainers
wait. The figures are the same either way (the cache's features are bitwise the front end's).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..frontend import DEFAULT_FEATURES, AudioError, FeatureSettings, compute_features, read_audio
from ..frontend.cache import FeatureCache, open_feature_cache
from .manifest import audio_path, read_manifest, write_json
from .pool import parallel_map


class StatsError(ValueError):
    """Statistics that cannot be computed or read; the message names the file."""


class FeatureStats(NamedTuple):
    """What feature_stats.json holds for the loader."""
    settings: FeatureSettings
    mean: torch.Tensor      # [n_mels] float32
    std: torch.Tensor       # [n_mels] float32


def read_stats(path) -> FeatureStats:
    """The feature settings, mean and deviation of a statistics file; errors name the file."""
    try:
        stats = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise StatsError(f"{path}: cannot read feature statistics (written by asr-prep stats): {e}") from e
    if not isinstance(stats, dict):
        raise StatsError(f"{path}: not a feature statistics file (written by asr-prep stats)")
    try:
        if "features" in stats:
            settings = FeatureSettings.from_dict(stats["features"])
        else:   # written before the settings were stored: the defaults of then
            settings = FeatureSettings(mel_compression=stats.get("compression", DEFAULT_FEATURES.mel_compression))
    except ValueError as e:
        raise StatsError(f"{path}: bad feature settings: {e}") from e
    for key in ("mean", "std"):
        if not isinstance(stats.get(key), list) or len(stats[key]) != settings.n_mels:
            raise StatsError(f"{path}: expected {settings.n_mels}-dim '{key}' (written by asr-prep stats)")
    return FeatureStats(settings, torch.tensor(stats["mean"], dtype=torch.float32),
                        torch.tensor(stats["std"], dtype=torch.float32))


def _utt_sums(job: tuple[str, str | None, FeatureSettings, FeatureCache | None]) -> tuple:
    path, md5, settings, cache = job
    try:
        data, sr = read_audio(path, strict=True)
    except AudioError as e:
        return (None, str(e))
    if sr != settings.sample_rate or data.shape[1] != 1:
        return (None, f"{path}: expected {settings.sample_rate} Hz mono, got {sr} Hz, {data.shape[1]} channel(s)")
    with torch.no_grad():
        if cache is not None:   # the audio decoded once: its spectrogram stored, the features read back from it
            cache.offer(path, md5, torch.from_numpy(data[:, 0]))
            f = cache.features(path, md5).double()
        else:
            f = compute_features(torch.from_numpy(data[:, 0]), settings, sample_rate=sr).double()
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


def compute_stats(manifest, out_dir, settings: FeatureSettings = DEFAULT_FEATURES, jobs: int | None = None,
                  feature_cache="auto") -> dict:
    """Write feature_stats.json/.pt, durations.txt and durations.png in out_dir; return the stats dict.

    ``feature_cache``: where the clean spectrograms go on the way ("auto": ``feature_cache/`` next to the
    manifest; "off": nowhere; or a folder), as training's ``data.feature_cache`` takes it."""
    entries = read_manifest(manifest)
    if not entries:
        raise StatsError(f"{manifest}: no utterances")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = open_feature_cache(feature_cache, manifest, settings, where="asr-prep stats --feature-cache")
    jobs_in = [(str(audio_path(e, manifest)), e.get("md5"), settings, cache) for e in entries]
    results = parallel_map(_utt_sums, jobs_in, jobs, desc="stats", unit="utt")
    bad = [r[1] for r in results if r[0] is None]
    if bad:
        raise StatsError(f"{manifest}: {len(bad)} unusable audio file(s); first: {bad[0]}")
    frames = sum(r[0] for r in results)
    s = np.sum([r[1] for r in results], axis=0)
    ss = np.sum([r[2] for r in results], axis=0)
    mean = s / frames
    var = np.maximum(ss / frames - mean * mean, 0.0)
    stats = {"manifest": str(manifest), "utterances": len(entries), "frames": int(frames),
             "features": settings.to_dict(), "mean": mean.tolist(), "var": var.tolist(), "std": np.sqrt(var).tolist()}
    write_json(out / "feature_stats.json", stats)
    from ..checkpoint import atomic_save
    atomic_save({"mean": torch.tensor(mean, dtype=torch.float32), "var": torch.tensor(var, dtype=torch.float32),
                 "std": torch.tensor(np.sqrt(var), dtype=torch.float32), "features": settings.to_dict()},
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
    cached = f"; clean spectrograms in {cache.dir}" if cache is not None else ""
    print(f"asr-prep stats: {frames} frames -> {out / 'feature_stats.json'}, {out / 'durations.png'}{cached}",
          file=sys.stderr)
    return stats
