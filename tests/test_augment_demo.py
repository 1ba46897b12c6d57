"""The augmentation demo writes its WAVs and its one PNG; the benchmark writes its JSON."""
import json

import numpy as np
import soundfile as sf

from asr.augment import bench
from asr.data import augment_demo as demo

FS = 16000


def _manifest(tmp_path, n=2):
    (tmp_path / "audio").mkdir()
    rng = np.random.default_rng(0)
    lines = []
    for k in range(n):
        wave = bench.speech_like(1.0 + 0.5 * k, rng).numpy()
        sf.write(tmp_path / "audio" / f"utt{k}.wav", wave, FS)
        lines.append(json.dumps({"audio_filepath": f"audio/utt{k}.wav", "text": "hello world", "duration": 1.0}))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def test_demo_writes_png_and_wavs(tmp_path):
    manifest = _manifest(tmp_path)
    out = tmp_path / "out"
    assert demo.main(["--manifest", str(manifest), "--out", str(out), "--count", "2"]) == 0
    pngs = list(out.glob("*.png"))
    assert [p.name for p in pngs] == ["augment_demo.png"]
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pngs[0].stat().st_size > 10000
    for k in range(2):
        for kind in ("clean", "sim"):
            data, rate = sf.read(out / f"utt{k}.{kind}.wav")
            assert rate == FS and len(data) == int(FS * (1.0 + 0.5 * k)) and np.abs(data).max() > 0
    report = json.loads((out / "augment_demo.json").read_text())
    assert len(report) == 2 and all(r["simulated"] and r["room"]["t60"] > 0 for r in report)


def test_demo_errors_name_file_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"audio_filepath": "x.wav", "duration": 1.0}\n')
    assert demo.main(["--manifest", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1" in err and "'text'" in err
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"audio_filepath": "nope.wav", "text": "a", "duration": 1.0}\n')
    assert demo.main(["--manifest", str(missing), "--out", str(tmp_path / "o")]) == 2
    assert "nope.wav" in capsys.readouterr().err


def test_demo_help(capsys):
    try:
        demo.main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert "--manifest" in out and "VTLP" in out and "audio_filepath" in out


def test_bench_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main(["--json", str(out), "--seconds-of-audio", "10", "--pool-size", "2"]) == 0
    res = json.loads(out.read_text())
    assert res["x_realtime_per_worker"] > 0 and res["audio_s"] >= 10
    assert res["pool_build_s"]["rirs"] == 8 and res["pool_build_s"]["per_rir"] > 0
    assert {"vtlp", "pool", "convolve", "mix", "features"} <= set(res["stages_s"])
