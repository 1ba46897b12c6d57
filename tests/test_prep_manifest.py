"""Manifest helpers: round trip, atomic writes, and errors that name the file and line."""
import json

import pytest

from asr.data.manifest import ManifestError, audio_path, read_manifest, write_json, write_manifest

ENTRY = {"id": "a", "audio_filepath": "audio/a.flac", "duration": 1.5, "text": "hello", "speaker": "s", "md5": "0"}


def test_round_trip_and_atomic(tmp_path):
    path = tmp_path / "m.jsonl"
    write_manifest(path, [ENTRY, {**ENTRY, "id": "b", "text": "caf\u00e9"}])
    assert [e["id"] for e in read_manifest(path)] == ["a", "b"]
    assert read_manifest(path)[1]["text"] == "caf\u00e9"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]  # no tmp file left behind
    assert audio_path(ENTRY, path) == tmp_path / "audio" / "a.flac"
    assert audio_path({**ENTRY, "audio_filepath": "/abs/x.flac"}, path).as_posix() == "/abs/x.flac"
    write_json(tmp_path / "c.json", {"x": 1})
    assert json.loads((tmp_path / "c.json").read_text()) == {"x": 1}


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({k: v for k, v in ENTRY.items() if k != "text"}), "missing field 'text'"),
    (json.dumps({**ENTRY, "duration": "long"}), "field 'duration' has type str"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ENTRY) + "\n\n" + bad_line + "\n")
    with pytest.raises(ManifestError) as e:
        read_manifest(path)
    assert f"{path}:3:" in str(e.value) and message in str(e.value)


def test_missing_and_non_utf8_manifest(tmp_path):
    with pytest.raises(ManifestError, match="cannot open manifest"):
        read_manifest(tmp_path / "nope.jsonl")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(ENTRY).encode() + b"\n" + b'{"text": "caf\xe9"}\n')
    with pytest.raises(ManifestError, match=r"latin1.jsonl:2: not UTF-8"):
        read_manifest(path)
