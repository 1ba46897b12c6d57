"""pocketsphinx baseline on two short flite utterances, and hypothesis clean-up."""
import json
import shutil
import subprocess

import pytest

from asr.data.audio import md5_file
from asr.frontend import read_audio
from asr.data.baseline import clean_hypothesis
from asr.data.cli import main
from asr.data.manifest import write_manifest

pytest.importorskip("pocketsphinx")


def test_clean_hypothesis():
    assert clean_hypothesis("<s> read(2) the [noise] book <sil> at 7 </s>") == "read the book at seven"


@pytest.mark.skipif(not shutil.which("flite"), reason="needs Debian package flite")
def test_baseline_decodes_and_scores(tmp_path, capsys):
    texts = ["the weather is nice today", "call my mother tomorrow morning"]
    entries = []
    for i, text in enumerate(texts):
        wav = tmp_path / f"u{i}.wav"
        subprocess.run(["flite", "-voice", "kal16", "-t", text, "-o", str(wav)], check=True)
        data, sr = read_audio(wav, strict=True)
        assert sr == 16000
        entries.append({"id": f"u{i}", "audio_filepath": wav.name, "duration": len(data) / sr, "text": text,
                        "speaker": "flite:kal16", "md5": md5_file(wav)})
    write_manifest(tmp_path / "m.jsonl", entries)
    assert main(["baseline", "--manifest", str(tmp_path / "m.jsonl"), "--json", str(tmp_path / "b.json"),
                 "--jobs", "1"]) == 0
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["utterances"] == 2 and result["words"] == 10 and result["failed"] == 0
    assert 0 <= result["wer"] < 60 and 0 <= result["ser"] <= 100
    assert set(result["per_speaker"]) == {"flite:kal16"}
    assert [h["ref"] for h in result["hypotheses"]] == texts
    assert "WER" in capsys.readouterr().out
    # hypotheses do not depend on which utterances a worker decoded before (pocketsphinx state is reset)
    entries.reverse()
    write_manifest(tmp_path / "r.jsonl", entries)
    main(["baseline", "--manifest", str(tmp_path / "r.jsonl"), "--json", str(tmp_path / "r.json"), "--jobs", "1"])
    again = json.loads((tmp_path / "r.json").read_text())["hypotheses"]
    assert again[::-1] == result["hypotheses"]
