"""Experiment: a dereverberated copy of a manifest, by single-channel WPE (nara_wpe), to decode against the original.

    python scripts/wpe_copy.py --manifest exp/corpus/test_far.jsonl --name test_far_wpe [--taps 10 --delay 3]

Writes DIR/audio/NAME/*.flac and DIR/NAME.jsonl next to the manifest (resumable: finished files are kept). Used to
choose asr.frontend.dereverb's settings (recipes/bfa/RESULTS.md, 2026-12-05 eighth session); the recipe itself
dereverberates inside asr-eval (--dereverb wpe), not through copies. Run numpy on one thread (OMP_NUM_THREADS=1)
when two copies run at once. Weighted prediction error
(Nakatani et al. 2010; Yoshioka & Nakatani 2012) removes late reverberation by linear prediction in the STFT domain;
it does nothing for additive noise.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
from tqdm import tqdm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True)
    p.add_argument("--name", required=True, help="output manifest name (DIR/NAME.jsonl)")
    p.add_argument("--taps", type=int, default=10)
    p.add_argument("--delay", type=int, default=3)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--fft", type=int, default=512)
    p.add_argument("--shift", type=int, default=128)
    args = p.parse_args(argv)
    from nara_wpe.utils import istft, stft
    from nara_wpe.wpe import wpe

    manifest = Path(args.manifest)
    base = manifest.parent
    folder = base / "audio" / args.name
    folder.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    for line in tqdm(manifest.read_text().splitlines(), desc=f"wpe {manifest.name}", file=sys.stderr):
        e = json.loads(line)
        dest = folder / f"{e['id']}.flac"
        if not dest.exists():
            y, sr = sf.read(base / e["audio_filepath"], dtype="float64")
            Y = stft(y[None], size=args.fft, shift=args.shift).transpose(2, 0, 1)     # (F, D=1, T)
            Z = wpe(Y, taps=args.taps, delay=args.delay, iterations=args.iterations, statistics_mode="full")
            z = istft(Z.transpose(1, 2, 0), size=args.fft, shift=args.shift)[0][:len(y)]
            z = z * np.sqrt(np.mean(y ** 2) / max(np.mean(z ** 2), 1e-12))           # keep the input's level
            tmp = dest.with_suffix(".tmp.flac")
            sf.write(tmp, np.clip(z, -1, 1), sr, subtype="PCM_16")
            tmp.rename(dest)
        rows.append({k: v for k, v in e.items() if k != "md5"} | {"audio_filepath": str(dest.relative_to(base))})
    (base / f"{args.name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} utterances -> {base / (args.name + '.jsonl')} in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
