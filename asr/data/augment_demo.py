"""Listen to and look at the augmentation: for the first few utterances of a manifest, write the reverberant-noisy
waveform the acoustic simulator made (DIR/<id>.sim.wav, next to DIR/<id>.clean.wav) and one picture,
DIR/augment_demo.png, with the clean, VTLP-warped and reverberant-noisy log-mel spectrograms side by side.
VTLP warps the filterbank, not the audio, so it has no waveform of its own. The room, T60, noise sources and
SNR drawn for each utterance are printed and saved in DIR/augment_demo.json.

The manifest is JSON lines with fields audio_filepath, text and duration (NeMo style); a relative audio_filepath
is relative to the manifest's folder. ``asr-prep augment-demo``, and:

    python -m asr.data.augment_demo --manifest data/corpus/dev.jsonl --out out/augment_demo
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from ..augment.pipeline import AugmentConfig, Augmenter
from ..frontend import SAMPLE_RATE, load_wave, mel_features
from .manifest import ManifestError, audio_path
from .manifest import read_manifest as read_jsonl

REQUIRED_FIELDS = ("audio_filepath", "text", "duration")


def read_manifest(path: Path) -> list[dict]:
    """Entries of a JSONL manifest with audio_filepath resolved; errors name the file, line and field.

    Uses the project's manifest reader, requiring only the NeMo-style fields (``id`` is optional here)."""
    try:
        entries = read_jsonl(path, required=REQUIRED_FIELDS)
    except ManifestError as e:
        raise ValueError(str(e)) from e
    for obj in entries:
        obj["audio_path"] = audio_path(obj, path)
        obj.setdefault("id", obj.get("utt_id", Path(obj["audio_filepath"]).stem))
    if not entries:
        raise ValueError(f"{path}: manifest has no entries")
    return entries


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:100] or "utt"


def _write_wav(path: Path, wave: torch.Tensor) -> None:
    x = wave.numpy()
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak > 0.99:                       # the mixture may exceed full scale; scale down only then
        x = x * (0.99 / peak)
    sf.write(str(path), x, SAMPLE_RATE, subtype="PCM_16")


def _plot(rows: list[dict], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 3, figsize=(15, 3.2 * len(rows)), squeeze=False)
    for r, row in enumerate(rows):
        panels = [("clean", row["clean"]), (f"VTLP warp {row['warp']:.2f}", row["vtlp"]),
                  (row["sim_title"], row["sim"])]
        vmin = float(row["clean"].quantile(0.05))
        vmax = float(max(p[1].max() for p in panels))
        for c, (title, feats) in enumerate(panels):
            ax = axes[r][c]
            ax.imshow(feats.t().numpy(), origin="lower", aspect="auto", vmin=vmin, vmax=vmax, cmap="magma",
                      extent=(0, feats.shape[0] / 100.0, 0, feats.shape[1]))
            ax.set_title(f"{row['id']}: {title}", fontsize=9)
            ax.set_xlabel("time (s)")
            if c == 0:
                ax.set_ylabel("mel band")
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="asr-prep augment-demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True, type=Path, metavar="M.jsonl",
                   help="JSON-lines manifest (audio_filepath, text, duration)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder (created)")
    p.add_argument("--count", type=int, default=3, help="utterances to augment (default 3)")
    p.add_argument("--seed", type=int, default=0, help="augmentation seed (default 0)")
    p.add_argument("--epoch", type=int, default=0, help="epoch whose draws to show (default 0)")
    p.add_argument("--warp", type=float, default=1.1, help="VTLP factor shown in the picture (default 1.1, the "
                   "edge of the training range, so the shift is visible)")
    p.add_argument("--pool-size", type=int, default=4, help="rooms in the RIR pool (default 4)")
    a = p.parse_args(argv)
    if a.count < 1:
        p.error("--count must be >= 1")
    try:
        entries = read_manifest(a.manifest)
        waves = [load_wave(e["audio_path"]) for e in entries[:max(a.count, 8)]]
    except ValueError as e:
        print(f"augment-demo: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    config = AugmentConfig(pool_size=a.pool_size, noise_sources=(1, 3))
    aug = Augmenter(config, seed=a.seed, babble=waves)
    rows, report = [], []
    log_settings = dataclasses.replace(config.features, mel_compression="log")    # display only
    for e, wave in list(zip(entries, waves))[:a.count]:
        uid = _safe(str(e["id"]))
        sim = aug.augment(wave, uid, a.epoch, simulate=True, warp=1.0)
        log_feats = lambda w, warp: mel_features(w, aug.filterbank(warp), log_settings)  # noqa: E731
        _write_wav(a.out / f"{uid}.clean.wav", wave)
        _write_wav(a.out / f"{uid}.sim.wav", sim.wave)
        room = sim.info["room"]
        kinds = "+".join(n["kind"] for n in sim.info["noise"]) or "no noise"
        snr = sim.info["snr_db"]
        title = (f"room {'x'.join(f'{d:.1f}' for d in room['dims'])} m, T60 {room['t60']:.2f} s, {kinds}"
                 + (f", SNR {snr:.1f} dB" if snr is not None else ""))
        rows.append({"id": uid, "warp": a.warp, "clean": log_feats(wave, 1.0), "vtlp": log_feats(wave, a.warp),
                     "sim": log_feats(sim.wave, 1.0), "sim_title": title})
        report.append({"id": uid, "text": e["text"], "clean_wav": f"{uid}.clean.wav", "sim_wav": f"{uid}.sim.wav",
                       **{k: v for k, v in sim.info.items() if k not in ("utt_id", "warp")}})
        print(f"{uid}: {title}")
    png = a.out / "augment_demo.png"
    _plot(rows, png)
    (a.out / "augment_demo.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {png} and {2 * len(rows)} WAVs to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
