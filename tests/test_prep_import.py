"""asr-prep import on trees the tests build: LibriSpeech layout with every kind of bad input, JSON lines, TSV."""
import hashlib
import json
import struct

import numpy as np
import pytest
import soundfile as sf

from asr.data.cli import main
from asr.data.manifest import audio_path, read_manifest


def tone(seconds=0.5, sr=16000, channels=1, seed=0):
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.random.default_rng(seed).standard_normal(len(t))
    return np.repeat(x[:, None], channels, axis=1).astype(np.float32) if channels > 1 else x.astype(np.float32)


def empty_flac_bytes(sr=16000):
    """A FLAC stream with a STREAMINFO block that declares 0 samples and no audio frames."""
    info = struct.pack(">HH", 4096, 4096) + b"\0" * 6 + struct.pack(">Q", (sr << 44) | (0 << 41) | (15 << 36))
    info += hashlib.md5(b"").digest()
    return b"fLaC" + bytes([0x80, 0, 0, 34]) + info


def make_librispeech(root):
    """SRC/<speaker>/<chapter>/ with 3 usable utterances and one of each bad case. Returns (src, expected)."""
    src = root / "dev-mini"
    ch1, ch2 = src / "19" / "198", src / "27" / "123"
    ch1.mkdir(parents=True)
    ch2.mkdir(parents=True)
    sf.write(ch1 / "19-198-0000.flac", tone(seed=1), 16000)
    sf.write(ch1 / "19-198-0001.flac", tone(sr=8000, channels=2, seed=2), 8000)          # converted
    sf.write(ch1 / "19-198-0003.flac", tone(), 16000)
    (ch1 / "19-198-0003.flac").write_bytes(b"RIFX" + np.random.default_rng(3).bytes(3000))  # corrupt
    (ch1 / "19-198-0004.flac").write_bytes(empty_flac_bytes())                           # 0 samples
    sf.write(ch1 / "19-198-0005.flac", tone(2.0, seed=5), 16000)
    data = (ch1 / "19-198-0005.flac").read_bytes()
    (ch1 / "19-198-0005.flac").write_bytes(data[: len(data) // 2])                        # truncated
    sf.write(ch1 / "19-198-0006.flac", tone(seed=6), 16000)                              # transcript not UTF-8
    sf.write(ch1 / "19-198-0007.flac", tone(seed=7), 16000)                              # transcript empty
    sf.write(ch1 / "19-198-0008.flac", tone(seed=8), 16000)                              # no transcript line
    (ch1 / "19-198-0009.flac").write_bytes(b"")                                          # 0 bytes
    (ch1 / "19-198.trans.txt").write_bytes(
        b"19-198-0000 HELLO WORLD NUMBER 7\n"
        b"19-198-0001 IT'S A STEREO FILE AT 8 KHZ\n"
        b"19-198-0002 THIS ONE HAS NO AUDIO\n"
        b"19-198-0003 CORRUPT AUDIO HERE\n"
        b"19-198-0004 EMPTY AUDIO HERE\n"
        b"19-198-0005 TRUNCATED AUDIO HERE\n"
        b"19-198-0006 CAF\xe9 IN LATIN ONE\n"
        b"19-198-0007\n"
        b"19-198-0009 ZERO BYTES\n")
    sf.write(ch2 / "27-123-0000.flac", tone(seed=9), 16000)
    (ch2 / "27-123.trans.txt").write_text("27-123-0000 FIRST TAKE\n27-123-0000 SECOND TAKE WITH THE SAME ID\n")
    expected = {"19-198-0002": "missing_audio", "19-198-0003": "corrupt_audio", "19-198-0004": "empty_audio",
                "19-198-0005": "truncated_audio", "19-198-0006": "not_utf8", "19-198-0007": "empty_transcript",
                "19-198-0008": "no_transcript", "19-198-0009": "empty_file", "27-123-0000": "duplicate_id"}
    return src, expected


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("ls")
    src, expected = make_librispeech(root)
    out = root / "out"
    rc = main(["import", "--format", "librispeech", str(src), "--out", str(out), "--jobs", "2"])
    return src, out, expected, rc


def test_usable_items_are_imported(imported):
    src, out, _, rc = imported
    assert rc == 0
    entries = read_manifest(out / "dev-mini.jsonl")
    assert [e["id"] for e in entries] == ["19-198-0000", "19-198-0001", "27-123-0000"]
    by_id = {e["id"]: e for e in entries}
    assert by_id["19-198-0000"]["text"] == "hello world number seven"
    assert by_id["19-198-0001"]["text"] == "it's a stereo file at eight khz"
    assert by_id["27-123-0000"]["text"] == "first take"  # the first occurrence of a duplicated id wins
    assert by_id["19-198-0000"]["speaker"] == "19"
    for e in entries:
        path = audio_path(e, out / "dev-mini.jsonl")
        data, sr = sf.read(path)
        assert sr == 16000 and data.ndim == 1
        assert e["duration"] == pytest.approx(len(data) / sr, abs=1e-3)
        assert e["md5"] == hashlib.md5(path.read_bytes()).hexdigest()
    # 16 kHz mono is used in place (absolute path); 8 kHz stereo is converted under out/audio (relative path)
    assert by_id["19-198-0000"]["audio_filepath"] == str((src / "19/198/19-198-0000.flac").resolve())
    assert by_id["19-198-0001"]["audio_filepath"] == "audio/dev-mini/19-198-0001.flac"
    assert by_id["19-198-0001"]["duration"] == pytest.approx(0.5, abs=1e-3)


def test_every_bad_case_is_rejected_with_its_reason(imported):
    _, out, expected, _ = imported
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert {r["id"]: r["reason"] for r in rejected} == expected
    for r in rejected:
        assert r["path"] and r["detail"] and r["split"] == "dev-mini"
    by_id = {r["id"]: r for r in rejected}
    assert by_id["19-198-0006"]["path"].endswith("19-198.trans.txt:7")       # transcript file and line
    assert by_id["27-123-0000"]["path"].endswith("27-123.trans.txt:2")
    assert "27-123.trans.txt:1" in by_id["27-123-0000"]["detail"]           # where the id was first seen
    assert by_id["19-198-0005"]["path"].endswith("19-198-0005.flac")


def test_each_rejection_is_reported_naming_file_and_reason(tmp_path, capfd):
    src, expected = make_librispeech(tmp_path)
    main(["import", "--format", "librispeech", str(src), "--out", str(tmp_path / "out"), "--jobs", "1"])
    err = capfd.readouterr().err
    for uid, reason in expected.items():
        assert any(uid in line and reason in line and ("dev-mini" in line) for line in err.splitlines()), uid
    assert "converted to 16 kHz mono" in err and "19-198-0001.flac" in err


def test_strict_fails_when_anything_was_rejected(tmp_path):
    src, _ = make_librispeech(tmp_path)
    assert main(["import", "--format", "librispeech", str(src), "--out", str(tmp_path / "o"), "--strict"]) == 1
    assert len(read_manifest(tmp_path / "o" / "dev-mini.jsonl")) == 3  # the usable part is still written


def test_clean_tree_passes_strict(tmp_path):
    ch = tmp_path / "clean" / "1" / "2"
    ch.mkdir(parents=True)
    sf.write(ch / "1-2-0000.flac", tone(), 16000)
    (ch / "1-2.trans.txt").write_text("1-2-0000 ALL GOOD\n")
    out = tmp_path / "o"
    assert main(["import", "--format", "librispeech", str(tmp_path / "clean"), "--out", str(out), "--strict",
                 "--split", "train"]) == 0
    assert [e["id"] for e in read_manifest(out / "train.jsonl")] == ["1-2-0000"]
    assert (out / "rejected.jsonl").read_text() == ""


def test_nothing_usable_exits_non_zero(tmp_path):
    ch = tmp_path / "bad" / "1" / "2"
    ch.mkdir(parents=True)
    (ch / "1-2-0000.flac").write_bytes(b"not audio at all")
    (ch / "1-2.trans.txt").write_text("1-2-0000 BROKEN\n1-2-0001 MISSING\n")
    out = tmp_path / "o"
    assert main(["import", "--format", "librispeech", str(tmp_path / "bad"), "--out", str(out)]) == 1
    assert read_manifest(out / "bad.jsonl") == []
    assert len((out / "rejected.jsonl").read_text().splitlines()) == 2


def test_missing_source_is_a_usage_error(tmp_path, capfd):
    assert main(["import", "--format", "librispeech", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "nope" in capfd.readouterr().err


def test_jsonl_import(tmp_path):
    sf.write(tmp_path / "a.wav", tone(sr=22050), 22050)
    sf.write(tmp_path / "b.flac", tone(), 16000)
    (tmp_path / "list.jsonl").write_bytes(
        json.dumps({"audio_filepath": "a.wav", "text": "Turn it up to 11!", "speaker": "x"}).encode() + b"\n"
        + json.dumps({"audio_filepath": str(tmp_path / "b.flac"), "text": "absolute path", "id": "bee"}).encode()
        + b"\n{broken json\n" + b'{"audio_filepath": "c.wav", "text": "\xff\xfe"}\n'
        + json.dumps({"audio_filepath": "b.flac", "text": "same id again", "id": "bee"}).encode() + b"\n")
    out = tmp_path / "out"
    assert main(["import", "--format", "jsonl", str(tmp_path / "list.jsonl"), "--out", str(out)]) == 0
    entries = read_manifest(out / "list.jsonl")
    assert [(e["id"], e["text"]) for e in entries] == [("a", "turn it up to eleven"), ("bee", "absolute path")]
    assert entries[0]["audio_filepath"] == "audio/list/a.flac" and entries[0]["speaker"] == "x"
    reasons = [json.loads(x)["reason"] for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert reasons == ["bad_entry", "not_utf8", "duplicate_id"]


def test_tsv_import_and_header_check(tmp_path):
    sf.write(tmp_path / "clip1.flac", tone(), 16000)
    sf.write(tmp_path / "clip2.flac", tone(seed=4), 16000)
    (tmp_path / "cv.tsv").write_text("client_id\tpath\tsentence\nspk1\tclip1.flac\tHi there, 2 you.\n"
                                     "spk2\tclip2.flac\t\"...\"\n")
    out = tmp_path / "out"
    assert main(["import", "--format", "tsv", str(tmp_path / "cv.tsv"), "--out", str(out), "--split", "dev"]) == 0
    entries = read_manifest(out / "dev.jsonl")
    assert [(e["id"], e["text"], e["speaker"]) for e in entries] == [("clip1", "hi there two you", "spk1")]
    assert json.loads((out / "rejected.jsonl").read_text())["reason"] == "empty_transcript"
    (tmp_path / "nohdr.tsv").write_text("clip1.flac\thello\n")
    assert main(["import", "--format", "tsv", str(tmp_path / "nohdr.tsv"), "--out", str(out)]) == 2


def test_reimport_keeps_other_splits_rejections(tmp_path):
    src, expected = make_librispeech(tmp_path)
    out = tmp_path / "out"
    main(["import", "--format", "librispeech", str(src), "--out", str(out), "--split", "a"])
    main(["import", "--format", "librispeech", str(src), "--out", str(out), "--split", "b"])
    main(["import", "--format", "librispeech", str(src), "--out", str(out), "--split", "b"])
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert sorted(r["split"] for r in rejected) == sorted(["a"] * len(expected) + ["b"] * len(expected))
