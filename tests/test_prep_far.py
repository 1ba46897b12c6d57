"""asr-prep far: the far-field test set is the test set through the simulator, deterministic and resumable."""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("farcorpus")
    proc = subprocess.run([BIN / "asr-prep", "synth", "--out", out, "--size", "tiny", "--seed", "5", "--limit", "30"],
                          capture_output=True, text=True)
    if proc.returncode == 2 and "apt-get install" in proc.stderr:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def far(src: Path, dest: Path):
    shutil.copytree(src, dest, dirs_exist_ok=True)
    subprocess.run([BIN / "asr-prep", "far", "--manifest", dest / "test.jsonl", "--pool-size", "3", "--seed", "1"],
                   check=True, capture_output=True)
    return [json.loads(line) for line in (dest / "test_far.jsonl").read_text().splitlines()]


def test_far_field_set_is_deterministic_and_reverberant(corpus, tmp_path):
    a = far(corpus, tmp_path / "a")
    b = far(corpus, tmp_path / "b")
    clean = [json.loads(line) for line in (corpus / "test.jsonl").read_text().splitlines()]
    assert [r["id"] for r in a] == [r["id"] for r in clean] and [r["text"] for r in a] == [r["text"] for r in clean]
    assert [r["md5"] for r in a] == [r["md5"] for r in b]
    for r in a:
        path = tmp_path / "a" / r["audio_filepath"]
        info = sf.info(path)
        assert info.samplerate == 16000 and info.channels == 1
        assert hashlib.md5(path.read_bytes()).hexdigest() == r["md5"]
    # each row names its condition, in the simulator's test ranges
    from asr.data.far import SNR_BANDS, T60_BANDS, band
    for r in a:
        assert 0.1 <= r["t60"] <= 0.9 and r["t60_band"] == band(r["t60"], T60_BANDS, "s")
        assert r["snr_db"] is None or 0.0 <= r["snr_db"] <= 30.0
        assert r["snr_band"] == band(r["snr_db"], SNR_BANDS, "dB")
    # different from the clean audio
    assert {r["md5"] for r in a}.isdisjoint({r["md5"] for r in clean})
    # a re-run skips finished files and rewrites nothing
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "a" / "audio" / "test_far").iterdir()}
    far(corpus, tmp_path / "a")
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "a" / "audio" / "test_far").iterdir()}


def test_bands_and_their_order_in_the_breakdown():
    from asr.data.far import SNR_BANDS, T60_BANDS, band
    from asr.evaluate import _breakdown
    from asr.metrics import utterance_errors
    assert [band(x, SNR_BANDS, "dB") for x in (-3.0, 9.99, 10.0, 19.9, 20.0, 30.0, None)] == \
        ["<10 dB", "<10 dB", "10-20 dB", "10-20 dB", ">=20 dB", ">=20 dB", "no noise"]
    assert [band(x, T60_BANDS, "s") for x in (0.1, 0.3, 0.55, 0.7, 0.9)] == \
        ["<0.3 s", "0.3-0.5 s", "0.5-0.7 s", ">=0.7 s", ">=0.7 s"]
    snrs = [None, 25.0, 15.0, 5.0, 5.0]
    entries = [{"id": str(i), "snr_band": band(x, SNR_BANDS, "dB")} for i, x in enumerate(snrs)]
    rows = [{"id": str(i), "ref": "a b", "hyp": "a b" if i < 3 else "a c"} for i in range(len(snrs))]
    out = _breakdown(entries, rows, utterance_errors([r["ref"] for r in rows], [r["hyp"] for r in rows]), "snr_band")
    assert list(out) == ["<10 dB", "10-20 dB", ">=20 dB", "no noise"]
    assert out["<10 dB"]["wer"] == 0.5 and out["<10 dB"]["utterances"] == 2 and out["no noise"]["wer"] == 0.0
